//! The web app in a real browser: live run list, charts that move, overlay of several runs,
//! hover, languages, the stale banner, and reconnecting after a hub restart.

use crate::browser::Browser;
use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome, Report};

fn page_is_embedded(hub: &Hub) {
    let index = hub.get("/").text();
    assert!(
        index.contains("stepstream_frontend.js"),
        "this stepstream binary was built without the web app: run scripts/build-web first"
    );
}

/// Streams `steps` steps of loss/lr/grad_norm, one every `every`.
fn stream(hub: &Hub, name: &str, steps: i64, every: Duration) -> std::thread::JoinHandle<Report> {
    let run = Collector::start(Options::new(&hub.ws(), "web", name)).unwrap();
    let salt = name.len() as f64;
    std::thread::spawn(move || {
        for step in 0..steps {
            let loss = salt + 2.0 * (-(step as f64) / 200.0).exp();
            run.log(
                step,
                &[
                    ("loss", loss),
                    ("lr", 1e-3 * (step as f64 / 100.0).min(1.0)),
                    ("grad_norm", 1.0),
                ],
            );
            run.flush();
            std::thread::sleep(every);
        }
        run.finish(Outcome::Finished)
    })
}

fn chart(metric: &str) -> String {
    format!(
        "(() => {{ const c = document.querySelector('canvas[data-chart=\"{metric}\"]'); \
         return c && c.dataset.points ? {{ points: +c.dataset.points, last: +c.dataset.lastStep, \
         ooo: +c.dataset.outOfOrder, drawn: +c.dataset.drawn }} : null; }})()"
    )
}

/// Count and hash of the non-white pixels of a chart.
fn pixels(metric: &str) -> String {
    format!(
        "(() => {{ const c = document.querySelector('canvas[data-chart=\"{metric}\"]'); \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         let ink = 0, h = 0; for (let i = 0; i < d.length; i += 4) {{ \
         if (d[i] < 250 || d[i+1] < 250 || d[i+2] < 250) {{ ink++; h = (h * 31 + i + d[i]) % 1000000007; }} }} \
         return [ink, h]; }})()"
    )
}

fn click_run(browser: &mut Browser, run: &str) {
    browser.eval(&format!(
        "document.querySelector('tr.run[data-run-id=\"{run}\"]').click()"
    ));
}

#[test]
fn page_lists_runs_and_draws_their_curves_live() {
    let hub = Hub::start(&[]);
    page_is_embedded(&hub);
    let a = stream(&hub, "alpha", 600, Duration::from_millis(10));
    let b = stream(&hub, "beta-run", 600, Duration::from_millis(10));
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.wait(
        "two runs listed",
        Duration::from_secs(20),
        "document.querySelectorAll('tr.run').length == 2",
    );
    page.wait(
        "live indicator",
        Duration::from_secs(5),
        "document.querySelector('[data-conn=live]') != null",
    );
    let ids = page.eval("[...document.querySelectorAll('tr.run')].map(r => r.dataset.runId)");
    for id in ids.as_array().unwrap() {
        click_run(&mut page, id.as_str().unwrap());
    }
    let first = page.wait("loss chart drawn", Duration::from_secs(20), &chart("loss"));
    for metric in ["lr", "grad_norm"] {
        page.wait(
            &format!("{metric} chart"),
            Duration::from_secs(10),
            &chart(metric),
        );
    }
    let before = page.eval(&pixels("loss"));
    assert!(
        before[0].as_u64().unwrap() > 500,
        "the loss chart has ink: {before}"
    );
    page.screenshot("web-live-early");
    let first_last = first["last"].as_i64().unwrap();
    page.wait(
        "the curves to move",
        Duration::from_secs(20),
        &format!(
            "(() => {{ const c = {}; return c && c.last >= {}; }})()",
            chart("loss"),
            first_last + 100
        ),
    );
    let after = page.eval(&pixels("loss"));
    assert_ne!(before, after, "the canvas pixels changed as points arrived");

    assert!(a.join().unwrap().delivered && b.join().unwrap().delivered);
    let done = page.wait(
        "every point of both runs",
        Duration::from_secs(20),
        &format!(
            "(() => {{ const c = {}; return c && c.points == 1200 ? c : null; }})()",
            chart("loss")
        ),
    );
    assert_eq!(done["ooo"], 0, "no point twice");
    assert_eq!(done["last"], 599);
    assert!(done["drawn"].as_u64().unwrap() <= 1200);
    // Every chart gets its turn (a frame draws what its time budget allows, oldest first).
    page.wait(
        "every point on the lr chart",
        Duration::from_secs(5),
        &format!(
            "(() => {{ const c = {}; return c && c.points == 1200; }})()",
            chart("lr")
        ),
    );
    // Two runs overlaid: a legend with both, finished in the list.
    assert_eq!(
        page.eval("document.querySelectorAll('.legend .item').length"),
        2
    );
    page.wait(
        "both finished",
        Duration::from_secs(10),
        "document.querySelectorAll('tr.run[data-status=finished]').length == 2",
    );

    // Hover over the middle of the loss chart shows a step and the runs' values.
    let rect = page.eval(
        "(() => { const r = document.querySelector('canvas[data-chart=\"loss\"]').getBoundingClientRect(); \
         return [r.left + r.width / 2, r.top + r.height / 2]; })()",
    );
    page.mouse_move(rect[0].as_f64().unwrap(), rect[1].as_f64().unwrap());
    let tip = page.wait(
        "the hover tooltip",
        Duration::from_secs(5),
        "(() => { const t = document.querySelector('[data-testid=tooltip]'); return t ? t.textContent : ''; })()",
    );
    let tip = tip.as_str().unwrap();
    assert!(
        tip.contains("step") && tip.contains("alpha") && tip.contains("beta-run"),
        "{tip}"
    );
    page.screenshot("web-overlay-hover");

    // Chinese, switchable.
    page.eval("document.querySelector('button.lang').click()");
    page.wait(
        "Chinese",
        Duration::from_secs(5),
        "document.querySelector('section.runs h2').textContent == '训练任务'",
    );
    assert_eq!(page.eval("document.documentElement.lang"), "zh");
    page.screenshot("web-zh");
}

#[test]
fn stale_banner_appears_when_a_run_goes_quiet_and_clears_when_it_resumes() {
    // The hub judges staleness, for the page as for the API and the widget.
    let hub = Hub::start(&["--stale-after", "2"]);
    page_is_embedded(&hub);
    let run = Collector::start(Options::new(&hub.ws(), "web", "quiet-run")).unwrap();
    let id = run.run_id().to_string();
    for step in 0..10 {
        run.log(step, &[("loss", 1.0)]);
    }
    run.flush();
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.wait(
        "the run listed",
        Duration::from_secs(20),
        "document.querySelectorAll('tr.run').length == 1",
    );
    click_run(&mut page, &id);
    page.wait(
        "history drawn",
        Duration::from_secs(10),
        &format!(
            "(() => {{ const c = {}; return c && c.points == 10; }})()",
            chart("loss")
        ),
    );
    let banner = "(() => { const b = document.querySelector('[data-testid=stale-banner]'); return b ? b.dataset.runs + '|' + b.textContent : ''; })()";
    let text = page.wait("the stale banner", Duration::from_secs(10), banner);
    let text = text.as_str().unwrap();
    assert!(
        text.starts_with(&id) && text.contains("no new data"),
        "{text}"
    );
    page.screenshot("web-stale-banner");
    for step in 10..20 {
        run.log(step, &[("loss", 0.5)]);
    }
    run.flush();
    page.wait(
        "the banner to clear",
        Duration::from_secs(10),
        "document.querySelector('[data-testid=stale-banner]') == null",
    );
    page.wait(
        "the new points drawn",
        Duration::from_secs(5),
        &format!(
            "(() => {{ const c = {}; return c && c.points == 20; }})()",
            chart("loss")
        ),
    );
    assert!(run.finish(Outcome::Finished).delivered);
}

#[test]
fn page_reconnects_after_a_hub_restart_and_ends_with_every_point_once() {
    let mut hub = Hub::start(&[]);
    page_is_embedded(&hub);
    let steps = 800;
    let producer = stream(&hub, "restart", steps, Duration::from_millis(10));
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.wait(
        "the run listed",
        Duration::from_secs(20),
        "document.querySelectorAll('tr.run').length == 1",
    );
    let id = page.eval("document.querySelector('tr.run').dataset.runId");
    click_run(&mut page, id.as_str().unwrap());
    page.wait(
        "some points",
        Duration::from_secs(20),
        &format!(
            "(() => {{ const c = {}; return c && c.points > 100; }})()",
            chart("loss")
        ),
    );
    hub.kill9();
    page.wait(
        "reconnecting",
        Duration::from_secs(10),
        "document.querySelector('[data-conn=reconnecting]') != null",
    );
    page.screenshot("web-reconnecting");
    std::thread::sleep(Duration::from_millis(500));
    hub.restart();
    page.wait(
        "live again",
        Duration::from_secs(20),
        "document.querySelector('[data-conn=live]') != null",
    );
    assert!(producer.join().unwrap().delivered);
    let done = page.wait(
        "every point",
        Duration::from_secs(30),
        &format!(
            "(() => {{ const c = {}; return c && c.points >= {steps} ? c : null; }})()",
            chart("loss")
        ),
    );
    assert_eq!(done["points"], steps, "every point once");
    assert_eq!(done["ooo"], 0);
    assert_eq!(done["last"], steps - 1);
    page.screenshot("web-after-restart");
}

#[test]
fn alerts_show_in_the_list_and_as_markers_on_the_chart() {
    let hub = Hub::start(&[]);
    page_is_embedded(&hub);
    let run = Collector::start(Options::new(&hub.ws(), "web", "nan-run")).unwrap();
    let id = run.run_id().to_string();
    for step in 0..100i64 {
        let loss = if step == 60 {
            f64::NAN
        } else {
            2.0 / (1.0 + step as f64 * 0.05)
        };
        run.log(step, &[("loss", loss), ("grad_norm", 1.0)]);
    }
    run.flush();
    let mut page = Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.wait(
        "the run listed",
        Duration::from_secs(20),
        "document.querySelectorAll('tr.run').length == 1",
    );
    click_run(&mut page, &id);
    let item = page.wait(
        "the alert in the list",
        Duration::from_secs(10),
        "(() => { const a = document.querySelector('li.alert[data-rule=non_finite][data-state=fired]'); return a ? a.dataset.step + '|' + a.textContent : ''; })()",
    );
    let item = item.as_str().unwrap();
    assert!(
        item.starts_with("60|") && item.contains("nan-run") && item.contains("loss is NaN"),
        "{item}"
    );
    page.wait("its marker on the chart", Duration::from_secs(10),
        "(() => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); return c && +c.dataset.markers >= 1; })()");
    // A live one arrives while watching: a loss spike.
    run.log(100, &[("loss", 50.0), ("grad_norm", 1.0)]);
    run.flush();
    page.wait(
        "the live alert",
        Duration::from_secs(10),
        "document.querySelector('li.alert[data-rule=loss_spike][data-step=\"100\"]') != null",
    );
    page.screenshot("web-alerts");
    assert!(run.finish(Outcome::Finished).delivered);

    // The link in alert messages opens the run directly.
    page.navigate(&format!("http://{}/?lang=en&run={id}", hub.addr()));
    page.wait("the linked run open", Duration::from_secs(10),
        "(() => { const c = document.querySelector('canvas[data-chart=\"loss\"]'); return c && +c.dataset.points == 101; })()");
}

/// A copied link must not carry the read token: the page takes `?token=` out of the address
/// bar as it opens, never writes it back, and still reads with it (after a reload too, from
/// the tab's session storage).
#[test]
fn the_page_keeps_its_token_out_of_the_address_bar() {
    let hub = Hub::start_with_tokens("", &[]);
    let mut o = Options::new(&hub.ws(), "web", "tokened");
    o.token = Some("w".into());
    let run = Collector::start(o).unwrap();
    for step in 0..50 {
        run.log(step, &[("loss", 1.0 / (step + 1) as f64)]);
    }
    let id = run.run_id().to_string();
    assert!(run.finish(Outcome::Finished).delivered);
    let mut page = Browser::open(&format!("http://{}/?lang=en&token=r&runs={id}", hub.addr()));
    page.wait(
        "the run listed",
        Duration::from_secs(20),
        "document.querySelectorAll('tr.run').length == 1",
    );
    page.wait("its chart drawn", Duration::from_secs(20), &chart("loss"));
    let href = page.eval("location.href");
    let href = href.as_str().unwrap();
    assert!(!href.contains("token"), "{href}");
    assert!(
        href.contains(&format!("runs={id}")),
        "the view stays: {href}"
    );
    // A change of view writes the URL again: still without the token.
    click_run(&mut page, &id);
    let href = page.eval("location.href + ' ' + history.length");
    assert!(!href.as_str().unwrap().contains("token"), "{href}");
    // A reload of the tokenless address still reads.
    page.eval("location.reload()");
    std::thread::sleep(Duration::from_millis(500));
    page.wait(
        "the run listed after a reload",
        Duration::from_secs(20),
        "document.querySelectorAll('tr.run').length == 1",
    );
}

/// After a hub restart the page resumes by batch sequence number: an evaluation logged at an
/// earlier step and a resumed run's rewind reach the charts, each point once. (It asked for
/// steps after the highest one held, and lost both.)
#[test]
fn after_a_hub_restart_late_and_rewound_points_are_drawn_once() {
    let mut hub = Hub::start(&[]);
    page_is_embedded(&hub);
    let run = Collector::start(Options::new(&hub.ws(), "web", "rewinds")).unwrap();
    for s in 0..300 {
        run.log(s, &[("loss", 1.0 + s as f64 * 0.01)]);
    }
    run.flush();
    let id = run.run_id().to_string();
    let mut page = Browser::open(&format!("http://{}/?lang=en&runs={id}", hub.addr()));
    let points = |metric: &str, n: usize| {
        format!(
            "(() => {{ const c = {}; return c && c.points == {n} ? c : null; }})()",
            chart(metric)
        )
    };
    page.wait("the history", Duration::from_secs(30), &points("loss", 300));
    hub.kill9();
    page.wait(
        "reconnecting",
        Duration::from_secs(10),
        "document.querySelector('[data-conn=reconnecting]') != null",
    );
    hub.restart();
    page.wait(
        "live again",
        Duration::from_secs(20),
        "document.querySelector('[data-conn=live]') != null",
    );
    run.log(100, &[("eval_loss", 2.0)]);
    run.flush();
    std::thread::sleep(Duration::from_millis(100));
    for s in 200..250 {
        run.log(s, &[("loss", 0.5)]);
    }
    assert!(run.finish(Outcome::Finished).delivered);
    page.wait(
        "the late evaluation",
        Duration::from_secs(20),
        &points("eval_loss", 1),
    );
    page.wait("the rewind", Duration::from_secs(20), &points("loss", 350));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        page.eval(&points("loss", 350)).is_object(),
        "each point once"
    );
    assert!(page.eval(&points("eval_loss", 1)).is_object());
    page.screenshot("web-rewind-after-restart");
}
