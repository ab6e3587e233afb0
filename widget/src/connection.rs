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
use stepstream_chart::client::{Change, Client};
use stepstream_chart::ws::{self, Handlers, Link, Socket};
use stepstream_protocol::{FromViewer, ItemBody, RunId, Stream, ToViewer};
use wasm_bindgen::JsCast;

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

/// Console lines and samples a connection keeps per run, at most.
pub const KEPT_ITEMS: usize = 500;

/// A console line or a sample as a panel shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    Line {
        step: i64,
        stderr: bool,
        text: String,
    },
    Text {
        key: String,
        step: i64,
        text: String,
    },
    Image {
        key: String,
        step: i64,
        src: String,
        caption: String,
    },
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
    /// What is wanted, the run list and the points: the client the web app uses too. A
    /// run is subscribed once the run list shows it.
    pub client: Client,
    /// What the hub's HTTP API said about wanted runs the run list does not show.
    pub probes: HashMap<RunId, Probe>,
    /// Each widget's runs and metrics, by widget id.
    users: HashMap<u32, (Vec<RunId>, Vec<String>)>,
    /// The hub's last complaint, shown until the next frame that changes something.
    pub last_error: Option<String>,
    /// Console lines and samples of the runs a panel shows: the history read over HTTP
    /// and those of live batches, by `(seq, idx)`, the newest [`KEPT_ITEMS`] per run.
    pub items: HashMap<RunId, std::collections::BTreeMap<(u64, u32), Shown>>,
    me: Weak<RefCell<Connection>>,
}

/// The socket for `key`, opened on first use; registers widget `id`'s runs and metrics.
#[allow(clippy::too_many_arguments)]
pub fn attach(
    key: &str,
    base: &str,
    token: Option<&str>,
    live: bool,
    id: u32,
    runs: &[RunId],
    metrics: &[String],
    panel: Option<&str>,
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
                    client: Client::new(true),
                    probes: HashMap::new(),
                    users: HashMap::new(),
                    last_error: None,
                    items: HashMap::new(),
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
    if let Some(history) = panel {
        // A panel: the runs' console lines and samples, the history over HTTP.
        for run in runs {
            let frames = conn
                .borrow_mut()
                .client
                .want_items(run, js_sys::Date::now());
            conn.borrow().send_all(frames);
            let mut url = format!(
                "{base}/api/runs/{}/{history}",
                String::from(js_sys::encode_uri_component(run.as_str()))
            );
            if let Some(t) = token {
                url.push_str("&token=");
                url.push_str(&String::from(js_sys::encode_uri_component(t)));
            }
            load_history(Rc::downgrade(&conn), run.clone(), url);
        }
    }
    changed();
    conn
}

/// Reads a run's console tail or samples (`url`, the API's JSON) into the connection.
fn load_history(conn: Weak<RefCell<Connection>>, run: RunId, url: String) {
    wasm_bindgen_futures::spawn_local(async move {
        let Some(window) = web_sys::window() else {
            return;
        };
        let Ok(answer) = wasm_bindgen_futures::JsFuture::from(window.fetch_with_str(&url)).await
        else {
            return;
        };
        let Ok(response) = answer.dyn_into::<web_sys::Response>() else {
            return;
        };
        let Ok(text) = response.text() else {
            return;
        };
        let Some(text) = wasm_bindgen_futures::JsFuture::from(text)
            .await
            .ok()
            .and_then(|t| t.as_string())
        else {
            return;
        };
        let Ok(v) = js_sys::JSON::parse(&text) else {
            return;
        };
        let get = |o: &wasm_bindgen::JsValue, k: &str| js_sys::Reflect::get(o, &k.into()).ok();
        let num = |o: &wasm_bindgen::JsValue, k: &str| get(o, k).and_then(|x| x.as_f64());
        let string = |o: &wasm_bindgen::JsValue, k: &str| {
            get(o, k).and_then(|x| x.as_string()).unwrap_or_default()
        };
        let list = get(&v, "lines")
            .filter(|l| l.is_object())
            .or_else(|| get(&v, "samples"))
            .map(|l| js_sys::Array::from(&l))
            .unwrap_or_default();
        let Some(conn) = conn.upgrade() else {
            return;
        };
        let mut found = Vec::new();
        for o in list.iter() {
            let at = (
                num(&o, "seq").unwrap_or(0.0) as u64,
                num(&o, "idx").unwrap_or(0.0) as u32,
            );
            let step = num(&o, "step").unwrap_or(0.0) as i64;
            let shown = match get(&o, "kind").and_then(|k| k.as_string()).as_deref() {
                None => Shown::Line {
                    step,
                    stderr: string(&o, "stream") == "stderr",
                    text: string(&o, "text"),
                },
                Some("text") => Shown::Text {
                    key: string(&o, "key"),
                    step,
                    text: string(&o, "body"),
                },
                Some("image") => {
                    let body = get(&o, "body").unwrap_or_default();
                    Shown::Image {
                        key: string(&o, "key"),
                        step,
                        src: string(&body, "src"),
                        caption: string(&body, "caption"),
                    }
                }
                _ => continue,
            };
            found.push((at, shown));
        }
        conn.borrow_mut().keep(&run, found);
        changed();
    });
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
            let frames = self.client.want(run, Some(metrics), js_sys::Date::now());
            self.send_all(frames);
        }
        self.ask_about_unlisted();
    }

    /// Drops runs no widget shows any more.
    fn prune(&mut self) {
        let wanted: BTreeSet<&RunId> = self.users.values().flat_map(|(r, _)| r).collect();
        let gone: Vec<RunId> = self
            .client
            .runs
            .keys()
            .filter(|r| !wanted.contains(r))
            .cloned()
            .collect();
        for run in &gone {
            self.probes.remove(run);
        }
        let frames = self.client.unwant(&gone);
        self.send_all(frames);
    }

    pub(crate) fn send_all(&self, frames: Vec<FromViewer>) {
        if let Some(s) = &self.socket {
            for f in &frames {
                s.send(f);
            }
        }
    }

    fn is_open(&self) -> bool {
        self.link.is_some_and(Link::is_open)
    }

    /// Asks the hub's HTTP API about each wanted run the run list does not show (once per
    /// socket); forgets what it said about runs now listed.
    fn ask_about_unlisted(&mut self) {
        let Some(listed) = self.client.listed.as_ref().filter(|_| self.is_open()) else {
            return;
        };
        self.probes.retain(|run, _| !listed.contains_key(run));
        let ask: Vec<RunId> = self
            .client
            .runs
            .keys()
            .filter(|r| !listed.contains_key(*r) && !self.probes.contains_key(*r))
            .cloned()
            .collect();
        for run in ask {
            self.probes.insert(run.clone(), Probe::Pending);
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
            } else if let Some(p) = run.and_then(|r| c.probes.get_mut(&r)) {
                if *p == Probe::Pending {
                    *p = verdict;
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
                let frames = self.client.on_open();
                self.send_all(frames);
            }
            Link::Lost { .. } | Link::Failed { .. } => {
                self.client.on_lost();
                self.probes.retain(|_, p| *p != Probe::Pending);
                // Ask why once per failure streak, not on every retry.
                if matches!(link, Link::Failed { .. }) && (was_open || self.refusal.is_none()) {
                    let first = self.client.runs.keys().next().cloned();
                    self.refusal = Some(Probe::Pending);
                    self.ask(first, true);
                }
            }
        }
    }

    /// Keeps a run's console lines and samples, the newest [`KEPT_ITEMS`].
    fn keep(&mut self, run: &RunId, found: Vec<((u64, u32), Shown)>) {
        let held = self.items.entry(run.clone()).or_default();
        held.extend(found);
        while held.len() > KEPT_ITEMS {
            held.pop_first();
        }
    }

    fn on_message(&mut self, msg: ToViewer) {
        let (change, frames) = self.client.on_message(msg, js_sys::Date::now());
        self.send_all(frames);
        for (run, seq, items) in std::mem::take(&mut self.client.items) {
            let found = items
                .into_iter()
                .enumerate()
                .filter_map(|(idx, item)| {
                    let shown = match item.body {
                        ItemBody::Line { stream, text } => Shown::Line {
                            step: item.step,
                            stderr: stream == Stream::Stderr,
                            text,
                        },
                        ItemBody::Text(text) => Shown::Text {
                            key: item.key,
                            step: item.step,
                            text,
                        },
                        ItemBody::Image(i) => Shown::Image {
                            src: format!("/api/runs/{}/image?seq={seq}&idx={idx}", run.as_str()),
                            key: item.key,
                            step: item.step,
                            caption: i.caption,
                        },
                        _ => return None,
                    };
                    Some(((seq, idx as u32), shown))
                })
                .collect();
            self.keep(&run, found);
        }
        match change {
            Change::Listed(_) | Change::Summaries(_) => self.ask_about_unlisted(),
            Change::Points(_) => {
                if !self.live && self.client.all_backfilled() {
                    // A snapshot: the history is here, nothing more is wanted. Its widgets
                    // keep the points; a widget mounted later gets a socket of its own.
                    if let Some(s) = self.socket.take() {
                        s.close();
                    }
                    CONNECTIONS.with(|c| c.borrow_mut().remove(&self.key));
                }
            }
            Change::HubError(e) => {
                web_sys::console::warn_1(
                    &format!("stepstream hub: {:?}: {}", e.code, e.message).into(),
                );
                self.last_error = Some(e.message);
            }
            // Its points are gone from the client; the widget says why where it drew them.
            Change::Deleted(d) => {
                self.last_error = Some(format!("run {} was deleted", d.run_id));
            }
            // The widget asks for no zoom windows; statuses and alerts are read from the
            // client when drawing.
            Change::Nothing
            | Change::Status(_)
            | Change::Defined(_)
            | Change::Alert(_)
            | Change::Command(_)
            | Change::Zoomed(_) => {}
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
