//! The harness: the real `stepstream` binary in a temp dir, a tiny HTTP client, and a viewer
//! that speaks the protocol over a real WebSocket.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stepstream_protocol::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_stepstream");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` until it returns `Some`, or panics with `what` after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `stepstream serve` process.
pub struct Hub {
    pub port: u16,
    pub db: PathBuf,
    pub args: Vec<String>,
    /// Environment variables the process gets besides the test's own.
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// Where its stderr (its log, at `info`) goes, when a test reads it.
    pub log: Option<PathBuf>,
}

impl Hub {
    /// Like [`Hub::start`], its log (at `info`) kept in a file for the test to read.
    pub fn start_logged(extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let mut hub = Hub {
            port: free_port(),
            db: dir.path().join("hub.db"),
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            child: None,
            log: Some(dir.path().join("hub.log")),
            dir,
        };
        hub.spawn();
        hub
    }

    /// What the hub logged so far (see [`Hub::start_logged`]).
    pub fn logged(&self) -> String {
        self.log
            .as_ref()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    }

    pub fn start(extra: &[&str]) -> Hub {
        Hub::start_on(free_port(), extra)
    }

    /// A hub guarding writes and reads (tokens `w` and `r`) whose tokens file
    /// ([`Hub::tokens_file`]) holds `scoped`.
    pub fn start_with_tokens(scoped: &str, extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, scoped).unwrap();
        let tokens = tokens.to_str().unwrap().to_string();
        let mut args = vec![
            "--write-token",
            "w",
            "--read-token",
            "r",
            "--tokens",
            &tokens,
        ];
        args.extend_from_slice(extra);
        let db = dir.path().join("hub.db");
        Hub::start_with(free_port(), db, dir, &args)
    }

    /// The tokens file of [`Hub::start_with_tokens`].
    pub fn tokens_file(&self) -> PathBuf {
        self.dir.path().join("tokens.toml")
    }

    /// With these environment variables (say, libfaketime's, for a clock that is wrong).
    pub fn start_with_env(env: &[(&str, &str)], extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let mut hub = Hub {
            port: free_port(),
            db: dir.path().join("hub.db"),
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            dir,
            log: None,
        };
        hub.spawn();
        hub
    }

    /// On a given port (one a collector was already told to use).
    pub fn start_on(port: u16, extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hub.db");
        Hub::start_with(port, db, dir, extra)
    }

    /// With its database at `db` (on a filesystem a test made).
    pub fn start_with(port: u16, db: PathBuf, dir: tempfile::TempDir, extra: &[&str]) -> Hub {
        let mut hub = Hub {
            port,
            db,
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            child: None,
            dir,
            log: None,
        };
        hub.spawn();
        hub
    }

    fn spawn(&mut self) {
        let mut child = Command::new(BIN)
            .args(["serve", "--bind", &format!("127.0.0.1:{}", self.port)])
            .arg("--db")
            .arg(&self.db)
            .args(&self.args)
            .env("RUST_LOG", if self.log.is_some() { "info" } else { "warn" })
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(match &self.log {
                Some(path) => Stdio::from(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .unwrap(),
                ),
                None => Stdio::inherit(),
            })
            .spawn()
            .expect("start stepstream serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("listening on"), "hub said {line:?}");
        self.child = Some(child);
    }

    /// The hub process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn ws(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn get(&self, path: &str) -> Response {
        http_get(&self.addr(), path, None)
    }

    pub fn json(&self, path: &str) -> serde_json::Value {
        let r = self.get(path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        serde_json::from_slice(&r.body).unwrap()
    }

    pub fn run_json(&self, run_id: &str) -> Option<serde_json::Value> {
        let r = self.get(&format!("/api/runs/{run_id}"));
        (r.status == 200).then(|| serde_json::from_slice(&r.body).unwrap())
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// HTTP/1.1 GET with `Connection: close`; decodes chunked bodies.
pub fn http_get(addr: &str, path: &str, bearer: Option<&str>) -> Response {
    let auth = bearer.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    http_request(addr, "GET", path, &headers)
}

/// One HTTP/1.1 request with `Connection: close` and these headers; decodes chunked bodies.
pub fn http_request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16)
                .unwrap();
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = out;
    }
    Response {
        status,
        headers,
        body,
    }
}

/// Parses the hub's CSV export into (header, rows).
pub fn parse_csv(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    (header, rows)
}

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
    /// The hub closed the socket.
    pub closed: bool,
    /// Run-list pages before the last one.
    list_pages: Vec<RunSummary>,
    /// Whole run lists received, and the most runs one page carried.
    pub run_lists: usize,
    pub most_runs_per_page: usize,
}

impl Viewer {
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
        }
    }
}

/// A raw collector connection, for sending frames the library never would.
pub struct RawCollector {
    rt: tokio::runtime::Runtime,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl RawCollector {
    pub fn connect(hub: &Hub) -> RawCollector {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = format!("ws://127.0.0.1:{}/ws/collector", hub.port);
        let (ws, _) = rt.block_on(tokio_tungstenite::connect_async(url)).unwrap();
        RawCollector { rt, ws }
    }

    pub fn send_bytes(&mut self, bytes: Vec<u8>) {
        use futures_util::SinkExt;
        let frame = tokio_tungstenite::tungstenite::Message::Binary(bytes.into());
        // The hub may already have closed after a fatal error; that is fine here.
        let _ = self.rt.block_on(self.ws.send(frame));
    }

    pub fn send(&mut self, msg: ToHub) {
        self.send_bytes(msg.encode());
    }

    /// The next hub frame, or `None` when the hub closed the socket.
    pub fn recv(&mut self) -> Option<FromHub> {
        use futures_util::StreamExt;
        loop {
            let ws = &mut self.ws;
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), ws.next()).await })
                .expect("hub answers within 10 s")?;
            match next {
                Ok(tokio_tungstenite::tungstenite::Message::Binary(b)) => {
                    return Some(FromHub::decode(&b).expect("hub frames decode"))
                }
                Ok(tokio_tungstenite::tungstenite::Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }
}

pub fn identity(run_id: &str, name: &str) -> RunIdentity {
    RunIdentity {
        run_id: RunId::new(run_id).unwrap(),
        project: "tests".into(),
        name: name.into(),
        config_json: "{}".into(),
        host: "test".into(),
        rank: 0,
        world_size: 1,
        job: String::new(),
        framework: String::new(),
        started_at: unix_now(),
    }
}

pub fn hello(run_id: &str, token: Option<&str>) -> ToHub {
    ToHub::Hello(Hello {
        protocol: codec::VERSION,
        token: token.map(String::from),
        run: identity(run_id, run_id),
        writer: 7,
        acked_through: 0,
    })
}

/// Writes `text` to `path` and flushes it to the OS.
pub fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.flush().unwrap();
}

/// The status code of a GET with exactly these headers (a WebSocket upgrade when `upgrade`).
pub fn http_status(addr: &str, path: &str, headers: &[(&str, &str)], upgrade: bool) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if upgrade {
        req.push_str(
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        );
    } else {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// Debian's nginx on `port`, proxying HTTP and WebSockets to the `upstream` servers (an
/// nginx `upstream` block's lines, e.g. `server 127.0.0.1:7070;`) as
/// `docs/reverse-proxy.nginx.conf` and `docs/cluster/nginx.conf` do; a connection that
/// cannot reach one server is tried on the next. Killed on drop.
pub struct Nginx {
    child: std::process::Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// What nginx wrote to its access log so far.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn nginx(port: u16, upstream: &str) -> Nginx {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nginx is not installed: scripts/test installs Debian's `nginx` package");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // The sample config's own access-log format (it keeps query strings, and so tokens, out).
    let sample = include_str!("../docs/reverse-proxy.nginx.conf");
    let log_format = sample
        .lines()
        .find(|l| l.starts_with("log_format "))
        .expect("docs/reverse-proxy.nginx.conf has its log_format");
    let conf = format!(
        "worker_processes 1;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n  {log_format}\n  access_log {d}/access.log stepstream_no_query;\n  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
           upstream hubs {{\n{upstream}\n  }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
               proxy_pass http://hubs;\n      proxy_next_upstream error timeout;\n\
               proxy_connect_timeout 2s;\n      proxy_http_version 1.1;\n\
               proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection $connection_upgrade;\n\
               proxy_set_header Host $http_host;\n      proxy_buffering off;\n\
               proxy_read_timeout 1h;\n      client_max_body_size 17m;\n    }}\n  }}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let child = Command::new(bin)
        .args([
            "-p",
            &d.to_string(),
            "-c",
            "nginx.conf",
            "-g",
            "daemon off;",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_for("nginx", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    Nginx {
        child,
        port,
        _dir: dir,
    }
}

/// Runs a command to its end; fails the test with its stderr unless it succeeded.
pub fn succeed(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Stops a child process with `signal` (`"-INT"`, `"-TERM"`), as a user would; fails the
/// test unless it then exits cleanly; returns what it wrote to stderr.
pub fn stop(child: Child, signal: &str) -> String {
    Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// The steps of a `/api/runs/{id}/series` answer.
pub fn series_steps(series: &serde_json::Value) -> Vec<i64> {
    serde_json::from_value(series["steps"].clone()).unwrap()
}
