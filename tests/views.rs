//! The views runs are compared with, in headless Chromium: any metric of the runs as the x
//! axis (two batch sizes compared at equal tokens seen, live and zoomed to raw points).

use crate::browser::Browser;
use crate::charts::{at_x, hooks, open_run, tooltip, wait_hooks};
use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};

/// Tokens in one sample.
const SEQ: f64 = 128.0;

/// Sets a form control's value as a user would, firing `event` (`change` or `input`).
fn set_value(page: &mut Browser, selector: &str, value: &str, event: &str) {
    page.eval(&format!(
        "(() => {{ const s = document.querySelector('{selector}'); s.value = '{value}'; \
         s.dispatchEvent(new Event('{event}', {{ bubbles: true }})); }})()"
    ));
}

/// The loss both runs follow as a function of the tokens they have seen: equal tokens,
/// equal loss, whatever the batch size.
fn loss_at(tokens: f64) -> f64 {
    1.0 + 3.0 * (-tokens / 8e6).exp()
}

/// The value a tooltip gives `label`'s line (`label: 1.2345` or `label: 1.2 (raw 1.3)`).
fn value_of(tip: &str, label: &str) -> f64 {
    let at = tip
        .find(&format!("{label}: "))
        .unwrap_or_else(|| panic!("{label} in {tip:?}"))
        + label.len()
        + 2;
    let number: String = tip[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || ".-e".contains(*c))
        .collect();
    number
        .parse()
        .unwrap_or_else(|_| panic!("{number:?} in {tip:?}"))
}

/// Hovers `x` on the loss chart and reads both runs' values from the tooltip.
fn hover_values(page: &mut Browser, x: f64) -> (String, f64, f64) {
    page.eval(
        "document.querySelector('canvas[data-chart=\"loss\"]').scrollIntoView({ block: 'center' })",
    );
    let h = hooks(page, "loss");
    let (px, py) = at_x(&h, x);
    page.mouse_move(px, py);
    let tip = tooltip(page);
    let (a, b) = (value_of(&tip, "batch-512"), value_of(&tip, "batch-2048"));
    (tip, a, b)
}

/// Logs steps `from..to` of a run of `batch` samples a step: the loss every `loss_every`
/// steps, the tokens seen every `tokens_every` steps (both sparse: the page joins by step).
fn log_steps(
    run: &Collector,
    batch: f64,
    (from, to): (i64, i64),
    loss_every: i64,
    tokens_every: i64,
) {
    for step in from..to {
        let tokens = step as f64 * batch * SEQ;
        let mut values = Vec::new();
        if step % loss_every == 0 {
            values.push(("loss", loss_at(tokens)));
        }
        if step % tokens_every == 0 {
            values.push(("tokens_seen", tokens));
        }
        if !values.is_empty() {
            run.log(step, &values);
        }
    }
    run.flush();
}

#[test]
fn runs_of_two_batch_sizes_match_at_equal_tokens_on_a_tokens_axis_live_and_zoomed() {
    let hub = Hub::start(&[]);
    let small = Collector::start(Options::new(&hub.ws(), "views", "batch-512")).unwrap();
    let large = Collector::start(Options::new(&hub.ws(), "views", "batch-2048")).unwrap();
    // batch-512: a loss every step, tokens every 5th step; batch-2048: tokens every step,
    // a loss every 2nd. Half of each before the page opens.
    log_steps(&small, 512.0, (0, 200), 1, 5);
    log_steps(&large, 2048.0, (0, 50), 2, 1);
    let ids = [small.run_id().to_string(), large.run_id().to_string()];
    let mut page = open_run(&hub, &[&ids[0], &ids[1]], "");
    wait_hooks(
        &mut page,
        "both lines",
        "loss",
        "h.lines.split('|').length == 2",
    );

    // On the step axis the runs differ at one step (the large batch saw 4x the tokens).
    let h = hooks(&mut page, "loss");
    let (x, y) = at_x(&h, 40.0);
    page.mouse_move(x, y);
    let tip = tooltip(&mut page);
    let (a, b) = (value_of(&tip, "batch-512"), value_of(&tip, "batch-2048"));
    assert!((a - b).abs() > 0.3, "the step axis tells them apart: {tip}");

    // The x axis offers the tokens seen first; choosing it puts it in the address.
    let offered = page.wait(
        "tokens offered as x",
        Duration::from_secs(15),
        "(() => { const o = [...document.querySelectorAll('select.axis optgroup:first-of-type option')]; \
         return o.some(o => o.value == 'metric:tokens_seen') ? o.map(o => o.value) : null; })()",
    );
    assert!(!offered.to_string().contains("loss"), "{offered}");
    set_value(&mut page, "select.axis", "metric:tokens_seen", "change");
    let joined = wait_hooks(&mut page, "the tokens axis", "loss", "h.axis == 'metric'");
    // The whole of both runs as far as their tokens go: the small run's losses after its
    // last tokens (step 195) have no x yet; the large run's last loss is at step 48.
    let x1 = joined["x1"].as_f64().unwrap();
    assert!((x1 - 195.0 * 512.0 * SEQ).abs() < 1.0, "{joined}");
    let search = page.eval("location.search").as_str().unwrap().to_string();
    assert!(search.contains("axis=metric%3Atokens_seen"), "{search}");

    // The rest streams while the page watches: the axis follows the new tokens.
    log_steps(&small, 512.0, (200, 400), 1, 5);
    log_steps(&large, 2048.0, (50, 100), 2, 1);
    let end = 395.0 * 512.0 * SEQ;
    let live = wait_hooks(
        &mut page,
        "the live edge in tokens",
        "loss",
        &format!("Math.abs(h.x1 - {end}) < 1"),
    );
    assert_eq!(live["axis"], "metric", "{live}");

    // At equal tokens, equal loss: 40 large steps = 160 small ones = 10,485,760 tokens (a
    // point of both runs; the small run's tokens there are interpolated from steps 155, 160).
    let tokens = 40.0 * 2048.0 * SEQ;
    let (tip, a, b) = hover_values(&mut page, tokens);
    assert!(tip.contains("tokens_seen"), "{tip}");
    let want = loss_at(tokens);
    assert!(
        (a - want).abs() < 2e-3 && (b - want).abs() < 2e-3,
        "{want} vs {tip}"
    );

    // Zoom around those tokens until the hub answers raw points, then compare again.
    for _ in 0..40 {
        let h = hooks(&mut page, "loss");
        if h["x1"].as_f64().unwrap() - h["x0"].as_f64().unwrap() < 3e6 {
            break;
        }
        let (x, y) = at_x(&h, tokens);
        page.wheel(x, y, -120.0);
        std::thread::sleep(Duration::from_millis(30));
    }
    let zoomed = wait_hooks(
        &mut page,
        "raw points of the tokens window",
        "loss",
        "h.x1 - h.x0 < 3e6 && h.detail > 0 && h.fetching == 0",
    );
    let (x0, x1) = (
        zoomed["x0"].as_f64().unwrap(),
        zoomed["x1"].as_f64().unwrap(),
    );
    assert!(x0 < tokens && tokens < x1, "{zoomed}");
    let (tip, a, b) = hover_values(&mut page, tokens);
    assert!(
        (a - want).abs() < 2e-3 && (b - want).abs() < 2e-3,
        "zoomed: {want} vs {tip}"
    );
    page.screenshot("views-tokens-axis");

    // The address reopens the same axis in another browser.
    let address = page.eval("location.href").as_str().unwrap().to_string();
    drop(page);
    let mut other = Browser::open(&address);
    let again = wait_hooks(
        &mut other,
        "the axis from the address",
        "loss",
        "h.axis == 'metric'",
    );
    assert!(again["x0"].as_f64().unwrap() < tokens, "{again}");
    let chosen = other.eval("document.querySelector('select.axis').value");
    assert_eq!(chosen, "metric:tokens_seen");
    assert!(small.finish(Outcome::Finished).delivered);
    assert!(large.finish(Outcome::Finished).delivered);
}

/// The loss of seed `k` at `step`: a shared curve and a seed's own wiggle.
fn seed_loss(k: usize, step: i64) -> f64 {
    2.0 / (1.0 + step as f64 * 0.02) + 0.3 * ((step as f64) * 0.37 + k as f64 * 2.1).sin()
}

/// A group's row in a tooltip: `label: mean [low .. high]`.
fn band_of(tip: &str, label: &str) -> (f64, f64, f64) {
    let row = tip
        .lines()
        .flat_map(|l| l.split(label).nth(1))
        .next()
        .unwrap_or_else(|| panic!("{label} in {tip:?}"));
    let numbers: Vec<f64> = row
        .split(|c: char| !(c.is_ascii_digit() || ".-e".contains(c)))
        .filter_map(|s| s.parse().ok())
        .collect();
    assert!(numbers.len() >= 3, "{row:?} in {tip:?}");
    (numbers[0], numbers[1], numbers[2])
}

#[test]
fn three_seeds_grouped_by_a_config_key_draw_their_mean_and_a_band_holding_each_live() {
    let hub = Hub::start(&[]);
    let start = |name: &str, config: serde_json::Value| {
        let mut o = Options::new(&hub.ws(), "views", name);
        o.config_json = config.to_string();
        Collector::start(o).unwrap()
    };
    let seeds: Vec<Collector> = (0..3)
        .map(|k| {
            start(
                &format!("wide-seed{k}"),
                serde_json::json!({"optim": {"lr": 0.1}, "seed": k}),
            )
        })
        .collect();
    let alone = start(
        "narrow",
        serde_json::json!({"optim": {"lr": 0.2}, "seed": 0}),
    );
    let log = |from: i64, to: i64| {
        for step in from..to {
            for (k, run) in seeds.iter().enumerate() {
                run.log(step, &[("loss", seed_loss(k, step))]);
            }
            alone.log(step, &[("loss", 5.0)]);
        }
        seeds.iter().for_each(|r| r.flush());
        alone.flush();
    };
    log(0, 150);
    let mut ids: Vec<String> = seeds.iter().map(|r| r.run_id().to_string()).collect();
    ids.push(alone.run_id().to_string());
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut page = open_run(&hub, &refs, "");
    wait_hooks(
        &mut page,
        "four lines",
        "loss",
        "h.lines.split('|').length == 4",
    );

    // Group by the config key `optim.lr`, picked from the selected runs' keys.
    page.eval("document.querySelector('select.group-by').dispatchEvent(new Event('focus'))");
    page.wait(
        "the config keys offered",
        Duration::from_secs(15),
        "[...document.querySelectorAll('select.group-by option')].some(o => o.value == 'cfg:optim.lr')",
    );
    set_value(&mut page, "select.group-by", "cfg:optim.lr", "change");
    let group = "optim.lr=0.1 (3 runs)";
    let h = wait_hooks(
        &mut page,
        "one group and the run alone",
        "loss",
        &format!("h.lines == '{group}|narrow'"),
    );
    assert!(
        h["y1"].as_f64().unwrap() > 5.0,
        "the run alone keeps its own line: {h}"
    );
    // The legend names the group (in its colour) and the run alone.
    let legend = page.wait(
        "the legend grouped",
        Duration::from_secs(15),
        "(() => { const i = [...document.querySelectorAll('.legend .item')].map(i => i.textContent); \
         return i.length == 2 ? i : null; })()",
    );
    assert_eq!(
        legend,
        serde_json::json!(["optim.lr=0.1 (3 runs)", "narrow"])
    );
    assert!(page
        .eval("location.search")
        .as_str()
        .unwrap()
        .contains("group=cfg%3Aoptim.lr"));

    // At each step the group's line is the seeds' mean and its band spans all three.
    let check = |page: &mut Browser, step: i64, what: &str| {
        page.eval("document.querySelector('canvas[data-chart=\"loss\"]').scrollIntoView({ block: 'center' })");
        let h = hooks(page, "loss");
        let (x, y) = at_x(&h, step as f64);
        // Hovered again until every seed has the step (at the live edge one may lag).
        let mut tip = String::new();
        for attempt in 0..100 {
            page.mouse_move(x, y + (attempt % 2) as f64);
            tip = page
                .eval(
                    "(() => { const t = document.querySelector('[data-testid=tooltip]'); \
                     return t ? t.textContent : ''; })()",
                )
                .as_str()
                .unwrap_or_default()
                .to_string();
            if tip.contains(&format!("step {step} ")) && !tip.contains(" runs here") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (mean, lo, hi) = band_of(&tip, &format!("{group}: "));
        let values: Vec<f64> = (0..3).map(|k| seed_loss(k, step)).collect();
        let want = values.iter().sum::<f64>() / 3.0;
        assert!(
            (mean - want).abs() < 1e-3,
            "{what} at step {step}: mean {mean} vs {want}: {tip}"
        );
        let (min, max) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        assert!(
            lo <= min + 1e-4 && hi >= max - 1e-4,
            "{what} at {step}: [{lo}, {hi}] vs {values:?}"
        );
        assert!(
            (lo - min).abs() < 1e-3 && (hi - max).abs() < 1e-3,
            "{what} at {step}: tight band"
        );
        (mean, lo, hi)
    };
    for step in [3, 17, 50, 88, 121, 140] {
        check(&mut page, step, "history");
    }
    page.screenshot("views-group-band");

    // Live: the band moves as the seeds stream.
    log(150, 300);
    wait_hooks(
        &mut page,
        "the group's live edge",
        "loss",
        "h.lastStep == 299",
    );
    for step in [160, 222, 297] {
        check(&mut page, step, "live");
    }

    // The members on demand, in the group's shades; a standard-deviation band.
    page.eval("document.querySelector('input.group-members').click()");
    let shown = wait_hooks(
        &mut page,
        "the members too",
        "loss",
        "h.lines.split('|').length == 5",
    );
    assert!(
        shown["lines"].as_str().unwrap().contains("wide-seed1"),
        "{shown}"
    );
    set_value(&mut page, "select.group-band", "std", "change");
    page.wait(
        "the std band in the address",
        Duration::from_secs(15),
        "location.search.includes('band=std')",
    );
    let step = 88;
    let h = hooks(&mut page, "loss");
    let (x, y) = at_x(&h, step as f64);
    page.mouse_move(x, y);
    let tip = page.wait(
        "the std band",
        Duration::from_secs(15),
        &format!(
            "(() => {{ const t = document.querySelector('[data-testid=tooltip]'); \
             return t && t.textContent.includes('step {step} ') ? t.textContent : null; }})()"
        ),
    );
    let (mean, lo, hi) = band_of(tip.as_str().unwrap(), &format!("{group}: "));
    let values: Vec<f64> = (0..3).map(|k| seed_loss(k, step)).collect();
    let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 3.0).sqrt();
    assert!(
        (hi - mean - std).abs() < 2e-3 && (mean - lo - std).abs() < 2e-3,
        "{tip}"
    );
    page.screenshot("views-group-members");
    for run in seeds {
        assert!(run.finish(Outcome::Finished).delivered);
    }
    assert!(alone.finish(Outcome::Finished).delivered);
}

#[test]
fn parallel_coordinates_brush_runs_by_their_config_and_a_scatter_places_each() {
    let hub = Hub::start(&[]);
    // lr, optimizer and where each run's loss ends (the lowest there too: it only falls).
    let runs = [
        (0.1, "adam", 0.9),
        (0.2, "sgd", 0.5),
        (0.3, "adam", 0.7),
        (0.4, "sgd", 1.1),
    ];
    let mut ids = Vec::new();
    let mut names = Vec::new();
    for (k, (lr, opt, last)) in runs.iter().enumerate() {
        let mut o = Options::new(&hub.ws(), "views", &format!("hp-{k}"));
        o.config_json =
            serde_json::json!({"lr": lr, "optim": {"name": opt}, "batch": 32}).to_string();
        let run = Collector::start(o).unwrap();
        for step in 0..50 {
            run.log(
                step,
                &[("loss", last + 1.0 / (1.0 + step as f64) - 1.0 / 50.0)],
            );
        }
        ids.push(run.run_id().to_string());
        names.push(format!("hp-{k}"));
        assert!(run.finish(Outcome::Finished).delivered);
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut page = open_run(&hub, &refs, "");
    wait_hooks(
        &mut page,
        "four lines",
        "loss",
        "h.lines.split('|').length == 4",
    );
    page.eval("document.querySelector('details.hparams summary').click()");
    let hooks = |page: &mut Browser| {
        page.eval(
            "(() => { const c = document.querySelector('canvas.hp-parallel'); if (!c || !c.dataset.axes) return null; \
             const r = c.getBoundingClientRect(); return { left: r.left, top: r.top, ...c.dataset }; })()",
        )
    };
    // The keys that differ (not `batch`), then the loss's last value.
    page.wait(
        "the axes",
        Duration::from_secs(30),
        "(() => { const c = document.querySelector('canvas.hp-parallel'); \
         return c && c.dataset.axes == 'lr|optim.name|loss (last)'; })()",
    );
    page.eval("document.querySelector('canvas.hp-parallel').scrollIntoView({ block: 'center' })");
    let h = hooks(&mut page);
    let num = |k: &str| {
        h[k].as_f64()
            .or_else(|| h[k].as_str().and_then(|v| v.parse().ok()))
            .unwrap_or_else(|| panic!("{k} in {h}"))
    };
    let x = num("left")
        + h["axisXs"]
            .as_str()
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap();
    let range: Vec<f64> = h["ranges"]
        .as_str()
        .unwrap()
        .split('|')
        .next()
        .unwrap()
        .split(':')
        .map(|v| v.parse().unwrap())
        .collect();
    let (top, bottom) = (num("top"), num("bottom"));
    let y = |v: f64| bottom - (v - range[0]) / (range[1] - range[0]) * (bottom - top);
    let page_top = page
        .eval("document.querySelector('canvas.hp-parallel').getBoundingClientRect().top")
        .as_f64()
        .unwrap();
    // Brush lr over 0.15..0.35: the runs of lr 0.2 and 0.3.
    page.drag((x, page_top + y(0.35)), (x, page_top + y(0.15)), "left", 0);
    let picked = page.wait(
        "two runs brushed",
        Duration::from_secs(15),
        "(() => { const p = document.querySelector('canvas.hp-parallel').dataset.picked; \
         return p && p.split(',').length == 2 ? p : null; })()",
    );
    let picked: Vec<&str> = picked.as_str().unwrap().split(',').collect();
    assert!(
        picked.contains(&ids[1].as_str()) && picked.contains(&ids[2].as_str()),
        "{picked:?}"
    );

    // The scatter: each run at its lr and last loss.
    let points = page.wait(
        "the scatter",
        Duration::from_secs(15),
        "(() => { const c = document.querySelector('canvas.hp-scatter'); \
         return c && c.dataset.points && c.dataset.points.split('|').length == 4 ? c.dataset.points : null; })()",
    );
    let points = points.as_str().unwrap();
    for (k, (lr, _, last)) in runs.iter().enumerate() {
        let want = format!("{}:{lr:.4}:{last:.4}", names[k]);
        assert!(points.contains(&want), "{want} in {points}");
    }
    page.screenshot("views-hparams");

    // The brushed runs become the selection.
    page.eval("document.querySelector('button.hp-select').click()");
    page.wait(
        "two runs selected",
        Duration::from_secs(15),
        "document.querySelectorAll('tr.run.selected').length == 2",
    );
    let search = page.eval("location.search").as_str().unwrap().to_string();
    assert!(
        search.contains(&ids[1]) && search.contains(&ids[2]) && !search.contains(&ids[0]),
        "{search}"
    );
}

/// The tooltip's value for `label` after hovering `step` on the loss chart.
fn hovered(page: &mut Browser, step: f64, label: &str) -> f64 {
    let h = hooks(page, "loss");
    let (x, y) = at_x(&h, step);
    let mut tip = String::new();
    for attempt in 0..50 {
        page.mouse_move(x, y + (attempt % 2) as f64);
        tip = page
            .eval("(() => { const t = document.querySelector('[data-testid=tooltip]'); return t ? t.textContent : ''; })()")
            .as_str()
            .unwrap_or_default()
            .to_string();
        if tip.contains(&format!("step {} ", step as i64)) {
            return value_of(&tip, label);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no tooltip at step {step}: {tip:?}");
}

#[test]
fn a_resumed_run_is_drawn_as_its_latest_segment_with_a_marker_and_all_segments_on_demand() {
    let hub = Hub::start(&[]);
    let run = Collector::start(Options::new(&hub.ws(), "views", "resumed")).unwrap();
    // Steps 0-99, then resumed from a checkpoint at step 60 and on to 149.
    for step in 0..100 {
        run.log(step, &[("loss", 2.0 - step as f64 * 0.01)]);
    }
    for step in 60..150 {
        run.log(step, &[("loss", 3.0)]);
    }
    run.flush();
    let id = run.run_id().to_string();
    let mut page = open_run(&hub, &[&id], "");
    let h = wait_hooks(
        &mut page,
        "the run drawn",
        "loss",
        "h.lastStep == 149 && h.notes >= 1",
    );
    assert_eq!(h["lines"], "resumed", "{h}");
    assert_eq!(h["x0"].as_f64(), Some(0.0), "{h}");
    assert!((h["x1"].as_f64().unwrap() - 149.0).abs() < 1e-9, "{h}");
    // The latest segment over the overlap; the first before it.
    assert_eq!(hovered(&mut page, 80.0, "resumed"), 3.0);
    assert!((hovered(&mut page, 30.0, "resumed") - 1.7).abs() < 1e-9);

    // Resumed again, live, at step 130: a second marker, the newest values from there.
    for step in 130..200 {
        run.log(step, &[("loss", 4.0)]);
    }
    run.flush();
    wait_hooks(
        &mut page,
        "the second resume",
        "loss",
        "h.notes >= 2 && h.lastStep == 199",
    );
    assert_eq!(hovered(&mut page, 140.0, "resumed"), 4.0);
    assert_eq!(hovered(&mut page, 100.0, "resumed"), 3.0);
    page.screenshot("views-resumed");

    // Every segment on demand, each a line of its own.
    page.eval("document.querySelector('input.all-segments').click()");
    let all = wait_hooks(
        &mut page,
        "all segments",
        "loss",
        "h.lines.split('|').length == 3",
    );
    assert_eq!(
        all["lines"], "resumed · segment 1|resumed · segment 2|resumed · segment 3",
        "{all}"
    );
    assert!(page
        .eval("location.search")
        .as_str()
        .unwrap()
        .contains("segments=all"));
    assert!(run.finish(Outcome::Finished).delivered);
}

#[test]
fn the_run_list_filters_on_a_metric_adds_columns_sorts_by_them_exports_csv_and_windows_many_runs() {
    let hub = Hub::start(&[]);
    // Twelve runs: lr 0.001 k, val_loss ending at 3 - 0.1 k.
    for k in 0..12 {
        let mut o = Options::new(&hub.ws(), "table", &format!("t{k:02}"));
        o.config_json = serde_json::json!({"optim": {"lr": 0.001 * k as f64}}).to_string();
        let run = Collector::start(o).unwrap();
        run.log(0, &[("loss", 5.0), ("val_loss", 3.5)]);
        run.log(1, &[("loss", 4.0), ("val_loss", 3.0 - 0.1 * k as f64)]);
        assert!(run.finish(Outcome::Finished).delivered);
    }
    let mut page = Browser::open(&format!(
        "http://{}/?lang=en&cols=val_loss,optim.lr",
        hub.addr()
    ));
    page.wait(
        "twelve runs listed",
        Duration::from_secs(30),
        "document.querySelectorAll('tr.run').length == 12",
    );
    // A filter on a metric's last value, spaces and all.
    set_value(&mut page, "input.search", "val_loss < 2.45", "input");
    page.wait(
        "six runs pass",
        Duration::from_secs(15),
        "document.querySelectorAll('tr.run').length == 6",
    );
    // Sorted by the added val_loss column, ascending: t11 (1.9) first.
    page.eval("document.querySelector('th.extra[data-column=\"val_loss\"]').click()");
    let names = page.wait(
        "sorted by val_loss",
        Duration::from_secs(15),
        "(() => { const n = [...document.querySelectorAll('tr.run td:nth-child(3)')].map(t => t.textContent); \
         return n[0] == 't11' ? n : null; })()",
    );
    assert_eq!(
        names,
        serde_json::json!(["t11", "t10", "t09", "t08", "t07", "t06"])
    );
    let lr = page.eval(
        "[...document.querySelector('tr.run').querySelectorAll('td.extra')].map(t => t.textContent)",
    );
    assert_eq!(lr, serde_json::json!(["1.9000", "0.011"]));
    assert!(page
        .eval("location.search")
        .as_str()
        .unwrap()
        .contains("cols=val_loss%2Coptim.lr"));

    // The listed runs as CSV.
    let dir = tempfile::tempdir().unwrap();
    page.allow_downloads(dir.path());
    page.eval("document.querySelector('button.csv').click()");
    let file = dir.path().join("runs.csv");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !file.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let csv = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "run_id,project,name,status,last_step,started_at,val_loss,optim.lr"
    );
    assert_eq!(lines.len(), 7, "{csv}");
    assert!(
        lines[1].contains(",t11,finished,1,") && lines[1].ends_with(",1.9000,0.011"),
        "{csv}"
    );

    // Many runs: only those in view are drawn, and scrolling brings the last.
    for k in 0..170 {
        let run = Collector::start(Options::new(&hub.ws(), "many", &format!("m{k:03}"))).unwrap();
        run.log(0, &[("loss", k as f64)]);
        assert!(run.finish(Outcome::Finished).delivered);
    }
    set_value(&mut page, "input.search", "many", "input");
    page.eval("document.querySelector('th[data-sort=\"name\"]').click()");
    let drawn = page.wait(
        "a window of the 170 runs",
        Duration::from_secs(30),
        "(() => { const r = document.querySelectorAll('tr.run').length; \
         return r > 0 && r < 170 && document.querySelector('tr.spacer') ? r : null; })()",
    );
    assert!(drawn.as_u64().unwrap() < 150, "{drawn}");
    page.eval("(() => { const s = document.querySelector('.run-scroll'); s.scrollTop = s.scrollHeight; })()");
    page.wait(
        "the last run in view",
        Duration::from_secs(15),
        "[...document.querySelectorAll('tr.run td:nth-child(3)')].some(t => t.textContent == 'm169')",
    );
}
