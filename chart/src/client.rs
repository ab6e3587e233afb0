//! The viewer client the web app and the widget share: which runs are wanted (and which of
//! their metrics), the hub's run list, the points held per run, and how each hub message
//! changes them. A state machine without a socket: its owner sends the frames it returns
//! (`ws` does the sending and reconnecting), so both apps subscribe, resume by sequence
//! number after a reconnect, drop frames of a replaced subscription and dispatch the same
//! way.

use crate::data::RunData;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use stepstream_protocol::{
    FromViewer, HubError, RunDeleted, RunId, RunSummary, StatusChange, Subscribe, ToViewer,
    Unsubscribe, Zoomed,
};

/// History points per metric asked for on a first subscription: a chart is at most a few
/// thousand pixels wide and the hub's M4 keeps every extreme.
pub const HISTORY_BUDGET: u32 = 4_000;

/// What a hub message changed, for the app to show.
#[derive(Debug)]
pub enum Change {
    Nothing,
    /// The whole run list arrived (its last page), in the hub's order.
    Listed(Vec<RunSummary>),
    /// These runs' summaries changed (a partial update's values merged with those known).
    Summaries(Vec<RunSummary>),
    Status(StatusChange),
    /// A run's metrics were defined.
    Defined(RunId),
    /// A run's points (history or live) arrived.
    Points(RunId),
    /// A run's alert arrived (a new one: repeats are dropped).
    Alert(RunId),
    /// A command for a run's training was queued or moved on.
    Command(RunId),
    Zoomed(Zoomed),
    /// A run was deleted: gone from the list, its points dropped.
    Deleted(RunDeleted),
    HubError(HubError),
}

/// One wanted run's subscription.
#[derive(Default)]
struct Sub {
    /// Only these metrics; all when `None`.
    metrics: Option<BTreeSet<String>>,
    /// Sent on the current socket.
    subscribed: bool,
    /// Resubscribed on the same socket: frames of the replaced subscription may still be in
    /// flight. Every subscription starts with a `Metrics` frame; points count from it.
    awaiting_intro: bool,
    /// Its live frames carry console lines and samples (a widget's panel).
    items: bool,
}

/// The client state of one viewer socket.
#[derive(Default)]
pub struct Client {
    /// The points held, per wanted run.
    pub runs: BTreeMap<RunId, RunData>,
    subs: BTreeMap<RunId, Sub>,
    /// The hub's run list as this token sees it, once its last page arrived.
    pub listed: Option<HashMap<RunId, RunSummary>>,
    /// Run-list pages before the last one.
    pages: Vec<RunSummary>,
    /// Hub clock minus this page's, seconds.
    pub hub_offset: f64,
    open: bool,
    /// Subscribe a run only once the run list shows it (a widget may name a run that
    /// starts later); otherwise at once.
    wait_for_list: bool,
    smoothing: f64,
    /// Keep the console lines and samples of applied live batches in [`Client::items`] (the
    /// page does; the widget's charts do not).
    pub keep_items: bool,
    /// Console lines and samples of applied live batches, per run and `seq`, until taken.
    pub items: Vec<(RunId, u64, Vec<stepstream_protocol::Item>)>,
}

impl Client {
    pub fn new(wait_for_list: bool) -> Client {
        Client {
            wait_for_list,
            ..Client::default()
        }
    }

    /// The client that also keeps live batches' console lines and samples ([`Client::items`]).
    pub fn keeping_items(mut self) -> Client {
        self.keep_items = true;
        self
    }

    /// Metric names across the given runs, sorted.
    pub fn metric_names(&self, runs: &[RunId]) -> Vec<String> {
        let mut names: Vec<String> = runs
            .iter()
            .filter_map(|r| self.runs.get(r))
            .flat_map(|d| d.metric_names().cloned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The smoothing weight of every run's series, now and for runs wanted later.
    pub fn set_smoothing(&mut self, weight: f64) {
        self.smoothing = weight;
        for d in self.runs.values_mut() {
            d.set_smoothing(weight);
        }
    }

    /// Wants `run` (with `metrics` added to those wanted, or all of them); `last_point_ms`
    /// says when the run last had a point, for ages before any arrives. Returns the frames
    /// to send.
    pub fn want(
        &mut self,
        run: &RunId,
        metrics: Option<&[String]>,
        last_point_ms: f64,
    ) -> Vec<FromViewer> {
        let smoothing = self.smoothing;
        let fresh = || {
            let mut d = RunData::default();
            d.smoothing = smoothing;
            d.last_point_ms = last_point_ms;
            d
        };
        let data = self.runs.entry(run.clone()).or_insert_with(fresh);
        let sub = self.subs.entry(run.clone()).or_default();
        let grew = match (metrics, &mut sub.metrics) {
            (Some(more), Some(held)) => {
                let before = held.len();
                held.extend(more.iter().cloned());
                held.len() != before
            }
            (Some(more), None) if !sub.subscribed => {
                sub.metrics = Some(more.iter().cloned().collect());
                false
            }
            (None, held @ Some(_)) => {
                *held = None;
                true
            }
            _ => false,
        };
        if grew && sub.subscribed {
            // The history of the new metrics is needed: start this run over.
            *data = fresh();
            sub.subscribed = false;
            sub.awaiting_intro = true;
        }
        self.sync()
    }

    /// Wants `run`'s console lines and samples too (kept in [`Client::items`]); a run
    /// subscribed without them starts over. Returns the frames to send.
    pub fn want_items(&mut self, run: &RunId, last_point_ms: f64) -> Vec<FromViewer> {
        let mut frames = self.want(run, Some(&[]), last_point_ms);
        let sub = self.subs.entry(run.clone()).or_default();
        if !sub.items {
            sub.items = true;
            if sub.subscribed {
                sub.subscribed = false;
                sub.awaiting_intro = true;
            }
            frames.extend(self.sync());
        }
        frames
    }

    /// No longer wants `runs`: their points are dropped. Returns the frames to send.
    pub fn unwant(&mut self, runs: &[RunId]) -> Vec<FromViewer> {
        let gone: Vec<RunId> = runs
            .iter()
            .filter(|r| self.subs.remove(*r).is_some())
            .cloned()
            .collect();
        for r in &gone {
            self.runs.remove(r);
        }
        if gone.is_empty() || !self.open {
            return Vec::new();
        }
        vec![FromViewer::Unsubscribe(Unsubscribe { runs: gone })]
    }

    /// The socket opened: the frames that (re)subscribe what is wanted.
    pub fn on_open(&mut self) -> Vec<FromViewer> {
        self.open = true;
        self.sync()
    }

    /// The socket closed: nothing of its subscriptions or its list holds on the next.
    pub fn on_lost(&mut self) {
        self.open = false;
        for sub in self.subs.values_mut() {
            sub.subscribed = false;
            sub.awaiting_intro = false;
        }
        self.listed = None;
        self.pages.clear();
    }

    /// Whether every wanted run's history has arrived.
    pub fn all_backfilled(&self) -> bool {
        self.runs.values().all(|d| d.backfilled)
    }

    /// Subscribes every wanted run not subscribed on this socket (once listed, when the
    /// client waits for the list): after the batches it holds, or afresh.
    fn sync(&mut self) -> Vec<FromViewer> {
        if !self.open || (self.wait_for_list && self.listed.is_none()) {
            return Vec::new();
        }
        let mut frames = Vec::new();
        for (run, sub) in &mut self.subs {
            let listed = self.listed.as_ref().is_some_and(|l| l.contains_key(run));
            if sub.subscribed || (self.wait_for_list && !listed) {
                continue;
            }
            sub.subscribed = true;
            let data = self.runs.entry(run.clone()).or_default();
            let held = data.held_seq();
            if held.is_none() {
                // Whatever part of a history arrived before the socket was lost comes
                // again whole.
                let mut fresh = RunData::default();
                fresh.smoothing = data.smoothing;
                fresh.last_point_ms = data.last_point_ms;
                *data = fresh;
            }
            frames.push(FromViewer::Subscribe(Subscribe {
                runs: vec![run.clone()],
                metrics: sub.metrics.as_ref().map(|m| m.iter().cloned().collect()),
                from_step: None,
                budget: held.is_none().then_some(HISTORY_BUDGET),
                after_seq: held,
                items: self.keep_items || sub.items,
            }));
        }
        frames
    }

    /// Whether the points of `run` are the current subscription's.
    fn takes_points(&self, run: &RunId) -> bool {
        self.subs.get(run).is_some_and(|s| !s.awaiting_intro)
    }

    /// Applies one hub message at `now_ms` (the page's clock): what changed, and the frames
    /// to send.
    pub fn on_message(&mut self, msg: ToViewer, now_ms: f64) -> (Change, Vec<FromViewer>) {
        let change = match msg {
            ToViewer::RunList(list) => {
                // Pages gather until the last one, which replaces the list.
                self.pages.extend(list.runs);
                if !list.done {
                    return (Change::Nothing, Vec::new());
                }
                self.hub_offset = list.now - now_ms / 1000.0;
                let mut runs = std::mem::take(&mut self.pages);
                // The newest of a run wins.
                let mut seen = HashSet::new();
                runs.reverse();
                runs.retain(|r| seen.insert(r.run_id.clone()));
                runs.reverse();
                self.listed = Some(runs.iter().map(|r| (r.run_id.clone(), r.clone())).collect());
                return (Change::Listed(runs), self.sync());
            }
            ToViewer::RunUpdate(u) => {
                self.hub_offset = u.now - now_ms / 1000.0;
                return self.summaries(vec![u.run]);
            }
            ToViewer::RunUpdates(u) => {
                self.hub_offset = u.now - now_ms / 1000.0;
                return self.summaries(u.runs);
            }
            ToViewer::StatusChange(c) => {
                if let Some(r) = self.listed.as_mut().and_then(|l| l.get_mut(&c.run_id)) {
                    r.status = c.status;
                    r.status_message = c.message.clone();
                }
                Change::Status(c)
            }
            ToViewer::Metrics(m) => {
                if let Some(sub) = self.subs.get_mut(&m.run_id) {
                    sub.awaiting_intro = false;
                }
                match self.runs.get_mut(&m.run_id) {
                    Some(d) => {
                        d.define(&m.metrics);
                        Change::Defined(m.run_id)
                    }
                    None => Change::Nothing,
                }
            }
            ToViewer::Backfill(b) => {
                if !self.takes_points(&b.run_id) {
                    return (Change::Nothing, Vec::new());
                }
                match self.runs.get_mut(&b.run_id) {
                    Some(d) => {
                        d.backfill(&b);
                        Change::Points(b.run_id)
                    }
                    None => Change::Nothing,
                }
            }
            ToViewer::Live(mut l) => {
                if !self.takes_points(&l.run_id) {
                    return (Change::Nothing, Vec::new());
                }
                let applied = self
                    .runs
                    .get_mut(&l.run_id)
                    .is_some_and(|d| d.live(&l, now_ms));
                let wanted = self.keep_items || self.subs.get(&l.run_id).is_some_and(|s| s.items);
                if applied && wanted && !l.items.is_empty() {
                    // The same seam as the points': a batch's items once, when it applies.
                    self.items
                        .push((l.run_id.clone(), l.seq, std::mem::take(&mut l.items)));
                }
                if applied {
                    Change::Points(l.run_id)
                } else {
                    Change::Nothing
                }
            }
            ToViewer::Alert(a) => {
                if !self.takes_points(&a.run_id) {
                    return (Change::Nothing, Vec::new());
                }
                let run = a.run_id.clone();
                let added = self.runs.get_mut(&run).is_some_and(|d| d.alert(a));
                if added {
                    Change::Alert(run)
                } else {
                    Change::Nothing
                }
            }
            ToViewer::CommandEvent(e) => {
                let run = e.run_id.clone();
                if self.runs.get_mut(&run).is_some_and(|d| d.command(e)) {
                    Change::Command(run)
                } else {
                    Change::Nothing
                }
            }
            ToViewer::Zoomed(z) => Change::Zoomed(z),
            ToViewer::RunDeleted(d) => {
                if let Some(listed) = &mut self.listed {
                    listed.remove(&d.run_id);
                }
                self.items.retain(|(run, _, _)| run != &d.run_id);
                let frames = self.unwant(std::slice::from_ref(&d.run_id));
                return (Change::Deleted(d), frames);
            }
            ToViewer::Resync(_) => Change::Nothing,
            ToViewer::HubError(e) => Change::HubError(e),
        };
        (change, Vec::new())
    }

    /// Runs whose summary changed: the values of a partial update merged with those known,
    /// listed, and synced when one of them is wanted (it may have just appeared).
    fn summaries(&mut self, mut runs: Vec<RunSummary>) -> (Change, Vec<FromViewer>) {
        let wanted = runs.iter().any(|r| self.subs.contains_key(&r.run_id));
        if let Some(listed) = &mut self.listed {
            for run in &mut runs {
                // A partial update carries only the headline values: keep the others known.
                if let Some(old) = listed.get(&run.run_id) {
                    for (name, v) in &old.last_values {
                        if !run.last_values.iter().any(|(n, _)| n == name) {
                            run.last_values.push((name.clone(), *v));
                        }
                    }
                }
                listed.insert(run.run_id.clone(), run.clone());
            }
        }
        let frames = if wanted { self.sync() } else { Vec::new() };
        (Change::Summaries(runs), frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepstream_protocol::{
        Backfill, Live, MetricDef, MetricId, Metrics, RunList, RunStatus, RunUpdates, Series,
        StepRecord,
    };

    fn id(s: &str) -> RunId {
        RunId::new(s).unwrap()
    }

    fn summary(run: &str, values: &[(&str, f64)]) -> RunSummary {
        RunSummary {
            run_id: id(run),
            project: "p".into(),
            name: run.into(),
            host: "h".into(),
            rank: 0,
            world_size: 1,
            job: String::new(),
            framework: String::new(),
            started_at: 0.0,
            status: RunStatus::Running,
            status_message: None,
            last_step: None,
            last_point_at: None,
            last_values: values.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            records: 0,
        }
    }

    fn list(runs: Vec<RunSummary>) -> ToViewer {
        ToViewer::RunList(RunList {
            runs,
            now: 0.0,
            done: true,
        })
    }

    fn subscribed(frames: &[FromViewer]) -> Vec<(RunId, Option<u64>)> {
        frames
            .iter()
            .filter_map(|f| match f {
                FromViewer::Subscribe(s) => Some((s.runs[0].clone(), s.after_seq)),
                _ => None,
            })
            .collect()
    }

    fn live(run: &str, seq: u64) -> ToViewer {
        ToViewer::Live(Live {
            run_id: id(run),
            seq,
            records: vec![StepRecord {
                step: seq as i64,
                wall_time: 0.0,
                values: vec![(MetricId(0), 1.0)],
            }],
            items: Vec::new(),
        })
    }

    /// After a lost socket the next one resubscribes after the batches held (a history cut
    /// short comes again whole); a client that waits for the list subscribes a run once
    /// the list shows it.
    #[test]
    fn subscriptions_resume_by_sequence_number_and_wait_for_the_list_when_asked() {
        let mut c = Client::new(true);
        assert!(c.want(&id("a"), None, 0.0).is_empty(), "not open yet");
        assert!(c.on_open().is_empty(), "no list yet");
        let (_, frames) = c.on_message(list(vec![summary("b", &[])]), 0.0);
        assert!(subscribed(&frames).is_empty(), "a is not listed");
        let (_, frames) = c.on_message(
            ToViewer::RunUpdates(RunUpdates {
                runs: vec![summary("a", &[])],
                now: 0.0,
            }),
            0.0,
        );
        assert_eq!(subscribed(&frames), vec![(id("a"), None)]);
        let metrics = ToViewer::Metrics(Metrics {
            run_id: id("a"),
            metrics: vec![MetricDef {
                id: MetricId(0),
                name: "loss".into(),
            }],
        });
        c.on_message(metrics, 0.0);
        c.on_message(
            ToViewer::Backfill(Backfill {
                run_id: id("a"),
                through_seq: 3,
                downsampled: false,
                series: vec![Series {
                    metric: MetricId(0),
                    steps: vec![1, 2, 3],
                    values: vec![1.0; 3],
                    times: vec![0.0; 3],
                }],
                done: true,
            }),
            0.0,
        );
        assert!(matches!(
            c.on_message(live("a", 4), 0.0).0,
            Change::Points(_)
        ));
        assert!(
            matches!(c.on_message(live("a", 4), 0.0).0, Change::Nothing),
            "a repeat"
        );
        c.on_lost();
        assert!(c.on_open().is_empty(), "waits for the new socket's list");
        let (_, frames) = c.on_message(list(vec![summary("a", &[])]), 0.0);
        assert_eq!(subscribed(&frames), vec![(id("a"), Some(4))]);
        assert_eq!(c.runs[&id("a")].series("loss").unwrap().steps.len(), 4);
        // A client that does not wait subscribes at once.
        let mut page = Client::new(false);
        page.on_open();
        assert_eq!(
            subscribed(&page.want(&id("x"), None, 0.0)),
            vec![(id("x"), None)]
        );
    }

    /// Wanting more metrics of a subscribed run starts it over; the replaced subscription's
    /// points in flight are dropped until the new one's `Metrics` frame.
    #[test]
    fn a_replaced_subscription_drops_the_old_ones_frames() {
        let mut c = Client::new(false);
        c.on_open();
        c.want(&id("a"), Some(&["loss".into()]), 0.0);
        let frames = c.want(&id("a"), Some(&["lr".into()]), 0.0);
        let FromViewer::Subscribe(s) = &frames[0] else {
            panic!("{frames:?}")
        };
        assert_eq!(
            s.metrics.as_deref(),
            Some(&["loss".to_string(), "lr".into()][..])
        );
        assert!(matches!(c.on_message(live("a", 1), 0.0).0, Change::Nothing));
        c.on_message(
            ToViewer::Metrics(Metrics {
                run_id: id("a"),
                metrics: vec![MetricDef {
                    id: MetricId(0),
                    name: "loss".into(),
                }],
            }),
            0.0,
        );
        assert!(matches!(
            c.on_message(live("a", 1), 0.0).0,
            Change::Points(_)
        ));
    }

    /// A partial update keeps the values it does not carry; the list's pages gather.
    #[test]
    fn partial_updates_keep_known_values_and_pages_gather() {
        let mut c = Client::new(false);
        let page = |runs, done| {
            ToViewer::RunList(RunList {
                runs,
                now: 0.0,
                done,
            })
        };
        assert!(matches!(
            c.on_message(
                page(vec![summary("a", &[("loss", 1.0), ("acc", 0.5)])], false),
                0.0
            )
            .0,
            Change::Nothing
        ));
        let (Change::Listed(runs), _) = c.on_message(page(vec![summary("b", &[])], true), 0.0)
        else {
            panic!("the list")
        };
        assert_eq!(runs.len(), 2);
        let (Change::Summaries(runs), _) = c.on_message(
            ToViewer::RunUpdates(RunUpdates {
                runs: vec![summary("a", &[("loss", 0.9)])],
                now: 0.0,
            }),
            0.0,
        ) else {
            panic!("summaries")
        };
        assert_eq!(
            runs[0].last_values,
            vec![("loss".to_string(), 0.9), ("acc".into(), 0.5)]
        );
    }
}
