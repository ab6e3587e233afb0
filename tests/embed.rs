//! The embeddable widget: `examples/embed.html` served from another origin (a static server
//! on another port) in headless Chromium against a real hub; the allow-list, scoped tokens,
//! the iframe page, shared sockets, and how the widget's files are served.

use crate::browser::Browser;
use crate::util::*;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome, Report};

/// `python3 -m http.server` over `examples/`: a page on another origin than the hub.
struct StaticSite {
    child: Child,
    port: u16,
}

impl StaticSite {
    fn start() -> StaticSite {
        let port = free_port();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 for a static server");
        wait_for("the static server", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        StaticSite { child, port }
    }

    /// The example page as `host` serves it (`127.0.0.1` and `localhost` are two origins).
    fn page(&self, host: &str, query: &str) -> String {
        format!("http://{host}:{}/embed.html?{query}", self.port)
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for StaticSite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Streams `steps` steps of loss and lr into `project`, one every `every`.
fn stream(
    hub: &Hub,
    project: &str,
    name: &str,
    token: Option<&str>,
    steps: i64,
    every: Duration,
) -> (String, std::thread::JoinHandle<Report>) {
    let mut options = Options::new(&hub.ws(), project, name);
    options.token = token.map(String::from);
    let run = Collector::start(options).unwrap();
    let id = run.run_id().to_string();
    let handle = std::thread::spawn(move || {
        for step in 0..steps {
            let loss = 2.0 * (-(step as f64) / 300.0).exp() + 0.1;
            run.log(step, &[("loss", loss), ("lr", 1e-3)]);
            run.flush();
            std::thread::sleep(every);
        }
        run.finish(Outcome::Finished)
    });
    (id, handle)
}

/// Each `.chart` of the example page (or `#chart` of `/embed`): state, points, drawn.
const CHARTS: &str = "[...document.querySelectorAll('.chart, #chart')].map(e => ({ \
    state: e.dataset.state || '', points: +(e.dataset.points || 0), \
    drawn: +(e.dataset.drawn || 0), socket: e.dataset.socket || '', \
    message: e.dataset.message || '', first: +(e.dataset.firstDrawMs || 0), \
    ink: (() => { const c = e.querySelector('canvas'); if (!c || !c.width) return 0; \
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; \
      for (let i = 0; i < d.length; i += 16) if (d[i] < 200 || d[i+2] < 200) n++; return n; })() }))";

fn charts(page: &mut Browser) -> Vec<serde_json::Value> {
    page.eval(CHARTS).as_array().cloned().unwrap_or_default()
}

/// Waits until every chart satisfies `ok`; returns them.
fn wait_charts(
    page: &mut Browser,
    what: &str,
    n: usize,
    ok: impl Fn(usize, &serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut last = Vec::new();
    for _ in 0..300 {
        last = charts(page);
        if last.len() == n && last.iter().enumerate().all(|(i, c)| ok(i, c)) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: the charts are {last:#?}");
}

#[test]
fn widgets_on_another_origin_draw_live_share_one_socket_and_survive_a_hub_restart() {
    let site = StaticSite::start();
    let mut hub = Hub::start(&["--allow-origin", &site.origin()]);
    let (a, ta) = stream(
        &hub,
        "vision",
        "resnet",
        None,
        1500,
        Duration::from_millis(20),
    );
    let (b, tb) = stream(&hub, "vision", "vit", None, 1500, Duration::from_millis(20));
    let mut page = Browser::open(&site.page(
        "127.0.0.1",
        &format!("hub=http://{}&run={a},{b}&metric=loss", hub.addr()),
    ));
    let first = wait_charts(&mut page, "both charts live and drawn", 2, |_, c| {
        c["state"] == "live" && c["points"].as_u64() > Some(0) && c["drawn"].as_u64() > Some(0)
    });
    for c in &first {
        assert!(
            c["ink"].as_u64() > Some(50),
            "a curve is on the canvas: {c}"
        );
        eprintln!("first draw at {} ms after the page started", c["first"]);
    }
    assert_eq!(
        first[0]["socket"], first[1]["socket"],
        "one socket for both"
    );
    assert_eq!(page.eval("stepstream.sockets()"), 1);
    // Each moves on its own as its run streams.
    let before: Vec<u64> = first
        .iter()
        .map(|c| c["points"].as_u64().unwrap())
        .collect();
    wait_charts(&mut page, "both charts growing", 2, |i, c| {
        c["points"].as_u64().unwrap() > before[i] + 20
    });

    // A page that builds its own element: the JS call, both runs overlaid, two metrics,
    // on the same socket.
    let own = page.eval(&format!(
        "(async () => {{ const el = document.createElement('div'); el.id = 'own'; \
         document.body.appendChild(el); const w = await stepstream.chart(el, \
         {{ run: ['{a}', '{b}'], metric: ['loss', 'lr'], smoothing: 0.5, height: 200 }}); \
         for (let i = 0; i < 100 && w.state() != 'live'; i++) \
           await new Promise(r => setTimeout(r, 100)); \
         return {{ state: w.state(), points: w.points(), socket: el.dataset.socket, \
                   sockets: stepstream.sockets() }}; }})()"
    ));
    assert_eq!(own["state"], "live", "{own}");
    assert!(own["points"].as_f64() > Some(0.0));
    assert_eq!(own["socket"], first[0]["socket"]);
    assert_eq!(own["sockets"], 1);
    page.eval("document.getElementById('own').remove()");

    // The hub goes away: each box says so and when it retries; then it is live again.
    hub.kill9();
    let down = wait_charts(&mut page, "unreachable shown", 2, |_, c| {
        c["state"] == "unreachable"
    });
    assert!(down[0]["message"].as_str().unwrap().contains("retrying in"));
    hub.restart();
    let back = wait_charts(&mut page, "live again", 2, |_, c| c["state"] == "live");
    wait_charts(&mut page, "growing after the restart", 2, |i, c| {
        c["points"].as_u64().unwrap() > back[i]["points"].as_u64().unwrap() + 20
    });
    assert_eq!(page.eval("stepstream.sockets()"), 1);
    for t in [ta, tb] {
        let report = t.join().unwrap();
        assert_eq!(report.refused + report.lost, 0, "{report:?}");
    }
    // Across the outage, each point exactly once: every step, none twice.
    wait_charts(&mut page, "every point once", 2, |_, c| {
        c["state"] == "finished" && c["points"] == 1500
    });
    // Elements removed: their widgets stop and the socket closes with the last.
    page.eval("document.querySelectorAll('.chart').forEach(e => e.remove())");
    page.wait(
        "the socket closed",
        Duration::from_secs(5),
        "stepstream.sockets() == 0",
    );
}

#[test]
fn a_page_from_an_origin_not_allowed_is_refused_and_the_hub_logs_why() {
    let site = StaticSite::start();
    let hub = Hub::start_logged(&["--allow-origin", &site.origin()]);
    let (a, _t) = stream(
        &hub,
        "vision",
        "resnet",
        None,
        200,
        Duration::from_millis(20),
    );
    // `localhost` is another origin than the allowed `127.0.0.1`.
    let mut page = Browser::open(&site.page(
        "localhost",
        &format!("hub=http://{}&run={a}&metric=loss", hub.addr()),
    ));
    let refused = wait_charts(&mut page, "refused shown", 1, |_, c| {
        c["state"] == "refused"
    });
    let message = refused[0]["message"].as_str().unwrap();
    assert!(message.contains("allow-list"), "{message}");
    assert_eq!(refused[0]["points"], 0);
    let log = hub.logged();
    assert!(
        log.contains("request refused") && log.contains(&format!("http://localhost:{}", site.port)),
        "the hub says why: {log}"
    );
    // A run that does not exist, from an allowed page: the box says so and waits.
    page.navigate(&site.page(
        "127.0.0.1",
        &format!("hub=http://{}&run=no-such-run&metric=loss", hub.addr()),
    ));
    let missing = wait_charts(&mut page, "not found shown", 1, |_, c| {
        c["state"] == "not-found"
    });
    assert!(missing[0]["message"]
        .as_str()
        .unwrap()
        .contains("no-such-run"));
}

#[test]
fn a_scoped_read_token_issued_to_a_running_hub_shows_its_runs_and_refuses_others() {
    let site = StaticSite::start();
    let hub = Hub::start_with_tokens("", &["--allow-origin", &site.origin()]);
    let tokens = hub.tokens_file();
    let (a, _ta) = stream(
        &hub,
        "vision",
        "resnet",
        Some("w"),
        1500,
        Duration::from_millis(20),
    );
    let (b, _tb) = stream(
        &hub,
        "nlp",
        "bert",
        Some("w"),
        1500,
        Duration::from_millis(20),
    );
    // Issued while the hub runs, as an operator would.
    let out = succeed(
        Command::new(env!("CARGO_BIN_EXE_stepstream"))
            .args([
                "token",
                "--tokens",
                tokens.to_str().unwrap(),
                "--project",
                "vision",
            ])
            .args(["--label", "the vision team's wiki"]),
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(token.len() >= 40, "{token}");
    // A tokens file it creates is the owner's alone; a scope is required.
    let fresh = hub.dir.path().join("new-tokens.toml");
    let made = Command::new(env!("CARGO_BIN_EXE_stepstream"))
        .args(["token", "--tokens", fresh.to_str().unwrap(), "--run", "r1"])
        .output()
        .unwrap();
    assert!(made.status.success());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let unscoped = Command::new(env!("CARGO_BIN_EXE_stepstream"))
        .args(["token", "--tokens", fresh.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!unscoped.status.success());
    assert!(String::from_utf8_lossy(&unscoped.stderr).contains("--project"));
    wait_for(
        "the hub to take the new token",
        Duration::from_secs(10),
        || (http_get(&hub.addr(), "/api/runs", Some(&token)).status == 200).then_some(()),
    );

    let mut page = Browser::open(&site.page(
        "127.0.0.1",
        &format!(
            "hub=http://{}&run={a},{b}&metric=loss&token={token}",
            hub.addr()
        ),
    ));
    let shown = wait_charts(&mut page, "one live, one refused", 2, |_, c| {
        c["state"] == "live" || c["state"] == "refused"
    });
    assert_eq!(shown[0]["state"], "live", "{shown:#?}");
    assert!(shown[0]["points"].as_u64() > Some(0));
    assert_eq!(shown[1]["state"], "refused", "{shown:#?}");
    assert!(shown[1]["message"]
        .as_str()
        .unwrap()
        .contains("may not read"));
    assert_eq!(
        shown[1]["points"], 0,
        "no point of another project reaches the page"
    );
    // Without a token, nothing.
    page.navigate(&site.page(
        "127.0.0.1",
        &format!("hub=http://{}&run={a}&metric=loss", hub.addr()),
    ));
    let bare = wait_charts(&mut page, "refused without a token", 1, |_, c| {
        c["state"] == "refused"
    });
    assert!(
        bare[0]["message"].as_str().unwrap().contains("token"),
        "{bare:#?}"
    );
}

#[test]
fn the_iframe_page_draws_and_only_allowed_origins_may_frame_it() {
    let site = StaticSite::start();
    // The hub judges staleness, for the widget as for the page and the API.
    let hub = Hub::start(&["--allow-origin", &site.origin(), "--stale-after", "2"]);
    let (a, _t) = stream(
        &hub,
        "vision",
        "resnet",
        None,
        1500,
        Duration::from_millis(20),
    );
    let path = format!("/embed?run={a}&metric=loss,lr&smoothing=0.6&theme=dark");
    let mut page = Browser::open(&format!("http://{}{path}", hub.addr()));
    let drawn = wait_charts(&mut page, "the iframe page live", 1, |_, c| {
        c["state"] == "live" && c["drawn"].as_u64() > Some(0)
    });
    assert!(drawn[0]["ink"].as_u64() > Some(50));
    let page_response = http_request(&hub.addr(), "GET", &path, &[]);
    assert_eq!(page_response.status, 200);
    assert_eq!(
        page_response.headers["content-security-policy"],
        format!("frame-ancestors 'self' {}", site.origin())
    );
    // The web app itself may be framed by nobody else, and each page keeps its policy by
    // whichever path it is asked for (`/index.html`, `/embed.html` once had none).
    for (path, policy) in [
        ("/", "frame-ancestors 'self'".to_string()),
        ("/index.html", "frame-ancestors 'self'".to_string()),
        (
            "/embed.html",
            format!("frame-ancestors 'self' {}", site.origin()),
        ),
    ] {
        let page = http_request(&hub.addr(), "GET", path, &[]);
        assert_eq!(page.status, 200, "{path}");
        assert_eq!(
            page.headers.get("content-security-policy"),
            Some(&policy),
            "{path}"
        );
    }

    // Not live: the history once, then no more points, and the box says so.
    page.navigate(&format!("http://{}/embed?run={a}&live=false", hub.addr()));
    let snap = wait_charts(&mut page, "a snapshot", 1, |_, c| {
        c["state"] == "snapshot" && c["points"].as_u64() > Some(0)
    });
    assert_eq!(
        page.eval("stepstream.sockets()"),
        0,
        "a snapshot lets go of its socket"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(charts(&mut page)[0]["points"], snap[0]["points"]);

    // A run that went quiet (alive, not finished) is shown stale once the hub says so.
    let quiet = Collector::start(Options::new(&hub.ws(), "vision", "quiet")).unwrap();
    for step in 0..20 {
        quiet.log(step, &[("loss", 1.0)]);
    }
    quiet.flush();
    let q = quiet.run_id().to_string();
    page.navigate(&format!("http://{}/embed?run={q}", hub.addr()));
    let stale = wait_charts(&mut page, "stale shown", 1, |_, c| c["state"] == "stale");
    assert_eq!(stale[0]["points"], 20);
    assert!(stale[0]["message"]
        .as_str()
        .unwrap()
        .contains("no data for"));
    quiet.log(20, &[("loss", 0.5)]);
    quiet.flush();
    wait_charts(&mut page, "live again on a new point", 1, |_, c| {
        c["state"] == "live"
    });
    quiet.finish(Outcome::Finished);
    wait_charts(&mut page, "finished shown", 1, |_, c| {
        c["state"] == "finished"
    });
}

#[test]
fn widget_files_are_public_compressed_and_cached_and_the_api_follows_the_allow_list() {
    let hub = Hub::start(&["--allow-origin", "https://wiki.example"]);
    let Response {
        status,
        headers: h,
        body: js,
    } = http_request(&hub.addr(), "GET", "/embed.js", &[]);
    assert_eq!(status, 200);
    assert_eq!(h["access-control-allow-origin"], "*");
    assert_eq!(h["cache-control"], "no-cache");
    let js = String::from_utf8(js).unwrap();
    let at = js.find("embed-").expect("the loader names the wasm");
    let wasm = &js[at..at + "embed-".len() + 12 + ".wasm".len()];
    // Revalidation: the same entity tag is not sent again.
    let Response {
        status,
        headers: _,
        body,
    } = http_request(
        &hub.addr(),
        "GET",
        "/embed.js",
        &[("If-None-Match", &h["etag"])],
    );
    assert!(status == 304 && body.is_empty());
    // Compressed as the browser accepts; the hashed wasm is kept for a year.
    let Response {
        status: _,
        headers: raw,
        body: raw_body,
    } = http_request(&hub.addr(), "GET", &format!("/{wasm}"), &[]);
    assert!(!raw.contains_key("content-encoding"));
    assert_eq!(raw["content-type"], "application/wasm");
    assert!(raw["cache-control"].contains("immutable"));
    let Response {
        status: _,
        headers: gz,
        body: gz_body,
    } = http_request(
        &hub.addr(),
        "GET",
        &format!("/{wasm}"),
        &[("Accept-Encoding", "gzip")],
    );
    assert_eq!(gz["content-encoding"], "gzip");
    let Response {
        status: _,
        headers: br,
        body: br_body,
    } = http_request(
        &hub.addr(),
        "GET",
        &format!("/{wasm}"),
        &[
            ("Accept-Encoding", "gzip, br"),
            ("Origin", "https://evil.example"),
        ],
    );
    assert_eq!(br["content-encoding"], "br");
    assert_eq!(br["access-control-allow-origin"], "*", "the code is public");
    eprintln!(
        "widget wasm: {} bytes, gzip {}, brotli {}",
        raw_body.len(),
        gz_body.len(),
        br_body.len()
    );
    assert!(br_body.len() < raw_body.len() / 2 && gz_body.len() < raw_body.len() / 2);

    // Using the hub is not: an allowed origin gets CORS headers and its preflight answered,
    // another a refusal it can read, and nothing else.
    let Response {
        status,
        headers: h,
        body: _,
    } = http_request(
        &hub.addr(),
        "GET",
        "/api/runs",
        &[("Origin", "https://wiki.example")],
    );
    assert_eq!(status, 200);
    assert_eq!(h["access-control-allow-origin"], "https://wiki.example");
    let Response {
        status,
        headers: h,
        body: _,
    } = http_request(
        &hub.addr(),
        "OPTIONS",
        "/api/runs",
        &[
            ("Origin", "https://wiki.example"),
            ("Access-Control-Request-Method", "GET"),
            ("Access-Control-Request-Headers", "authorization"),
        ],
    );
    assert_eq!(status, 204);
    assert_eq!(h["access-control-allow-headers"], "authorization");
    let Response {
        status,
        headers: h,
        body,
    } = http_request(
        &hub.addr(),
        "GET",
        "/api/runs",
        &[("Origin", "https://evil.example")],
    );
    assert_eq!(status, 403);
    assert_eq!(h["access-control-allow-origin"], "https://evil.example");
    assert!(String::from_utf8_lossy(&body).contains("allow-list"));
    assert!(!String::from_utf8_lossy(&body).contains("runs\":["));
}

/// The widget's first draw (not a test: `#[ignore]`, numbers printed), on a release build:
///
/// ```sh
/// cargo test --release --test e2e bench_embed -- --ignored --nocapture
/// ```
///
/// The example page on another origin, one widget over a finished run of 20,000 steps:
/// milliseconds from the page's start to the first curve, cold (nothing cached) and warm
/// (`embed.js` revalidated, the wasm from the cache), beside the page's reference (ms to sort
/// 1,000,000 floats, `bench_web`'s) and the ratio against it.
#[test]
#[ignore]
fn bench_embed_first_draw() {
    let site = StaticSite::start();
    let hub = Hub::start(&["--allow-origin", &site.origin()]);
    let run = Collector::start(Options::new(&hub.ws(), "bench", "long")).unwrap();
    for step in 0..20_000 {
        run.log(step, &[("loss", 2.0 * (-(step as f64) / 5000.0).exp())]);
    }
    let id = run.run_id().to_string();
    assert!(run.finish(Outcome::Finished).delivered);
    let url = site.page("127.0.0.1", &format!("hub=http://{}&run={id}", hub.addr()));
    let mut page = Browser::open(&url);
    let mut times = Vec::new();
    for k in 0..6 {
        if k > 0 {
            page.navigate(&url);
        }
        let c = wait_charts(&mut page, "drawn", 1, |_, c| {
            c["first"].as_f64() > Some(0.0)
        });
        times.push(c[0]["first"].as_f64().unwrap());
    }
    let reference = crate::bench_web::reference_ms(&mut page);
    let cold = times[0];
    let mut warm = times[1..].to_vec();
    warm.sort_by(f64::total_cmp);
    let warm = warm[warm.len() / 2];
    println!(
        "embed first draw: cold {cold:.0} ms, warm (median of 5) {warm:.0} ms; reference \
         (sort 1M floats) {reference:.0} ms; ratios {:.1} / {:.1}",
        cold / reference,
        warm / reference
    );
}

/// `data-panel`: a widget shows a run's console (its tail, then live lines), or the newest
/// text or image sample of a key, from another origin, over the same shared socket.
#[test]
fn widget_panels_show_a_runs_console_text_and_image_live() {
    use stepstream_protocol::{ImageFormat, ItemBody, RunId, Stream};
    let site = StaticSite::start();
    let hub = Hub::start(&["--allow-origin", &site.origin()]);
    let mut o = Options::new(&hub.ws(), "embed", "panels");
    o.run_id = Some(RunId::new("panels").unwrap());
    let run = Collector::start(o).unwrap();
    let line = |text: &str| ItemBody::Line {
        stream: Stream::Stdout,
        text: text.into(),
    };
    for step in 0..50i64 {
        run.log(step, &[("loss", 1.0)]);
        run.log_item("", line(&format!("history line {step}")));
    }
    run.log_item_at(49, 1.0, "generation", ItemBody::Text("old text".into()));
    run.flush();
    wait_for("history stored", Duration::from_secs(20), || {
        (run.acknowledged() == 50).then_some(())
    });
    let base = format!("hub=http://{}&run=panels", hub.addr());
    let mut console = Browser::open(&site.page("127.0.0.1", &format!("{base}&panel=console")));
    console.wait(
        "the console's tail",
        Duration::from_secs(20),
        "(() => { const e = document.querySelector('[data-stepstream-run]'); \
         return e && e.dataset.lines == '50' && e.textContent.includes('history line 49'); })()",
    );
    let mut text =
        Browser::open(&site.page("127.0.0.1", &format!("{base}&panel=text&key=generation")));
    text.wait(
        "the newest text",
        Duration::from_secs(20),
        "(() => { const e = document.querySelector('[data-stepstream-run] div[data-panel=text]'); \
         return e && e.textContent == 'old text'; })()",
    );
    let mut image =
        Browser::open(&site.page("127.0.0.1", &format!("{base}&panel=image&key=picture")));
    // Live: a line, a newer text and an image arrive while the pages are open.
    std::thread::sleep(Duration::from_millis(500));
    run.log(50, &[("loss", 0.5)]);
    run.log_item("", line("a live line"));
    run.log_item_at(50, 2.0, "generation", ItemBody::Text("new text".into()));
    let raw = stepstream_collector::image::RawImage {
        width: 3,
        height: 2,
        channels: 1,
        pixels: vec![0, 50, 100, 150, 200, 250],
        format: ImageFormat::Png,
        quality: 90,
        caption: "gray".into(),
    };
    run.log_image_at(50, 2.0, "picture", raw);
    run.flush();
    console.wait(
        "the live line",
        Duration::from_secs(10),
        "document.querySelector('[data-stepstream-run]').textContent.includes('a live line')",
    );
    text.wait(
        "the newer text",
        Duration::from_secs(10),
        "document.querySelector('[data-stepstream-run] div[data-panel=text]').textContent == 'new text'",
    );
    image.wait(
        "the image, loaded from the hub",
        Duration::from_secs(10),
        "(() => { const i = document.querySelector('[data-stepstream-run] div[data-panel=image] img'); \
         return i && i.complete && i.naturalWidth == 3 && i.naturalHeight == 2; })()",
    );
    run.finish(Outcome::Finished);
}
