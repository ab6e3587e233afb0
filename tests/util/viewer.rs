//! A viewer speaking the protocol over a real WebSocket, on its own thread and runtime, and
//! what it received.

use super::*;
use std::collections::{BTreeMap, HashMap};

/// What a viewer has received for one run.
#[derive(Default, Debug)]
pub struct Seen {
    pub names: HashMap<MetricId, String>,
    /// metric name -> step -> how many times a point for that step arrived, and its value.
    pub points: BTreeMap<String, BTreeMap<i64, (u32, f64)>>,
    pub backfill_done: bool,
    /// The most metrics one backfill frame carried.
    pub most_series_per_backfill: usize,
    /// The most points one backfill series carried.
    pub most_points_per_series: usize,
    pub live_batches: u64,
    pub resyncs: u64,
    pub status: Option<RunStatus>,
    pub through_seq: u64,
    /// Console lines and samples that came in live batches, in order.
    pub items: Vec<Item>,
}

impl Seen {
    fn add(&mut self, id: MetricId, step: i64, value: f64) {
        let name = self
            .names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("#{}", id.0));
        let e = self
            .points
            .entry(name)
            .or_default()
            .entry(step)
            .or_insert((0, value));
        e.0 += 1;
        e.1 = value;
    }

    pub fn count(&self, metric: &str) -> usize {
        self.points.get(metric).map_or(0, |m| m.len())
    }

    /// Steps that arrived more than once.
    pub fn duplicates(&self, metric: &str) -> Vec<i64> {
        self.points
            .get(metric)
            .map(|m| {
                m.iter()
                    .filter(|(_, (n, _))| *n > 1)
                    .map(|(s, _)| *s)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A protocol-speaking viewer on its own thread and runtime.
pub struct Viewer {
    rt: tokio::runtime::Runtime,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    pub runs: HashMap<RunId, Seen>,
    pub run_list: Vec<RunSummary>,
    pub errors: Vec<HubError>,
    pub alerts: Vec<Alert>,
    /// Commands' timelines, as told.
    pub command_events: Vec<CommandEvent>,
    /// Zoom windows answered.
    pub zoomed: Vec<Zoomed>,
    /// Runs the hub said were deleted.
    pub deleted: Vec<RunDeleted>,
    /// The hub closed the socket.
    pub closed: bool,
    /// Run-list pages before the last one.
    list_pages: Vec<RunSummary>,
    /// Whole run lists received, and the most runs one page carried.
    pub run_lists: usize,
    pub most_runs_per_page: usize,
}

impl Viewer {
    /// The states command `id` of `run` was told in, in order.
    pub fn commands(&self, run: &RunId, id: u64) -> Vec<CommandState> {
        self.command_events
            .iter()
            .filter(|e| &e.run_id == run && e.command.id == id)
            .map(|e| e.state)
            .collect()
    }

    pub fn connect(hub: &Hub) -> Viewer {
        Viewer::connect_url(format!("ws://127.0.0.1:{}/ws/viewer", hub.port))
    }

    /// With a read token in the query, as the web app sends it.
    pub fn connect_with_token(hub: &Hub, token: &str) -> Viewer {
        Viewer::connect_url(format!(
            "ws://127.0.0.1:{}/ws/viewer?token={token}",
            hub.port
        ))
    }

    pub fn connect_url(url: String) -> Viewer {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ws, _) = rt.block_on(tokio_tungstenite::connect_async(url)).unwrap();
        Viewer {
            rt,
            ws,
            runs: HashMap::new(),
            run_list: Vec::new(),
            errors: Vec::new(),
            alerts: Vec::new(),
            command_events: Vec::new(),
            zoomed: Vec::new(),
            deleted: Vec::new(),
            closed: false,
            list_pages: Vec::new(),
            run_lists: 0,
            most_runs_per_page: 0,
        }
    }

    pub fn send(&mut self, msg: FromViewer) {
        use futures_util::SinkExt;
        let frame = tokio_tungstenite::tungstenite::Message::Binary(msg.encode().into());
        self.rt.block_on(self.ws.send(frame)).unwrap();
    }

    pub fn subscribe(&mut self, runs: &[RunId], budget: Option<u32>) {
        self.send(FromViewer::Subscribe(Subscribe {
            runs: runs.to_vec(),
            metrics: None,
            from_step: None,
            budget,
            after_seq: None,
            items: true,
        }));
    }

    /// Resubscribes as a reconnecting page does: it holds the runs' batches through `held`.
    pub fn subscribe_after(&mut self, runs: &[RunId], held: u64) {
        self.send(FromViewer::Subscribe(Subscribe {
            runs: runs.to_vec(),
            metrics: None,
            from_step: None,
            budget: None,
            after_seq: Some(held),
            items: true,
        }));
    }

    /// Reads frames until `done` holds or `limit` passes; returns whether `done` held.
    pub fn pump(&mut self, limit: Duration, mut done: impl FnMut(&Viewer) -> bool) -> bool {
        use futures_util::StreamExt;
        let deadline = Instant::now() + limit;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let ws = &mut self.ws;
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(left, ws.next()).await });
            let msg = match next {
                Err(_) => return done(self),
                Ok(None) | Ok(Some(Err(_))) => {
                    self.closed = true;
                    return done(self);
                }
                Ok(Some(Ok(m))) => m,
            };
            if let tokio_tungstenite::tungstenite::Message::Close(_) = msg {
                self.closed = true;
                continue;
            }
            let tokio_tungstenite::tungstenite::Message::Binary(bytes) = msg else {
                continue;
            };
            self.apply(ToViewer::decode(&bytes).expect("hub frames decode"));
        }
        true
    }

    fn apply(&mut self, msg: ToViewer) {
        match msg {
            ToViewer::RunList(l) => {
                self.most_runs_per_page = self.most_runs_per_page.max(l.runs.len());
                self.list_pages.extend(l.runs);
                if l.done {
                    self.run_list = std::mem::take(&mut self.list_pages);
                    self.run_lists += 1;
                }
            }
            ToViewer::RunUpdate(u) => {
                self.run_list.retain(|r| r.run_id != u.run.run_id);
                self.run_list.push(u.run);
            }
            ToViewer::RunUpdates(u) => {
                for run in u.runs {
                    self.run_list.retain(|r| r.run_id != run.run_id);
                    self.run_list.push(run);
                }
            }
            ToViewer::Metrics(m) => {
                let seen = self.runs.entry(m.run_id).or_default();
                for d in m.metrics {
                    seen.names.insert(d.id, d.name);
                }
            }
            ToViewer::Backfill(b) => {
                let seen = self.runs.entry(b.run_id).or_default();
                seen.most_series_per_backfill = seen.most_series_per_backfill.max(b.series.len());
                for s in &b.series {
                    seen.most_points_per_series = seen.most_points_per_series.max(s.steps.len());
                }
                for s in &b.series {
                    for (&step, &v) in s.steps.iter().zip(&s.values) {
                        seen.add(s.metric, step, v);
                    }
                }
                seen.through_seq = b.through_seq;
                if b.done {
                    seen.backfill_done = true;
                }
            }
            ToViewer::Live(l) => {
                let seen = self.runs.entry(l.run_id).or_default();
                assert!(
                    l.seq > seen.through_seq,
                    "live batch {} at or below what the viewer holds ({})",
                    l.seq,
                    seen.through_seq
                );
                seen.through_seq = l.seq;
                seen.live_batches += 1;
                seen.items.extend(l.items.iter().cloned());
                for r in &l.records {
                    for &(id, v) in &r.values {
                        seen.add(id, r.step, v);
                    }
                }
            }
            ToViewer::StatusChange(c) => {
                self.runs.entry(c.run_id).or_default().status = Some(c.status)
            }
            ToViewer::Resync(r) => self.runs.entry(r.run_id).or_default().resyncs += 1,
            ToViewer::HubError(e) => self.errors.push(e),
            ToViewer::Alert(a) => self.alerts.push(a),
            ToViewer::CommandEvent(e) => self.command_events.push(e),
            ToViewer::Zoomed(z) => self.zoomed.push(z),
            ToViewer::RunDeleted(d) => {
                self.run_list.retain(|r| r.run_id != d.run_id);
                self.deleted.push(d);
            }
        }
    }
}
