//! A run's console lines and samples: streamed with its records (acknowledged, resent after
//! a hub restart), pushed to viewers, stored apart and capped, searched and downloaded over
//! the API, and bad ones refused by name while the rest go on.

use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

fn line(text: &str, stream: Stream) -> ItemBody {
    ItemBody::Line {
        stream,
        text: text.into(),
    }
}

fn console(hub: &Hub, run: &str, query: &str) -> serde_json::Value {
    hub.json(&format!("/api/runs/{run}/console?{query}"))
}

fn texts(answer: &serde_json::Value) -> Vec<String> {
    answer["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap().to_string())
        .collect()
}

/// Lines logged at steps, with a viewer watching: the viewer gets them live in order, the API
/// finds them by step window and regular expression, the tail is the last ones, and a hub
/// killed and restarted mid-run loses none that was acknowledged and repeats none.
#[test]
fn console_lines_arrive_live_in_order_and_survive_a_hub_restart() {
    let mut hub = Hub::start(&[]);
    let mut viewer = Viewer::connect(&hub);
    let mut o = Options::new(&hub.ws(), "p", "console");
    o.run_id = Some(RunId::new("con-1").unwrap());
    let run = Collector::start(o).unwrap();
    for step in 0..500i64 {
        run.log(step, &[("loss", 1.0 / (step + 1) as f64)]);
        let stream = if step % 10 == 0 {
            Stream::Stderr
        } else {
            Stream::Stdout
        };
        assert!(run.log_item("", line(&format!("step {step} done"), stream)));
        if step == 0 {
            viewer.subscribe(&[RunId::new("con-1").unwrap()], None);
        }
        if step == 250 {
            // Everything so far acknowledged, then the hub dies; the rest waits and is resent.
            wait_for("acks", Duration::from_secs(10), || {
                (run.acknowledged() == 251).then_some(())
            });
            hub.kill9();
            hub.restart();
            viewer = Viewer::connect(&hub);
            viewer.subscribe(&[RunId::new("con-1").unwrap()], None);
        }
    }
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
    assert_eq!(report.items_acked, 500, "{report:?}");
    let all = console(&hub, "con-1", "from_step=0&limit=100000");
    let got = texts(&all);
    let want: Vec<String> = (0..500).map(|s| format!("step {s} done")).collect();
    assert_eq!(got, want, "every line once, in order");
    assert_eq!(all["total"], 500);
    assert_eq!(all["dropped"], 0);
    // Steps: each line is at the step logged before it.
    let steps: Vec<i64> = all["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, (0..500).collect::<Vec<_>>());
    // A window, a search, a stream, the tail.
    assert_eq!(
        texts(&console(&hub, "con-1", "from_step=100&to_step=102")),
        ["step 100 done", "step 101 done", "step 102 done"]
    );
    assert_eq!(
        texts(&console(&hub, "con-1", "q=step%2049%5Cd%20done")),
        (490..500)
            .map(|s| format!("step {s} done"))
            .collect::<Vec<_>>()
    );
    let errs = texts(&console(&hub, "con-1", "stream=stderr&from_step=0"));
    assert_eq!(errs.len(), 50);
    assert!(errs.iter().all(|t| t.ends_with("0 done")), "{errs:?}");
    let tail = console(&hub, "con-1", "limit=3");
    assert_eq!(
        texts(&tail),
        ["step 497 done", "step 498 done", "step 499 done"]
    );
    assert_eq!(tail["more"], true);
    // A bad pattern is a clear 400.
    let bad = hub.get("/api/runs/con-1/console?q=(unclosed");
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("regular expression"), "{}", bad.text());
    // The viewer connected after the restart saw the lines logged after it, live, in order.
    viewer.pump(Duration::from_secs(5), |v| {
        v.runs
            .get(&RunId::new("con-1").unwrap())
            .is_some_and(|s| s.items.len() >= 249)
    });
    let seen = &viewer.runs[&RunId::new("con-1").unwrap()];
    let live: Vec<String> = seen
        .items
        .iter()
        .filter_map(|i| match &i.body {
            ItemBody::Line { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert!(live.len() >= 249, "{} lines live", live.len());
    let first: usize = live[0].split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(
        live,
        (first..500)
            .map(|s| format!("step {s} done"))
            .collect::<Vec<_>>()
    );
    // The text download: every line, stderr marked.
    let text = hub.get("/api/runs/con-1/console?format=text").text();
    assert_eq!(text.lines().count(), 500);
    assert!(
        text.starts_with("[stderr] step 0 done\nstep 1 done\n"),
        "{}",
        &text[..80]
    );
}

/// Past the hub's `console_lines` the oldest lines go, and every answer says how many; the
/// records of the run are untouched.
#[test]
fn a_console_over_its_cap_keeps_the_newest_lines_and_counts_the_dropped() {
    let hub = Hub::start(&["--limit", "console_lines=1000"]);
    let mut o = Options::new(&hub.ws(), "p", "chatty");
    o.run_id = Some(RunId::new("chatty").unwrap());
    let run = Collector::start(o).unwrap();
    for step in 0..3000i64 {
        run.log(step, &[("loss", 1.0)]);
        run.log_item("", line(&format!("line {step}"), Stream::Stdout));
        if step % 700 == 0 {
            run.flush();
        }
    }
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered && report.items_acked == 3000, "{report:?}");
    let all = console(&hub, "chatty", "from_step=0&limit=100000");
    assert_eq!(all["total"], 3000);
    assert_eq!(all["kept"], 1000);
    assert_eq!(all["dropped"], 2000);
    assert_eq!(
        texts(&all),
        (2000..3000)
            .map(|s| format!("line {s}"))
            .collect::<Vec<_>>()
    );
    let text = hub.get("/api/runs/chatty/console?format=text").text();
    assert!(
        text.starts_with("[stepstream: the first 2000 lines were dropped"),
        "{}",
        &text[..120]
    );
    assert_eq!(hub.json("/api/runs/chatty")["records"], 3000);
}

/// A text sample, a table, and bad samples (too big, a ragged table, a NUL): the bad ones are
/// counted and named, never sent; everything else of the run, scalars included, is stored.
#[test]
fn samples_are_stored_by_key_and_bad_ones_are_refused_by_name_while_the_run_goes_on() {
    let hub = Hub::start(&["--limit", "item_bytes=100000"]);
    let mut o = Options::new(&hub.ws(), "p", "samples");
    o.run_id = Some(RunId::new("samples").unwrap());
    let run = Collector::start(o).unwrap();
    run.wait_welcome(Duration::from_secs(10)).unwrap();
    for step in 0..20i64 {
        run.log(step, &[("loss", step as f64)]);
        run.log_item_at(
            step,
            unix_now(),
            "generation",
            ItemBody::Text(format!("text at {step}")),
        );
    }
    run.log_item_at(
        19,
        unix_now(),
        "rollouts",
        ItemBody::Table {
            columns: vec!["prompt".into(), "reward".into()],
            rows: vec![
                vec![Cell::Text("2+2=".into()), Cell::Number(0.5)],
                vec![Cell::Text("nan?".into()), Cell::Number(f64::NAN)],
            ],
        },
    );
    // Too big for this hub, ragged, a NUL: refused before sending.
    run.log_item("generation", ItemBody::Text("x".repeat(200_000)));
    run.log_item(
        "rollouts",
        ItemBody::Table {
            columns: vec!["a".into(), "b".into()],
            rows: vec![vec![Cell::Number(1.0)]],
        },
    );
    run.log_item("generation", ItemBody::Text("a\0b".into()));
    // The last refusal is named.
    wait_for("the refusals", Duration::from_secs(5), || {
        run.last_error().filter(|e| e.contains("NUL"))
    });
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
    assert_eq!(report.items_acked, 21, "{report:?}");
    assert_eq!(report.items_refused, 3, "{report:?}");
    let gen = hub.json("/api/runs/samples/samples?key=generation&from_step=0");
    let bodies: Vec<&str> = gen["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        bodies,
        (0..20).map(|s| format!("text at {s}")).collect::<Vec<_>>()
    );
    let table = hub.json("/api/runs/samples/samples?key=rollouts");
    let t = &table["samples"][0];
    assert_eq!(t["kind"], "table");
    assert_eq!(
        t["body"]["columns"],
        serde_json::json!(["prompt", "reward"])
    );
    assert_eq!(t["body"]["rows"][0], serde_json::json!(["2+2=", 0.5]));
    assert_eq!(t["body"]["rows"][1][1], "NaN");
    assert_eq!(hub.json("/api/runs/samples")["records"], 20);
    // Samples are no console lines.
    assert_eq!(console(&hub, "samples", "")["total"], 0);
}

/// A raw collector that sends an item past the hub's limits has its batch refused with the
/// limit's name (a collector of this build never sends one: it checks first).
#[test]
fn a_batch_with_an_item_over_the_limit_is_refused_naming_the_limit() {
    let hub = Hub::start(&["--limit", "item_bytes=1000"]);
    let mut c = RawCollector::connect(&hub);
    c.send(hello("raw-items", None));
    assert!(matches!(c.recv(), Some(FromHub::Welcome(_))));
    c.send(ToHub::Batch(Batch {
        seq: 1,
        records: Vec::new(),
        items: vec![Item {
            step: 0,
            wall_time: 1.0,
            key: String::new(),
            body: line(&"y".repeat(2000), Stream::Stdout),
        }],
    }));
    match c.recv() {
        Some(FromHub::HubError(e)) => {
            assert_eq!(e.code, ErrorCode::Limit, "{e:?}");
            assert!(e.message.contains("item_bytes"), "{e:?}");
        }
        other => panic!("expected a limit error, got {other:?}"),
    }
}

/// The page's Console panel: the tail on opening, live lines as they come (following the
/// end), a regular-expression search and a stream filter, a click on a line setting the
/// charts' crosshair at its step, and a click on a chart scrolling the console to the
/// nearest point's step, older lines read when needed.
#[test]
fn the_console_panel_follows_live_searches_and_links_with_the_charts() {
    use crate::browser::Browser;
    let hub = Hub::start(&[]);
    let mut o = Options::new(&hub.ws(), "web", "talker");
    o.run_id = Some(RunId::new("talker").unwrap());
    let run = Collector::start(o).unwrap();
    // History: 3000 steps, a line each (the page reads the last 2000 at first).
    for step in 0..3000i64 {
        run.log(step, &[("loss", 1.0 / (step + 1) as f64)]);
        let (text, stream) = if step % 100 == 0 {
            (format!("WARNING grad spike at {step}"), Stream::Stderr)
        } else {
            (format!("step {step} ok"), Stream::Stdout)
        };
        run.log_item("", line(&text, stream));
    }
    run.flush();
    wait_for("history stored", Duration::from_secs(20), || {
        (run.acknowledged() == 3000).then_some(())
    });
    let mut page = Browser::open(&format!("http://{}/?lang=en&runs=talker", hub.addr()));
    page.wait(
        "the tail in the console",
        Duration::from_secs(20),
        "document.querySelectorAll('.console-lines .line').length == 2000",
    );
    let last = page.eval(
        "(() => { const l = [...document.querySelectorAll('.console-lines .line')]; \
         return l[l.length - 1].querySelector('.text').textContent; })()",
    );
    assert_eq!(last, "step 2999 ok");
    // Live: new lines arrive and the panel stays at the end.
    for step in 3000..3020i64 {
        run.log(step, &[("loss", 0.5)]);
        run.log_item("", line(&format!("live line {step}"), Stream::Stdout));
    }
    run.flush();
    page.wait(
        "live lines at the end, followed",
        Duration::from_secs(10),
        "(() => { const box = document.querySelector('.console-lines'); \
         const l = [...box.querySelectorAll('.line')]; \
         return l[l.length - 1].textContent.includes('live line 3019') && \
         box.scrollTop + box.clientHeight >= box.scrollHeight - 4; })()",
    );
    page.screenshot("console-live");
    // Search (a regular expression) and the stream filter.
    page.eval(
        "(() => { const i = document.querySelector('.console-search'); \
         i.value = 'spike at 2[0-9]00'; i.dispatchEvent(new Event('input')); })()",
    );
    let found = page.wait(
        "search results",
        Duration::from_secs(5),
        "(() => { const l = [...document.querySelectorAll('.console-lines .line .text')]\
         .map(e => e.textContent); return l.length == 10 ? l : null; })()",
    );
    assert_eq!(found[0], "WARNING grad spike at 2000");
    page.eval(
        "(() => { const i = document.querySelector('.console-search'); \
         i.value = '(unclosed'; i.dispatchEvent(new Event('input')); })()",
    );
    page.wait(
        "an invalid pattern is marked",
        Duration::from_secs(5),
        "document.querySelector('.console-search.invalid') != null",
    );
    page.eval(
        "(() => { const i = document.querySelector('.console-search'); i.value = ''; \
         i.dispatchEvent(new Event('input')); const s = document.querySelector('.console-stream'); \
         s.value = 'stderr'; s.dispatchEvent(new Event('change')); })()",
    );
    page.wait(
        "stderr only",
        Duration::from_secs(5),
        "(() => { const l = [...document.querySelectorAll('.console-lines .line')]; \
         return l.length == 20 && l.every(e => e.classList.contains('stderr')); })()",
    );
    // A click on a line: the charts' crosshair at its step.
    page.eval("document.querySelector('.console-lines .line[data-step=\"2500\"]').click()");
    page.wait(
        "the crosshair at step 2500",
        Duration::from_secs(5),
        "(() => { const c = document.querySelector('canvas[data-overlay=\"loss\"]'); \
         return c && c.dataset.hoverX == '2500'; })()",
    );
    // A click on the chart near its left edge: the console goes to an early step, which it
    // had not read yet (the tail started at 1020), and marks the first line there.
    let s = page.eval(
        "(() => { const s = document.querySelector('.console-stream'); s.value = ''; \
         s.dispatchEvent(new Event('change')); \
         const c = document.querySelector('canvas[data-overlay=\"loss\"]'); \
         const r = c.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()",
    );
    // A quarter of the way in: inside the plot, well before the tail's first step.
    let (x, y) = (
        s[0].as_f64().unwrap() + s[2].as_f64().unwrap() / 4.0,
        s[1].as_f64().unwrap() + s[3].as_f64().unwrap() / 2.0,
    );
    page.drag((x, y), (x, y), "left", 0);
    let target = page.wait(
        "the console at the clicked step",
        Duration::from_secs(10),
        "(() => { const t = document.querySelector('.console-lines .line.target'); \
         if (!t) return null; const box = document.querySelector('.console-lines'); \
         const r = t.getBoundingClientRect(), b = box.getBoundingClientRect(); \
         return r.top >= b.top && r.bottom <= b.bottom && +t.dataset.step < 1000 \
         ? +t.dataset.step : null; })()",
    );
    // The line marked is the one at the step asked for (each step has a line).
    let target = target.as_i64().unwrap();
    let hover =
        page.eval("+document.querySelector('canvas[data-overlay=\"loss\"]').dataset.hoverX");
    assert!(
        (hover.as_f64().unwrap() - target as f64).abs() < 40.0,
        "{hover} vs {target}"
    );
    assert_eq!(
        page.eval("document.querySelector('[data-testid=console]').dataset.follow"),
        "false"
    );
    page.screenshot("console-at-step");
    run.finish(Outcome::Finished);
}

/// The sample panels: a key's samples of two runs side by side at the slider's step, "latest"
/// following a new sample live, a table drawn as one, a text diff between two steps; and
/// the time a step change takes over 1,000 steps of text (printed; the issue's bar is 50 ms).
#[test]
fn sample_panels_browse_steps_side_by_side_follow_live_and_diff() {
    use crate::browser::Browser;
    let hub = Hub::start(&[]);
    let mut runs = Vec::new();
    for name in ["gen-a", "gen-b"] {
        let mut o = Options::new(&hub.ws(), "web", name);
        o.run_id = Some(RunId::new(name).unwrap());
        let run = Collector::start(o).unwrap();
        for step in 0..1000i64 {
            run.log(step, &[("loss", 1.0)]);
            let text = format!("{name} at {step}\nthe cat sat\nline {}", step % 7);
            run.log_item_at(step, unix_now(), "generation", ItemBody::Text(text));
        }
        run.log_item_at(
            999,
            unix_now(),
            "rollouts",
            ItemBody::Table {
                columns: vec!["prompt".into(), "reward".into()],
                rows: vec![vec![Cell::Text(format!("{name}?")), Cell::Number(0.25)]],
            },
        );
        run.flush();
        runs.push(run);
    }
    for run in &runs {
        wait_for("samples stored", Duration::from_secs(20), || {
            (run.acknowledged() == 1000).then_some(())
        });
    }
    let mut page = Browser::open(&format!("http://{}/?lang=en&runs=gen-a,gen-b", hub.addr()));
    page.wait(
        "both panels at the latest step",
        Duration::from_secs(20),
        "(() => { const p = document.querySelector('.sample-panel[data-key=\"generation\"]'); \
         return p && p.dataset.step == '999' && p.querySelectorAll('.sample-run pre').length == 2 \
         && document.querySelector('.sample-panel[data-key=\"rollouts\"] td') != null; })()",
    );
    let texts = page.eval(
        "[...document.querySelectorAll('.sample-panel[data-key=\"generation\"] .sample-run pre')]\
         .map(e => e.textContent)",
    );
    assert_eq!(texts[0], "gen-a at 999\nthe cat sat\nline 5");
    assert_eq!(texts[1], "gen-b at 999\nthe cat sat\nline 5");
    let cells = page.eval(
        "[...document.querySelectorAll('.sample-panel[data-key=\"rollouts\"] td')].map(e => e.textContent)",
    );
    assert_eq!(cells[0], "gen-a?");
    // The slider over every step once the key's whole history is read (the first answer holds
    // the newest samples of every key); then step 500 in both runs, each change timed.
    page.wait(
        "the key's whole history",
        Duration::from_secs(10),
        "document.querySelector('.sample-panel[data-key=\"generation\"] .sample-slider').max == '999'",
    );
    let ms = page.eval(
        "(() => { const s = document.querySelector('.sample-panel[data-key=\"generation\"] .sample-slider'); \
         const times = []; for (let i = 400; i <= 500; i++) { const t0 = performance.now(); \
         s.value = String(i); s.dispatchEvent(new Event('input')); \
         document.querySelector('.sample-panel[data-key=\"generation\"] .sample-run pre').textContent; \
         times.push(performance.now() - t0); } times.sort((a, b) => a - b); \
         return [times[50], times[99]]; })()",
    );
    println!(
        "sample slider step change: median {} ms, p99 {} ms",
        ms[0], ms[1]
    );
    let at = page.eval(
        "[...document.querySelectorAll('.sample-panel[data-key=\"generation\"] .sample-run pre')]\
         .map(e => e.textContent.split('\\n')[0])",
    );
    assert_eq!(at, serde_json::json!(["gen-a at 500", "gen-b at 500"]));
    // "latest" again, and a new sample arrives live.
    page.eval(
        "document.querySelector('.sample-panel[data-key=\"generation\"] .sample-latest').click()",
    );
    runs[0].log(1000, &[("loss", 1.0)]);
    runs[0].log_item_at(
        1000,
        unix_now(),
        "generation",
        ItemBody::Text("gen-a at 1000\nthe dog sat".into()),
    );
    runs[0].flush();
    page.wait(
        "the live sample shown",
        Duration::from_secs(10),
        "(() => { const p = document.querySelector('.sample-panel[data-key=\"generation\"]'); \
         return p.dataset.step == '1000' && \
         p.querySelector('.sample-run pre').textContent.startsWith('gen-a at 1000'); })()",
    );
    // gen-b has nothing at 1000: its last sample before it shows, marked with its step.
    assert_eq!(
        page.eval("document.querySelectorAll('.sample-panel[data-key=\"generation\"] .sample-run')[1].dataset.at"),
        "999"
    );
    // A diff of gen-a between 999 and 1000.
    page.eval(
        "document.querySelector('.sample-panel[data-key=\"generation\"] .sample-diff').click()",
    );
    let lines = page.wait(
        "the diff",
        Duration::from_secs(5),
        "(() => { const l = [...document.querySelectorAll('.sample-diff-view .diff-line')]\
         .map(e => e.textContent); return l.length ? l : null; })()",
    );
    assert_eq!(
        lines,
        serde_json::json!([
            "- gen-a at 999",
            "- the cat sat",
            "- line 5",
            "+ gen-a at 1000",
            "+ the dog sat"
        ])
    );
    page.screenshot("samples");
    // An image, live: its panel shows the file the hub serves (the frame carried its place).
    let raw = stepstream_collector::image::RawImage {
        width: 4,
        height: 3,
        channels: 3,
        pixels: (0..36).map(|i| (i * 7) as u8).collect(),
        format: ImageFormat::Png,
        quality: 90,
        caption: "a tiny picture".into(),
    };
    runs[1].log_image_at(1000, unix_now(), "picture", raw);
    runs[1].flush();
    page.wait(
        "the image loaded",
        Duration::from_secs(10),
        "(() => { const i = document.querySelector('.sample-panel[data-key=\"picture\"] img');          return i && i.complete && i.naturalWidth == 4 && i.naturalHeight == 3; })()",
    );
    for run in runs {
        run.finish(Outcome::Finished);
    }
}

/// Per-layer norms as a layer x step heatmap (the diverging layer bright where it diverged,
/// a NaN red, the window of a zoom), and a histogram key as bands with the step's overlay.
#[test]
fn layer_heatmaps_show_which_layer_diverged_and_histograms_draw_as_bands() {
    use crate::browser::Browser;
    let hub = Hub::start(&[]);
    let mut o = Options::new(&hub.ws(), "web", "layers");
    o.run_id = Some(RunId::new("layers").unwrap());
    let run = Collector::start(o).unwrap();
    let names: Vec<String> = (0..6).map(|l| format!("grad_norm/layer{l}")).collect();
    for step in 0..500i64 {
        let mut values: Vec<(&str, f64)> = vec![("loss", 1.0)];
        for (l, name) in names.iter().enumerate() {
            let v = if l == 3 && step >= 400 {
                1e6
            } else if l == 5 && step == 450 {
                f64::NAN
            } else {
                0.01 * (l + 1) as f64
            };
            values.push((name.as_str(), v));
        }
        run.log(step, &values);
        if step % 50 == 0 {
            let spread = 1.0 + step as f64 / 100.0;
            run.log_item_at(
                step,
                unix_now(),
                "grad/layer3",
                ItemBody::Histogram(Histogram {
                    lo: -spread,
                    hi: spread,
                    counts: vec![1.0, 4.0, 10.0, 4.0, 1.0],
                    nan: 0.0,
                    pos_inf: 0.0,
                    neg_inf: 0.0,
                }),
            );
        }
    }
    run.flush();
    wait_for("stored", Duration::from_secs(20), || {
        (run.acknowledged() == 500).then_some(())
    });
    let mut page = Browser::open(&format!("http://{}/?lang=en&runs=layers", hub.addr()));
    let canvas = "document.querySelector('canvas[data-family=\"grad_norm/\"]')";
    page.wait(
        "the heatmap",
        Duration::from_secs(20),
        &format!("{canvas} && {canvas}.dataset.layers == '6'"),
    );
    // The colour of a cell: layer `row` at a fraction of the width.
    let cell = |page: &mut Browser, row: usize, at: f64| -> Vec<u8> {
        let v = page.eval(&format!(
            "(() => {{ const c = {canvas}; const dpr = c.width / c.clientWidth; \
             const rows = 6, rowH = (c.height / dpr - 16) / rows; \
             const x = 110 + (c.clientWidth - 114) * {at}, y = rowH * ({row} + 0.5); \
             return [...c.getContext('2d').getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data]; }})()"
        ));
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u8)
            .collect()
    };
    let mut late = Vec::new();
    for _ in 0..50 {
        late = cell(&mut page, 3, 0.95);
        if late[0] > 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let early = cell(&mut page, 3, 0.2);
    page.screenshot("heatmap");
    // The per-layer charts themselves are folded into their own group.
    assert_eq!(
        page.eval("document.querySelector('.group[data-group=\"layers\"]').classList.contains('collapsed')"),
        true
    );
    // Viridis: dark purple for small values, yellow for the largest.
    assert!(
        late[0] > 200 && late[1] > 200 && late[2] < 100,
        "layer 3 at the end: {late:?}"
    );
    assert!(early[0] < 120 && early[2] > 60, "layer 3 early: {early:?}");
    let nan = cell(&mut page, 5, 450.0 / 499.0);
    assert!(nan[0] > 200 && nan[1] < 60, "the NaN cell: {nan:?}");
    page.screenshot("heatmap");
    // Zoomed to steps 0..300: layer 3 is quiet across the whole width.
    page.navigate(&format!(
        "http://{}/?lang=en&runs=layers&x0=0&x1=300",
        hub.addr()
    ));
    page.wait(
        "the zoomed heatmap",
        Duration::from_secs(20),
        &format!("{canvas} && {canvas}.dataset.layers == '6'"),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let zoomed = cell(&mut page, 3, 0.95);
    assert!(
        zoomed[0] < 120,
        "layer 3 before step 300 is quiet: {zoomed:?}"
    );
    // The histogram key: bands drawn, and the overlay at the chosen step.
    let ink = page.wait(
        "histogram bands",
        Duration::from_secs(10),
        "(() => { const c = document.querySelector('canvas.histogram-band'); if (!c || !c.width) return null; \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; \
         for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n > 500 ? n : null; })()",
    );
    assert!(ink.as_u64().unwrap() > 500);
    run.finish(Outcome::Finished);
}

/// The console, samples and images of a run are read as its scalars are: a token scoped to
/// another project reads none of them, a token of its project reads all of them.
#[test]
fn a_scoped_token_reads_the_console_and_samples_of_its_projects_only() {
    let hub = Hub::start_with_tokens(
        "[[tokens]]\ntoken = \"vision-reader\"\naccess = \"read\"\nprojects = [\"vision\"]\n",
        &[],
    );
    let mut o = Options::new(&hub.ws(), "audio", "speech");
    o.run_id = Some(RunId::new("speech").unwrap());
    o.token = Some("w".into());
    let run = Collector::start(o).unwrap();
    run.log(0, &[("loss", 1.0)]);
    run.log_item("", line("secret line", Stream::Stdout));
    run.log_item_at(0, 1.0, "gen", ItemBody::Text("secret text".into()));
    let report = run.finish(Outcome::Finished);
    assert!(report.delivered && report.items_acked == 2, "{report:?}");
    for path in [
        "/api/runs/speech/console",
        "/api/runs/speech/console?format=text",
        "/api/runs/speech/samples?key=gen",
        "/api/runs/speech/image?seq=1&idx=1",
    ] {
        let refused = http_get(&hub.addr(), path, Some("vision-reader"));
        assert_eq!(refused.status, 403, "{path}: {}", refused.text());
        assert!(!refused.text().contains("secret"), "{path}");
        let anonymous = http_get(&hub.addr(), path, None);
        assert_eq!(anonymous.status, 401, "{path}");
    }
    let ok = http_get(&hub.addr(), "/api/runs/speech/console", Some("r"));
    assert!(ok.text().contains("secret line"), "{}", ok.text());
    let ok = http_get(&hub.addr(), "/api/runs/speech/samples?key=gen", Some("r"));
    assert!(ok.text().contains("secret text"), "{}", ok.text());
}

/// Samples past the run's quota or the hub's are kept out of their batches, named in an error
/// the collector reports, and counted as refused, not acknowledged; the records and console
/// lines of those batches are stored, and a restarted hub still counts what was stored.
#[test]
fn samples_over_a_runs_or_the_hubs_quota_are_refused_by_name_and_nothing_else_is() {
    let mut hub = Hub::start(&[
        "--limit",
        "run_sample_bytes=5000",
        "--limit",
        "hub_sample_bytes=8000",
    ]);
    let start = |ws: &str, id: &str| {
        let mut o = Options::new(ws, "p", id);
        o.run_id = Some(RunId::new(id).unwrap());
        Collector::start(o).unwrap()
    };
    let text = |step: i64| ItemBody::Text(format!("{step:04}{}", "x".repeat(996)));
    let a = start(&hub.ws(), "quota-a");
    for step in 0..8i64 {
        a.log(step, &[("loss", 1.0)]);
        a.log_item("", line(&format!("line {step}"), Stream::Stdout));
        a.log_item_at(step, unix_now(), "gen", text(step));
        a.flush();
    }
    wait_for("the run quota named", Duration::from_secs(10), || {
        a.last_error().filter(|e| e.contains("run_sample_bytes"))
    });
    let report = a.finish(Outcome::Finished);
    assert!(report.delivered, "{report:?}");
    // 1,000-byte texts (plus the key): four fit 5,000 bytes; four do not.
    assert_eq!(
        (report.items_acked, report.items_refused),
        (12, 4),
        "{report:?}"
    );
    let stored = hub.json("/api/runs/quota-a/samples?key=gen&from_step=0");
    assert_eq!(stored["samples"].as_array().unwrap().len(), 4);
    assert_eq!(hub.json("/api/runs/quota-a")["records"], 8);
    assert_eq!(hub.json("/api/runs/quota-a/console")["total"], 8);
    // The hub holds 4,012 bytes of samples; after a restart it still counts them, and a
    // second run is stopped by the hub's quota of 8,000.
    hub.restart();
    let b = start(&hub.ws(), "quota-b");
    for step in 0..8i64 {
        b.log(step, &[("loss", 1.0)]);
        b.log_item_at(step, unix_now(), "gen", text(step));
        b.flush();
    }
    wait_for("the hub quota named", Duration::from_secs(10), || {
        b.last_error().filter(|e| e.contains("hub_sample_bytes"))
    });
    let report = b.finish(Outcome::Finished);
    assert_eq!(
        (report.items_acked, report.items_refused),
        (3, 5),
        "{report:?}"
    );
    assert_eq!(hub.json("/api/runs/quota-b")["records"], 8);
}

/// A batch resent after its acknowledgement was lost (a new connection of the same
/// collector) is acknowledged with the samples the quota kept out of it the first time:
/// the collector never counts them as stored.
#[test]
fn a_resent_batch_is_acknowledged_with_the_samples_its_first_storing_refused() {
    let hub = Hub::start(&["--limit", "run_sample_bytes=2500"]);
    let batch = Batch {
        seq: 1,
        records: vec![StepRecord {
            step: 0,
            wall_time: unix_now(),
            values: vec![(MetricId(0), 1.0)],
        }],
        items: (0..3)
            .map(|i| Item {
                step: 0,
                wall_time: unix_now(),
                key: "gen".into(),
                body: ItemBody::Text(format!("{i}{}", "x".repeat(999))),
            })
            .collect(),
    };
    // Two of the three 1,000-byte texts fit 2,500 bytes; the first sending and the resend
    // are both told one was refused.
    for attempt in 0..2 {
        let mut c = RawCollector::connect(&hub);
        c.send(hello("resent-quota", None));
        assert!(
            matches!(c.recv(), Some(FromHub::Welcome(_))),
            "attempt {attempt}"
        );
        c.send(ToHub::DefineMetrics(DefineMetrics {
            metrics: vec![MetricDef {
                id: MetricId(0),
                name: "loss".into(),
            }],
        }));
        c.send(ToHub::Batch(batch.clone()));
        let ack = loop {
            match c.recv() {
                Some(FromHub::Ack(a)) => break a,
                Some(_) => continue,
                None => panic!("attempt {attempt}: the hub closed the socket"),
            }
        };
        assert_eq!(
            (ack.through_seq, ack.items_refused),
            (1, 1),
            "attempt {attempt}"
        );
    }
    let stored = hub.json("/api/runs/resent-quota/samples?key=gen&from_step=0");
    assert_eq!(stored["samples"].as_array().unwrap().len(), 2);
}
