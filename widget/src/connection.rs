//! One viewer socket per hub (and token, and liveness), shared by every widget on the page
//! that uses it, and the points it brought, per run: ten charts of one run on a wiki page
//! cost the hub one socket and one subscription.
//!
//! A run is subscribed once the hub's run list (the first frame on every socket) shows it;
//! a run the list does not show is asked about over HTTP, which says whether it does not
//! exist (the widget waits for it: a run may start later) or this token may not read it.
//! A socket that closes before it opens is asked about the same way: a browser hides why
//! a WebSocket handshake failed, the hub's HTTP answer (403 for an origin, 401 for a token)
//! does not.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::rc::{Rc, Weak};
use stepstream_chart::data::RunData;
use stepstream_chart::ws::{self, Handlers, Link, Socket};
use stepstream_protocol::{FromViewer, RunId, RunSummary, Subscribe, ToViewer, Unsubscribe};
use wasm_bindgen::JsCast;

/// Points per metric in the history of a first subscription: a chart is at most a few
/// thousand pixels wide and the hub's M4 keeps every extreme.
const HISTORY_BUDGET: u32 = 4_000;

thread_local! {
    static CONNECTIONS: RefCell<HashMap<String, Rc<RefCell<Connection>>>> = RefCell::new(HashMap::new());
    static SERIAL: Cell<u32> = const { Cell::new(0) };
    /// Bumped on every change any widget may show; a frame redraws widgets when it moved.
    static VERSION: Cell<u64> = const { Cell::new(0) };
}

pub fn changed() {
    VERSION.with(|v| v.set(v.get() + 1));
}

pub fn version() -> u64 {
    VERSION.with(Cell::get)
}

/// Sockets open (or opening) on this page.
pub fn count() -> usize {
    CONNECTIONS.with(|c| c.borrow().len())
}

/// What the hub's HTTP API said about a run (or about a socket that would not open).
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    Pending,
    /// The run exists and is readable (the run list will bring it).
    Found,
    NotFound,
    /// Origin or token refused; the hub's reason.
    Refused(String),
    /// No answer at all: the hub is down or unreachable from this page.
    Unreachable,
    /// Another answer (a limit, a server error), as the hub put it.
    Other(String),
}

/// One run that widgets on this socket show.
#[derive(Default)]
pub struct Wanted {
    pub metrics: BTreeSet<String>,
    pub data: RunData,
    /// A subscription was sent on the current socket.
    pub subscribed: bool,
    pub probe: Option<Probe>,
    /// Resubscribed on the same socket: frames of the replaced subscription may still be in
    /// flight. Every subscription starts with a `Metrics` frame, so points are taken again
    /// from the next one on.
    awaiting_intro: bool,
}

pub struct Connection {
    pub serial: u32,
    key: String,
    pub base: String,
    token: Option<String>,
    pub live: bool,
    socket: Option<Socket>,
    /// `None` until the first open or failure.
    pub link: Option<Link>,
    /// When `link` last changed, `Date.now()`.
    pub link_at: f64,
    /// Why the socket would not open, asked after it failed.
    pub refusal: Option<Probe>,
    /// The hub's run list as this token sees it; `None` until it arrived.
    pub listed: Option<HashMap<RunId, RunSummary>>,
    /// Run-list pages received before the last one.
    list_pages: Vec<RunSummary>,
    /// Hub clock minus the page's, seconds.
    pub hub_offset: f64,
    pub runs: HashMap<RunId, Wanted>,
    /// Each widget's runs and metrics, by widget id.
    users: HashMap<u32, (Vec<RunId>, Vec<String>)>,
    /// The hub's last complaint, shown until the next frame that changes something.
    pub last_error: Option<String>,
    me: Weak<RefCell<Connection>>,
}

/// The socket for `key`, opened on first use; registers widget `id`'s runs and metrics.
pub fn attach(
    key: &str,
    base: &str,
    token: Option<&str>,
    live: bool,
    id: u32,
    runs: &[RunId],
    metrics: &[String],
) -> Rc<RefCell<Connection>> {
    let existing = CONNECTIONS.with(|c| c.borrow().get(key).cloned());
    let conn = match existing {
        Some(conn) => conn,
        None => {
            let serial = SERIAL.with(|s| {
                s.set(s.get() + 1);
                s.get()
            });
            let conn = Rc::new_cyclic(|me| {
                RefCell::new(Connection {
                    serial,
                    key: key.to_string(),
                    base: base.to_string(),
                    token: token.map(String::from),
                    live,
                    socket: None,
                    link: None,
                    link_at: js_sys::Date::now(),
                    refusal: None,
                    listed: None,
                    list_pages: Vec::new(),
                    hub_offset: 0.0,
                    runs: HashMap::new(),
                    users: HashMap::new(),
                    last_error: None,
                    me: me.clone(),
                })
            });
            CONNECTIONS.with(|c| c.borrow_mut().insert(key.to_string(), conn.clone()));
            let socket = open(&conn, base, token);
            conn.borrow_mut().socket = Some(socket);
            conn
        }
    };
    conn.borrow_mut().add_user(id, runs, metrics);
    changed();
    conn
}

/// Unregisters widget `id`; the socket closes with its last widget.
pub fn detach(key: &str, conn: &Rc<RefCell<Connection>>, id: u32) {
    let empty = {
        let mut c = conn.borrow_mut();
        c.users.remove(&id);
        c.users.is_empty()
    };
    if empty {
        if let Some(s) = conn.borrow_mut().socket.take() {
            s.close();
        }
        // Unless a snapshot already left and another connection took the key.
        CONNECTIONS.with(|c| {
            let mut c = c.borrow_mut();
            if c.get(key).is_some_and(|other| Rc::ptr_eq(other, conn)) {
                c.remove(key);
            }
        });
    } else {
        conn.borrow_mut().prune();
    }
    changed();
}

fn open(conn: &Rc<RefCell<Connection>>, base: &str, token: Option<&str>) -> Socket {
    let (m, s) = (Rc::downgrade(conn), Rc::downgrade(conn));
    Socket::open(
        ws::viewer_url(Some(base), token),
        Handlers {
            // The hub's run list comes first on every socket; subscriptions follow it.
            on_open: Box::new(Vec::new),
            on_message: Box::new(move |msg| {
                if let Some(c) = m.upgrade() {
                    c.borrow_mut().on_message(msg);
                    changed();
                }
            }),
            on_state: Box::new(move |link| {
                if let Some(c) = s.upgrade() {
                    c.borrow_mut().on_link(link);
                    changed();
                }
            }),
        },
    )
}

impl Connection {
    fn add_user(&mut self, id: u32, runs: &[RunId], metrics: &[String]) {
        self.users.insert(id, (runs.to_vec(), metrics.to_vec()));
        for run in runs {
            let w = self.runs.entry(run.clone()).or_default();
            let before = w.metrics.len();
            w.metrics.extend(metrics.iter().cloned());
            if w.subscribed && w.metrics.len() != before {
                // The history of the new metrics is needed: start this run over.
                w.data = RunData::default();
                w.subscribed = false;
                w.awaiting_intro = true;
            }
        }
        self.sync();
    }

    /// Drops runs no widget shows any more.
    fn prune(&mut self) {
        let wanted: BTreeSet<&RunId> = self.users.values().flat_map(|(r, _)| r).collect();
        let gone: Vec<RunId> = self
            .runs
            .keys()
            .filter(|r| !wanted.contains(r))
            .cloned()
            .collect();
        for run in &gone {
            self.runs.remove(run);
        }
        if !gone.is_empty() {
            self.send(FromViewer::Unsubscribe(Unsubscribe { runs: gone }));
        }
    }

    fn send(&self, msg: FromViewer) {
        if let Some(s) = &self.socket {
            s.send(&msg);
        }
    }

    fn is_open(&self) -> bool {
        self.link.is_some_and(Link::is_open)
    }

    /// Subscribes every wanted run the run list shows; asks about the others.
    fn sync(&mut self) {
        if !self.is_open() {
            return;
        }
        let Some(listed) = &self.listed else {
            return;
        };
        let mut subscribe = Vec::new();
        let mut ask = Vec::new();
        for (run, w) in &mut self.runs {
            if listed.contains_key(run) {
                if !w.subscribed {
                    w.subscribed = true;
                    w.probe = None;
                    let held = w.data.held_seq();
                    if held.is_none() {
                        // A history cut short by a lost socket comes again whole.
                        w.data = RunData::default();
                    }
                    subscribe.push(FromViewer::Subscribe(Subscribe {
                        runs: vec![run.clone()],
                        metrics: Some(w.metrics.iter().cloned().collect()),
                        from_step: None,
                        budget: held.is_none().then_some(HISTORY_BUDGET),
                        after_seq: held,
                    }));
                }
            } else if w.probe.is_none() {
                w.probe = Some(Probe::Pending);
                ask.push(run.clone());
            }
        }
        for msg in subscribe {
            self.send(msg);
        }
        for run in ask {
            self.ask(Some(run), false);
        }
    }

    /// Asks the hub's HTTP API about `run`; `for_socket`: about a socket that would not open.
    fn ask(&self, run: Option<RunId>, for_socket: bool) {
        let me = self.me.clone();
        let url = probe_url(&self.base, run.as_ref(), self.token.as_deref());
        wasm_bindgen_futures::spawn_local(async move {
            let verdict = probe(&url).await;
            let Some(conn) = me.upgrade() else { return };
            let mut c = conn.borrow_mut();
            if for_socket {
                c.refusal = Some(verdict);
            } else if let Some(w) = run.and_then(|r| c.runs.get_mut(&r)) {
                if w.probe == Some(Probe::Pending) {
                    w.probe = Some(verdict);
                }
            }
            drop(c);
            changed();
        });
    }

    fn on_link(&mut self, link: Link) {
        let was_open = self.is_open();
        self.link = Some(link);
        self.link_at = js_sys::Date::now();
        match link {
            Link::Open => {
                self.refusal = None;
            }
            Link::Lost { .. } | Link::Failed { .. } => {
                for w in self.runs.values_mut() {
                    w.subscribed = false;
                    // A new socket carries nothing of the old one's subscriptions.
                    w.awaiting_intro = false;
                    if w.probe == Some(Probe::Pending) {
                        w.probe = None;
                    }
                }
                self.listed = None;
                // Ask why once per failure streak, not on every retry.
                if matches!(link, Link::Failed { .. }) && (was_open || self.refusal.is_none()) {
                    let first = self.runs.keys().next().cloned();
                    self.refusal = Some(Probe::Pending);
                    self.ask(first, true);
                }
            }
        }
    }

    /// Runs whose summary changed: listed, and re-synced when a widget wants one of them.
    fn on_summaries(&mut self, now: f64, runs: Vec<RunSummary>) {
        self.hub_offset = now - js_sys::Date::now() / 1000.0;
        let wanted = runs.iter().any(|r| self.runs.contains_key(&r.run_id));
        if let Some(listed) = &mut self.listed {
            for run in runs {
                listed.insert(run.run_id.clone(), run);
            }
        }
        if wanted {
            self.sync();
        }
    }

    fn on_message(&mut self, msg: ToViewer) {
        match msg {
            ToViewer::RunList(list) => {
                // Pages gather until the last one, which replaces the list.
                self.list_pages.extend(list.runs);
                if !list.done {
                    return;
                }
                self.hub_offset = list.now - js_sys::Date::now() / 1000.0;
                self.listed = Some(
                    std::mem::take(&mut self.list_pages)
                        .into_iter()
                        .map(|r| (r.run_id.clone(), r))
                        .collect(),
                );
                self.sync();
            }
            ToViewer::RunUpdate(u) => self.on_summaries(u.now, vec![u.run]),
            ToViewer::RunUpdates(u) => self.on_summaries(u.now, u.runs),
            ToViewer::StatusChange(c) => {
                if let Some(r) = self.listed.as_mut().and_then(|l| l.get_mut(&c.run_id)) {
                    r.status = c.status;
                    r.status_message = c.message;
                }
            }
            ToViewer::Metrics(m) => {
                if let Some(w) = self.runs.get_mut(&m.run_id) {
                    w.awaiting_intro = false;
                    w.data.define(&m.metrics);
                }
            }
            ToViewer::Backfill(b) => {
                if let Some(w) = self.runs.get_mut(&b.run_id).filter(|w| !w.awaiting_intro) {
                    w.data.backfill(&b);
                }
                if !self.live && self.runs.values().all(|w| w.data.backfilled) {
                    // A snapshot: the history is here, nothing more is wanted. Its widgets
                    // keep the points; a widget mounted later gets a socket of its own.
                    if let Some(s) = self.socket.take() {
                        s.close();
                    }
                    CONNECTIONS.with(|c| c.borrow_mut().remove(&self.key));
                }
            }
            ToViewer::Live(l) => {
                if let Some(w) = self.runs.get_mut(&l.run_id).filter(|w| !w.awaiting_intro) {
                    w.data.live(&l, js_sys::Date::now());
                }
            }
            ToViewer::Alert(a) => {
                if let Some(w) = self.runs.get_mut(&a.run_id).filter(|w| !w.awaiting_intro) {
                    w.data.alert(a);
                }
            }
            // The widget asks for no zoom windows.
            ToViewer::Resync(_) | ToViewer::Zoomed(_) => {}
            ToViewer::HubError(e) => {
                web_sys::console::warn_1(
                    &format!("stepstream hub: {:?}: {}", e.code, e.message).into(),
                );
                self.last_error = Some(e.message);
            }
        }
    }
}

fn probe_url(base: &str, run: Option<&RunId>, token: Option<&str>) -> String {
    let path = match run {
        Some(r) => format!(
            "/api/runs/{}",
            String::from(js_sys::encode_uri_component(r.as_str()))
        ),
        None => "/api/runs".to_string(),
    };
    match token {
        Some(t) => format!(
            "{base}{path}?token={}",
            String::from(js_sys::encode_uri_component(t))
        ),
        None => format!("{base}{path}"),
    }
}

/// One GET to the hub's API, read as a verdict.
async fn probe(url: &str) -> Probe {
    let Some(window) = web_sys::window() else {
        return Probe::Unreachable;
    };
    let init = web_sys::RequestInit::new();
    init.set_mode(web_sys::RequestMode::Cors);
    let Ok(request) = web_sys::Request::new_with_str_and_init(url, &init) else {
        return Probe::Other(format!("cannot ask {url}"));
    };
    let Ok(answer) =
        wasm_bindgen_futures::JsFuture::from(window.fetch_with_request(&request)).await
    else {
        return Probe::Unreachable;
    };
    let Ok(response) = answer.dyn_into::<web_sys::Response>() else {
        return Probe::Unreachable;
    };
    let status = response.status();
    let reason = match response.text() {
        Ok(p) => wasm_bindgen_futures::JsFuture::from(p)
            .await
            .ok()
            .and_then(|t| t.as_string())
            .map(|t| error_text(&t))
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    match status {
        200..=299 => Probe::Found,
        404 => Probe::NotFound,
        401 | 403 => Probe::Refused(reason),
        _ => Probe::Other(format!("HTTP {status}: {reason}")),
    }
}

/// The `error` of the hub's JSON error body, or the body itself.
fn error_text(body: &str) -> String {
    let parsed = js_sys::JSON::parse(body).ok();
    parsed
        .and_then(|v| js_sys::Reflect::get(&v, &"error".into()).ok())
        .and_then(|e| e.as_string())
        .unwrap_or_else(|| body.chars().take(200).collect())
}
