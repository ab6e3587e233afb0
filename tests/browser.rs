//! Headless Chromium (Debian's), driven over the DevTools protocol on a real WebSocket.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct Browser {
    child: Child,
    rt: tokio::runtime::Runtime,
    ws: Ws,
    session: String,
    next_id: u64,
    loaded: bool,
    _profile: tempfile::TempDir,
}

/// Where screenshots are kept as test artefacts.
pub fn artefacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn chromium() -> String {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if std::path::Path::new(c).exists() {
            return c.to_string();
        }
    }
    panic!("Chromium is not installed: scripts/test installs Debian's `chromium` package");
}

impl Browser {
    /// Starts Chromium and opens `url` in a 1400x900 page.
    pub fn open(url: &str) -> Browser {
        Browser::open_scaled(url, 1.0)
    }

    /// Like [`Browser::open`] on a screen of `scale` device pixels per CSS pixel (HiDPI).
    pub fn open_scaled(url: &str, scale: f64) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1400,900",
                "--enable-logging=stderr",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // The page's console, for a failing test's log.
                if line.contains(":CONSOLE") {
                    eprintln!("[page] {line}");
                }
                if !sent {
                    if let Some(i) = line.find("ws://") {
                        let _ = tx.send(line[i..].trim().to_string());
                        sent = true;
                    }
                }
            }
        });
        let endpoint = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium printed its DevTools address");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ws, _) = rt
            .block_on(tokio_tungstenite::connect_async(endpoint))
            .unwrap();
        let mut b = Browser {
            child,
            rt,
            ws,
            session: String::new(),
            next_id: 0,
            loaded: false,
            _profile: profile,
        };
        let target = b.call_browser("Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = b.call_browser(
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b.call("Page.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1400, "height": 900, "deviceScaleFactor": scale, "mobile": false }),
        );
        b.navigate(url);
        b
    }

    /// Reads DevTools messages until `done` accepts one; notes page loads on the way.
    fn read_until(&mut self, what: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
        let ws = &mut self.ws;
        let loaded = &mut self.loaded;
        self.rt.block_on(async {
            loop {
                let next = tokio::time::timeout(Duration::from_secs(30), ws.next())
                    .await
                    .unwrap_or_else(|_| panic!("no answer from chromium to {what}"))
                    .expect("devtools socket open")
                    .unwrap();
                let Message::Text(text) = next else { continue };
                let v: Value = serde_json::from_str(&text).unwrap();
                if v["method"] == "Page.loadEventFired" {
                    *loaded = true;
                }
                if done(&v) {
                    return v;
                }
            }
        })
    }

    fn send(&mut self, method: &str, params: Value, session: Option<String>) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let ws = &mut self.ws;
        self.rt
            .block_on(ws.send(Message::Text(msg.to_string().into())))
            .unwrap();
        let v = self.read_until(method, |v| v["id"] == id);
        if let Some(e) = v.get("error") {
            panic!("{method} failed: {e}");
        }
        v["result"].clone()
    }

    fn call_browser(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, None)
    }

    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.send(method, params, Some(s))
    }

    /// Loads `url` and waits for its load event (an evaluation sent mid-navigation may
    /// never be answered).
    pub fn navigate(&mut self, url: &str) {
        self.loaded = false;
        self.call("Page.navigate", json!({ "url": url }));
        if !self.loaded {
            self.read_until("the page load", |v| v["method"] == "Page.loadEventFired");
        }
        self.loaded = true;
    }

    /// Evaluates `js` in the page (awaiting a promise) and returns its JSON value.
    pub fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": js, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("page threw for {js}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `js` until it returns something truthy; returns it.
    pub fn wait(&mut self, what: &str, limit: Duration, js: &str) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.eval(js);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            if Instant::now() > deadline {
                let shot = self.screenshot(&format!("timeout-{}", what.replace(' ', "-")));
                panic!(
                    "timed out waiting for {what} (last: {v}); screenshot {}",
                    shot.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Saves a PNG of the page under the artefacts folder; returns its path.
    pub fn screenshot(&mut self, name: &str) -> PathBuf {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64_decode(r["data"].as_str().unwrap());
        let path = artefacts().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Moves the mouse to page coordinates (fires the page's mousemove handlers).
    pub fn mouse_move(&mut self, x: f64, y: f64) {
        self.call(
            "Input.dispatchMouseEvent",
            json!({ "type": "mouseMoved", "x": x, "y": y }),
        );
    }

    /// Resizes the page's viewport (CSS pixels).
    pub fn resize(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        );
    }

    /// Lets the page download files into `dir`.
    pub fn allow_downloads(&mut self, dir: &std::path::Path) {
        self.call_browser(
            "Browser.setDownloadBehavior",
            json!({ "behavior": "allow", "downloadPath": dir.display().to_string() }),
        );
    }

    /// One notch of the wheel at `(x, y)`: negative `delta_y` zooms in.
    pub fn wheel(&mut self, x: f64, y: f64, delta_y: f64) {
        self.call(
            "Input.dispatchMouseEvent",
            json!({ "type": "mouseWheel", "x": x, "y": y, "deltaX": 0, "deltaY": delta_y }),
        );
    }

    /// Presses `button` ("left", "middle") at `from`, moves to `to` in steps, releases;
    /// `modifiers` is DevTools' bit set (8: Shift).
    pub fn drag(&mut self, from: (f64, f64), to: (f64, f64), button: &str, modifiers: u32) {
        let buttons = if button == "middle" { 4 } else { 1 };
        self.call(
            "Input.dispatchMouseEvent",
            json!({ "type": "mousePressed", "x": from.0, "y": from.1, "button": button,
                    "buttons": buttons, "clickCount": 1, "modifiers": modifiers }),
        );
        for i in 1..=8 {
            let t = i as f64 / 8.0;
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": "mouseMoved", "x": from.0 + (to.0 - from.0) * t,
                        "y": from.1 + (to.1 - from.1) * t, "button": button, "buttons": buttons,
                        "modifiers": modifiers }),
            );
        }
        self.call(
            "Input.dispatchMouseEvent",
            json!({ "type": "mouseReleased", "x": to.0, "y": to.1, "button": button,
                    "buttons": 0, "clickCount": 1, "modifiers": modifiers }),
        );
    }

    /// A double click at `(x, y)`.
    pub fn double_click(&mut self, x: f64, y: f64) {
        for count in [1, 2] {
            for kind in ["mousePressed", "mouseReleased"] {
                self.call(
                    "Input.dispatchMouseEvent",
                    json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": count }),
                );
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => 0,
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | (val(c) << (18 - 6 * i)));
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}
