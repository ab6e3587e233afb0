//! A subscription's history: paged reads from the store, sent in bounded chunks.

use super::{frame, Filter, Out};
use crate::downsample::PerMetric;
use crate::hub::{Hub, Run};
use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use stepstream_protocol::{Backfill, MetricId, Series, StepRecord, ToViewer};

/// Values per backfill chunk, at most.
const CHUNK_VALUES: usize = 25_000;

/// Points a thinned history holds at once, at most (the budgets of the metrics it reads
/// together; one metric whose budget is larger is read alone).
const GROUP_POINTS: usize = 100_000;

/// Sends the stored batches `after < seq <= through` (exactly, or thinned to `budget` points
/// per metric), in chunks of at most one metric and [`CHUNK_VALUES`] points, the last one
/// marked `done`. Reads are paged: no read holds a database connection (or a transaction)
/// while it waits for this viewer. `Break` when the viewer is gone.
pub(super) async fn backfill(
    hub: &Hub,
    run: &Run,
    filter: &Filter,
    after: u64,
    through: u64,
    budget: Option<usize>,
    out: &Out,
) -> ControlFlow<()> {
    let (run_id, last_step) = run.state(|st| (st.identity.run_id.clone(), st.tail.last_step));
    let chunk = |series: Vec<Series>, downsampled: bool, done: bool| {
        frame(ToViewer::Backfill(Backfill {
            run_id: run_id.clone(),
            through_seq: through,
            downsampled,
            series,
            done,
        }))
    };
    let mut sent = true;
    if after >= through {
        sent = out.send(chunk(Vec::new(), false, true)).await.is_ok();
    } else if let Some(budget) = budget {
        let (lo, hi) = hub
            .store
            .step_bounds(run.key)
            .await
            .ok()
            .flatten()
            .unwrap_or((0, last_step.unwrap_or(0)));
        let lo = filter.from_step.map_or(lo, |from| from.max(lo));
        let range = (lo, hi.max(lo));
        // Metrics in groups whose budgets add up to at most GROUP_POINTS: a thinned
        // history holds one group's points at a time, however many metrics the run has.
        let wanted: Vec<MetricId> = run.state(|st| {
            st.metrics
                .iter()
                .map(|m| m.id)
                .filter(|&id| filter.wants(id))
                .collect()
        });
        let per_group = (GROUP_POINTS / budget).max(1);
        let groups: Vec<&[MetricId]> = wanted.chunks(per_group).collect();
        if groups.is_empty() {
            sent = out.send(chunk(Vec::new(), false, true)).await.is_ok();
        }
        for (g, group) in groups.iter().enumerate() {
            let last_group = g + 1 == groups.len();
            let group: Arc<HashSet<MetricId>> = Arc::new(group.iter().copied().collect());
            // A long run's history from its packs' summaries (a fresh subscription only:
            // a resumed one continues after a `seq`), else from every raw point.
            let summarized = if after == 0 {
                crate::downsample::summarized(
                    &hub.store,
                    run.key,
                    through,
                    range,
                    budget,
                    group.clone(),
                )
                .await
            } else {
                Ok(None)
            };
            let answers = match summarized {
                Ok(Some(answers)) => Ok(answers),
                Ok(None) => {
                    raw_group(hub, run, filter, (after, through), budget, range, &group).await
                }
                Err(e) => Err(e),
            };
            let answers = match answers {
                Ok(answers) => answers,
                Err(e) => {
                    tracing::error!(error = %e, "backfill failed");
                    return ControlFlow::Break(());
                }
            };
            let mut pieces = Vec::new();
            for (metric, _, (steps, values, times, thinned)) in answers {
                for part in split_series(metric, steps, values, times) {
                    pieces.push((part, thinned));
                }
            }
            if pieces.is_empty() && last_group {
                sent = out.send(chunk(Vec::new(), false, true)).await.is_ok();
            }
            let n = pieces.len();
            for (i, (series, thinned)) in pieces.into_iter().enumerate() {
                let done = last_group && i + 1 == n;
                if out.send(chunk(vec![series], thinned, done)).await.is_err() {
                    sent = false;
                    break;
                }
            }
            if !sent {
                break;
            }
        }
    } else {
        let mut from = after;
        while from < through && sent {
            let page = Page {
                chunk: Chunk::default(),
                last_seq: from,
            };
            let filter_page = filter.clone();
            let read = hub
                .store
                .scan(run.key, from, through, page, move |page, seq, records| {
                    page.chunk.add(&filter_page, records);
                    page.last_seq = seq;
                    if page.chunk.values >= CHUNK_VALUES {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .await;
            let mut page = match read {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "backfill failed");
                    return ControlFlow::Break(());
                }
            };
            // Nothing stored past `from` (cannot happen below `through`): end here.
            let done = page.last_seq >= through || page.last_seq == from;
            from = page.last_seq;
            // One metric per frame, at most CHUNK_VALUES points each (one batch may hold
            // more than that of one metric); the page's last frame says whether history is
            // done.
            let mut frames: Vec<Vec<Series>> = page
                .chunk
                .take()
                .into_iter()
                .flat_map(|s| split_series(s.metric, s.steps, s.values, s.times))
                .map(|s| vec![s])
                .collect();
            if frames.is_empty() {
                frames.push(Vec::new());
            }
            let n = frames.len();
            for (i, series) in frames.into_iter().enumerate() {
                if out
                    .send(chunk(series, false, done && i + 1 == n))
                    .await
                    .is_err()
                {
                    sent = false;
                    break;
                }
            }
            if done {
                break;
            }
        }
    }
    if sent && !out.is_closed() {
        ControlFlow::Continue(())
    } else {
        ControlFlow::Break(())
    }
}

/// One group's thinned history from every raw point: two halves of the run on two threads,
/// their M4s merged (the same answer, sooner).
async fn raw_group(
    hub: &Hub,
    run: &Run,
    filter: &Filter,
    (after, through): (u64, u64),
    budget: usize,
    range: (i64, i64),
    group: &Arc<HashSet<MetricId>>,
) -> Result<Vec<(MetricId, u64, crate::downsample::Answer)>, crate::store::StoreError> {
    let scan = |from: u64, to: u64| {
        let filter = filter.clone();
        let group = group.clone();
        hub.store.scan_values(
            run.key,
            from,
            to,
            PerMetric::new(budget, range),
            move |per_metric, step, time, id, v| {
                if filter.step_ok(step) && group.contains(&id) {
                    per_metric.push(id, step, v, time);
                }
            },
        )
    };
    let mid = after + (through - after) / 2;
    let (early, late) = tokio::try_join!(scan(after, mid), scan(mid, through))?;
    Ok(early
        .merge(late)
        .finish()
        .into_iter()
        .map(|(metric, points)| (metric, 0, points.finish()))
        .collect())
}

/// One metric's points, cut into series of at most [`CHUNK_VALUES`] points.
fn split_series(
    metric: MetricId,
    steps: Vec<i64>,
    values: Vec<f64>,
    times: Vec<f64>,
) -> Vec<Series> {
    if steps.len() <= CHUNK_VALUES {
        return vec![Series {
            metric,
            steps,
            values,
            times,
        }];
    }
    steps
        .chunks(CHUNK_VALUES)
        .zip(values.chunks(CHUNK_VALUES))
        .zip(times.chunks(CHUNK_VALUES))
        .map(|((s, v), t)| Series {
            metric,
            steps: s.to_vec(),
            values: v.to_vec(),
            times: t.to_vec(),
        })
        .collect()
}

/// One page of a raw backfill: what was read, and the last batch it read.
struct Page {
    chunk: Chunk,
    last_seq: u64,
}

/// A raw backfill chunk being filled.
#[derive(Default)]
struct Chunk {
    series: BTreeMap<MetricId, Series>,
    values: usize,
}

impl Chunk {
    fn add(&mut self, filter: &Filter, records: &[StepRecord]) {
        for r in records.iter().filter(|r| filter.step_ok(r.step)) {
            for &(id, v) in r.values.iter().filter(|(id, _)| filter.wants(*id)) {
                let s = self.series.entry(id).or_insert_with(|| Series {
                    metric: id,
                    steps: Vec::new(),
                    values: Vec::new(),
                    times: Vec::new(),
                });
                s.steps.push(r.step);
                s.values.push(v);
                s.times.push(r.wall_time);
                self.values += 1;
            }
        }
    }

    fn take(&mut self) -> Vec<Series> {
        self.values = 0;
        std::mem::take(&mut self.series).into_values().collect()
    }
}
