//! Commands for a running training through the real hub: delivered once across a hub
//! restart and while the collector is away, answered into the run's timeline (API and
//! viewers), refused to a token of another project, and, in a cluster, sent through one hub
//! to a collector on another.

use crate::util::*;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::*;

/// `POST /api/runs/{id}/commands` with `body`; the status and the JSON answer.
pub fn command(
    addr: &str,
    run_id: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let r = http_request_body(
        addr,
        "POST",
        &format!("/api/runs/{run_id}/commands"),
        &headers,
        body.as_bytes(),
    );
    let json = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    (r.status, json)
}

/// The run's commands as the API lists them: (id, action, state).
fn timeline(hub: &Hub, run_id: &str) -> Vec<(u64, String, String)> {
    hub.json(&format!("/api/runs/{run_id}/commands"))["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_u64().unwrap(),
                c["action"].as_str().unwrap().to_string(),
                c["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn state_of(hub: &Hub, run_id: &str, id: u64) -> Option<String> {
    timeline(hub, run_id)
        .into_iter()
        .find(|c| c.0 == id)
        .map(|c| c.2)
}

/// Takes the commands delivered within `limit`, polling as a training's steps would.
fn take_within(run: &Collector, limit: Duration) -> Vec<stepstream_protocol::Command> {
    let deadline = std::time::Instant::now() + limit;
    let mut taken = Vec::new();
    while std::time::Instant::now() < deadline {
        taken.extend(run.take_commands());
        std::thread::sleep(Duration::from_millis(20));
    }
    taken
}

#[test]
fn a_command_is_acted_on_once_across_a_hub_restart_and_when_queued_while_its_collector_is_away() {
    let mut hub = Hub::start(&[]);
    let mut opts = Options::new(&hub.ws(), "p", "commanded");
    opts.run_id = Some(RunId::new("commanded-1").unwrap());
    let run = Collector::start(opts.clone()).unwrap();
    run.log(0, &[("loss", 1.0)]);
    run.flush();
    wait_for("the run", Duration::from_secs(20), || {
        hub.run_json("commanded-1")
    });
    let mut viewer = Viewer::connect(&hub);
    viewer.subscribe(&[RunId::new("commanded-1").unwrap()], None);

    // Delivered while connected: the hub marks it delivered; the training has not taken it.
    let (status, body) = command(
        &hub.addr(),
        "commanded-1",
        r#"{"action":"checkpoint","by":"ann","reason":"before lr change"}"#,
        None,
    );
    assert_eq!(status, 201, "{body}");
    let first = body["commands"][0]["id"].as_u64().unwrap();
    wait_for("delivered", Duration::from_secs(10), || {
        (state_of(&hub, "commanded-1", first)? == "delivered").then_some(())
    });
    // Viewers saw it queued, then delivered, live (a state may come twice when the viewer's
    // subscription read the stored timeline as the command was queued: viewers key by id).
    let id = RunId::new("commanded-1").unwrap();
    let told = |v: &Viewer| {
        let mut states = v.commands(&id, first);
        states.dedup();
        states
    };
    assert!(
        viewer.pump(Duration::from_secs(10), |v| told(v)
            == [CommandState::Queued, CommandState::Delivered]),
        "{:?}",
        viewer.commands(&id, first)
    );
    // The hub dies and comes back: it delivers the unanswered command again; the training
    // takes it once.
    hub.kill9();
    hub.restart();
    run.log(1, &[("loss", 0.9)]);
    run.flush();
    let taken = take_within(&run, Duration::from_secs(3));
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].id, first);
    assert_eq!(taken[0].action, Action::Checkpoint);
    assert_eq!(
        (taken[0].by.as_str(), taken[0].reason.as_str()),
        ("ann", "before lr change")
    );
    run.command_done(first, true, "saved /ckpt/step1");
    wait_for("honoured", Duration::from_secs(10), || {
        (state_of(&hub, "commanded-1", first)? == "honoured").then_some(())
    });
    let listed = hub.json("/api/runs/commanded-1/commands");
    assert_eq!(listed["commands"][0]["step"], 1, "{listed}");
    assert_eq!(listed["commands"][0]["message"], "saved /ckpt/step1");
    // Restarted again: an honoured command is not delivered again.
    hub.kill9();
    hub.restart();
    run.log(2, &[("loss", 0.8)]);
    run.flush();
    assert!(take_within(&run, Duration::from_secs(2)).is_empty());

    // The collector goes away (its process dies without finishing); a stop is queued for it.
    drop(run); // finishes: a new run id for the away case
    let mut raw = RawCollector::connect(&hub);
    raw.send(hello("away-1", None));
    assert!(matches!(raw.recv(), Some(FromHub::Welcome(_))));
    drop(raw);
    let (status, body) = command(
        &hub.addr(),
        "away-1",
        r#"{"action":"stop","checkpoint":false,"by":"bob"}"#,
        None,
    );
    assert_eq!(status, 201, "{body}");
    let stop = body["commands"][0]["id"].as_u64().unwrap();
    assert_eq!(state_of(&hub, "away-1", stop).as_deref(), Some("queued"));
    // It comes back (the same run resumed by a new process): the stop is delivered once.
    let mut opts = Options::new(&hub.ws(), "tests", "away");
    opts.run_id = Some(RunId::new("away-1").unwrap());
    let back = Collector::start(opts).unwrap();
    back.log(0, &[("loss", 1.0)]);
    back.flush();
    let taken = take_within(&back, Duration::from_secs(3));
    assert_eq!(
        taken.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![stop],
        "{:?} {:?}",
        timeline(&hub, "away-1"),
        back.last_error()
    );
    assert_eq!(back.stop_command().map(|c| c.id), Some(stop));
    back.command_done(stop, true, "stopped at step 0");
    let report = back.finish(Outcome::Stopped("stopped by bob".into()));
    assert!(report.delivered, "{report:?}");
    let info = hub.run_json("away-1").unwrap();
    assert_eq!(info["status"], "stopped", "{info}");
    assert_eq!(info["status_message"], "stopped by bob");
    assert_eq!(state_of(&hub, "away-1", stop).as_deref(), Some("honoured"));
    // An ended run takes no command.
    let (status, body) = command(&hub.addr(), "away-1", r#"{"action":"checkpoint"}"#, None);
    assert_eq!(status, 409, "{body}");

    // A viewer subscribing now is told the timeline as stored.
    let mut viewer = Viewer::connect(&hub);
    viewer.subscribe(std::slice::from_ref(&id), None);
    assert!(
        viewer.pump(Duration::from_secs(10), |v| v.commands(&id, first)
            == [CommandState::Honoured]),
        "{:?}",
        viewer.commands(&id, first)
    );
}

#[test]
fn only_a_write_token_of_the_runs_project_may_command_it() {
    let scoped = "[[tokens]]\ntoken = \"w-a\"\naccess = \"write\"\nprojects = [\"a\"]\n\
                  [[tokens]]\ntoken = \"w-b\"\naccess = \"write\"\nprojects = [\"b\"]\n\
                  [[tokens]]\ntoken = \"r-a\"\naccess = \"read\"\nprojects = [\"a\"]\n";
    let hub = Hub::start_with_tokens(scoped, &[]);
    let mut opts = Options::new(&hub.ws(), "a", "guarded");
    opts.token = Some("w-a".into());
    opts.run_id = Some(RunId::new("guarded-1").unwrap());
    let run = Collector::start(opts).unwrap();
    run.log(0, &[("loss", 1.0)]);
    run.flush();
    wait_for("the run", Duration::from_secs(20), || {
        let r = http_get(&hub.addr(), "/api/runs/guarded-1", Some("r-a"));
        (r.status == 200).then_some(())
    });
    let stop = r#"{"action":"stop"}"#;
    // A write token of another project may not even read the run.
    for (token, expected) in [
        (None, 401),
        (Some("r-a"), 403),
        (Some("w-b"), 403),
        (Some("nope"), 401),
    ] {
        let (status, body) = command(&hub.addr(), "guarded-1", stop, token);
        assert_eq!(status, expected, "{token:?}: {body}");
    }
    assert!(take_within(&run, Duration::from_millis(500)).is_empty());
    // Bad requests are refused by name and queue nothing.
    for (body, why) in [
        (r#"{"action":"reboot"}"#, "unknown action"),
        (r#"{"action":"note"}"#, "needs a text"),
        (r#"{"action":"stop","extra":1}"#, "unknown field"),
    ] {
        let (status, answer) = command(&hub.addr(), "guarded-1", body, Some("w-a"));
        assert!(status == 400 || status == 422, "{body}: {status} {answer}");
        let text = answer.to_string();
        assert!(status == 422 || text.contains(why), "{body}: {text}");
    }
    let listed = http_get(&hub.addr(), "/api/runs/guarded-1/commands", Some("r-a"));
    assert_eq!(listed.text(), r#"{"commands":[],"run_id":"guarded-1"}"#);
    let (status, body) = command(&hub.addr(), "guarded-1", stop, Some("w-a"));
    assert_eq!(status, 201, "{body}");
    let taken = take_within(&run, Duration::from_secs(2));
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].action, Action::Stop { checkpoint: true });
    run.command_done(taken[0].id, true, "");
    assert!(run.finish(Outcome::Stopped("stopped".into())).delivered);
}

/// The Python with the frameworks and the wheel (`scripts/python-wheel` makes it; the test
/// script builds it before these tests).
fn python() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/python-wheel (it installs the frameworks and the wheel)",
        p.display()
    );
    p
}

/// Every framework's real training (CPU), stopped from the page: the Stop button, the
/// confirmation, and the training stops at its next step with a checkpoint written first;
/// the page shows the run stopped and the command honoured. A note added from the page
/// shows on the charts first.
#[test]
fn trainings_of_every_framework_are_stopped_from_the_page() {
    let hub = Hub::start(&[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python/tests/frameworks/stoppable.py");
    let dir = tempfile::tempdir().unwrap();
    let frameworks = ["torch", "hf", "lightning", "keras", "paddle", "mindspore"];
    let mut trainings = Vec::new();
    for fw in frameworks {
        let out = dir.path().join(fw);
        std::fs::create_dir_all(&out).unwrap();
        let child = std::process::Command::new(python())
            .arg(&script)
            .args([fw, &hub.ws(), out.to_str().unwrap()])
            .env("PYTHONWARNINGS", "ignore")
            .current_dir(&out)
            .stdout(std::process::Stdio::piped())
            // A file, not a pipe nobody reads while it trains (its warnings would fill one).
            .stderr(std::fs::File::create(out.join("stderr.log")).unwrap())
            .spawn()
            .unwrap();
        trainings.push((fw, out, child));
    }
    let mut page = crate::browser::Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    let mut timings = Vec::new();
    for (i, (fw, out, child)) in trainings.iter_mut().enumerate() {
        let run_id = wait_for(&format!("{fw} to start"), Duration::from_secs(240), || {
            if let Ok(Some(status)) = child.try_wait() {
                let err = std::fs::read_to_string(out.join("stderr.log")).unwrap_or_default();
                panic!("{fw} ended early ({status}): {err}");
            }
            let id = std::fs::read_to_string(out.join("run_id")).ok()?;
            let last = hub.run_json(&id)?["last_step"].as_i64()?;
            (last >= 3).then_some(id)
        });
        page.navigate(&format!("http://{}/?lang=en&run={run_id}", hub.addr()));
        page.wait(
            "the run panel's Stop button",
            Duration::from_secs(20),
            &format!("document.querySelector('[data-testid=commands][data-run-id=\"{run_id}\"] [data-testid=stop]') != null"),
        );
        if i == 0 {
            // A note from the page: honoured by the training, a marker on its charts.
            page.eval(
                "(() => { const t = document.querySelector('.note-text'); t.value = 'lr halved'; \
                 t.dispatchEvent(new Event('input')); document.querySelector('[data-testid=note]').click(); })()",
            );
            page.wait(
                "the note honoured and drawn",
                Duration::from_secs(30),
                "document.querySelector('[data-testid=command-timeline] li[data-state=honoured]') != null && \
                 +(document.querySelector('canvas[data-chart=loss]') || {dataset: {}}).dataset.notes > 0",
            );
            page.screenshot("note-on-the-chart");
        }
        page.eval(
            "(() => { const r = document.querySelector('.reason'); r.value = 'diverging'; \
             r.dispatchEvent(new Event('input')); document.querySelector('[data-testid=stop]').click(); })()",
        );
        page.wait(
            "the confirmation",
            Duration::from_secs(5),
            "document.querySelector('[data-testid=confirm]') != null",
        );
        let clicked = page.eval("(() => { document.querySelector('[data-testid=confirm]').click(); return Date.now() / 1000; })()");
        let clicked = clicked.as_f64().unwrap();
        page.wait(
            &format!("{fw} shown stopped"),
            Duration::from_secs(120),
            "(document.querySelector('[data-field=status]') || {className: ''}).className.includes('stopped')",
        );
        let output = child.wait_with_output_ref(&out.join("stderr.log"));
        let ended: serde_json::Value =
            serde_json::from_str(output.lines().last().unwrap_or("{}")).unwrap();
        timings.push((
            fw.to_string(),
            ended["ended_at"].as_f64().unwrap() - clicked,
        ));
        assert!(
            !ended["checkpoints"].as_array().unwrap().is_empty(),
            "{fw}: {ended}"
        );
        let info = hub.run_json(&run_id).unwrap();
        assert_eq!(info["status"], "stopped", "{fw}: {info}");
        assert!(
            info["status_message"]
                .as_str()
                .unwrap()
                .contains("diverging"),
            "{info}"
        );
        let commands = hub.json(&format!("/api/runs/{run_id}/commands"));
        let stop = commands["commands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["action"] == "stop")
            .unwrap();
        assert_eq!(stop["state"], "honoured", "{fw}: {commands}");
        assert!(
            stop["message"].as_str().unwrap().contains("saved"),
            "{fw}: {stop}"
        );
        page.wait(
            "the stop honoured in the page's timeline",
            Duration::from_secs(10),
            "[...document.querySelectorAll('[data-testid=command-timeline] li')].some(l => l.dataset.state == 'honoured' && l.textContent.startsWith('stop'))",
        );
        // Stopped: the page offers no more buttons.
        assert_eq!(
            page.eval("document.querySelector('[data-testid=stop]') == null"),
            true
        );
    }
    for (fw, s) in &timings {
        println!("click to the training's stop, {fw}: {:.0} ms", s * 1000.0);
    }
}

trait WaitOutput {
    /// Waits for the child's end; its stdout (it must exit 0, else its stderr is shown).
    fn wait_with_output_ref(&mut self, stderr: &std::path::Path) -> String;
}

impl WaitOutput for std::process::Child {
    fn wait_with_output_ref(&mut self, stderr: &std::path::Path) -> String {
        let mut out = String::new();
        std::io::Read::read_to_string(self.stdout.as_mut().unwrap(), &mut out).unwrap();
        let err = std::fs::read_to_string(stderr).unwrap_or_default();
        let status = self.wait().unwrap();
        assert!(
            status.success(),
            "{status}: {}",
            &err[err.len().saturating_sub(4000)..]
        );
        out
    }
}

/// A distributed job's ranks stopped from its row in the run list: one confirmation, a stop
/// for every live rank, each rank's training answers and ends `stopped`.
#[test]
fn a_jobs_ranks_are_stopped_from_its_row_in_the_run_list() {
    let hub = Hub::start(&[]);
    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let mut opts = Options::new(&hub.ws(), "jobs", "ddp");
            opts.job = Some("job-7".into());
            opts.rank = rank;
            opts.world_size = 2;
            let run = Collector::start(opts).unwrap();
            std::thread::spawn(move || {
                for step in 0..100_000 {
                    run.log(step, &[("loss", 1.0)]);
                    if let Some(stop) = run
                        .take_commands()
                        .into_iter()
                        .find(|c| matches!(c.action, Action::Stop { .. }))
                    {
                        run.command_done(stop.id, true, &format!("stopped at step {step}"));
                        let why = format!("stopped by {}: {}", stop.by, stop.reason);
                        return run.finish(Outcome::Stopped(why));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                run.finish(Outcome::Finished)
            })
        })
        .collect();
    let mut page = crate::browser::Browser::open(&format!("http://{}/?lang=en", hub.addr()));
    page.wait(
        "the job's row with its stop button",
        Duration::from_secs(20),
        "document.querySelector('tr.job[data-job=\"job-7\"][data-ranks=\"2\"] button.job-stop') != null",
    );
    page.eval("document.querySelector('tr.job[data-job=\"job-7\"] button.job-stop').click()");
    page.wait(
        "the confirmation",
        Duration::from_secs(5),
        "document.querySelector('tr.job[data-job=\"job-7\"] .confirm-job-stop') != null",
    );
    page.eval("document.querySelector('tr.job[data-job=\"job-7\"] .confirm-job-stop').click()");
    for r in ranks {
        let report = r.join().unwrap();
        assert!(report.delivered, "{report:?}");
    }
    let runs = hub.json("/api/runs");
    let mut stopped = 0;
    for r in runs["runs"].as_array().unwrap() {
        assert_eq!(r["status"], "stopped", "{r}");
        assert!(
            r["status_message"]
                .as_str()
                .unwrap()
                .contains("job job-7 stopped from the run list"),
            "{r}"
        );
        stopped += 1;
    }
    assert_eq!(stopped, 2);
}

/// A rule action pending when its hub is SIGKILLed is not forgotten: the restarted hub finds
/// it in what it stored (the alert, no acknowledgement, no command of the rule's yet) and
/// acts when what was left of the grace period has passed.
#[test]
fn a_rule_action_pending_across_a_hub_restart_is_carried_out_once() {
    let dir = tempfile::tempdir().unwrap();
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        "[actions.non_finite]\nact = \"stop\"\ngrace_s = 4\n",
    )
    .unwrap();
    let mut hub = Hub::start(&["--alerts", alerts.to_str().unwrap()]);
    let mut opts = Options::new(&hub.ws(), "p", "nan");
    opts.run_id = Some(RunId::new("nan-across").unwrap());
    let run = Collector::start(opts).unwrap();
    for step in 0..5 {
        run.log(step, &[("loss", 1.0)]);
    }
    run.log(5, &[("loss", f64::NAN)]);
    run.flush();
    let fired = wait_for("the NaN alert", Duration::from_secs(20), || {
        hub.run_json("nan-across")?;
        let alerts = hub.json("/api/runs/nan-across/alerts");
        alerts["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["rule"] == "non_finite" && a["state"] == "fired")
            .and_then(|a| a["at"].as_f64())
    });
    hub.kill9();
    hub.restart();
    let mut step = 6;
    let mut taken = Vec::new();
    wait_for(
        "the rule's stop after the restart",
        Duration::from_secs(20),
        || {
            run.log(step, &[("loss", 1.0)]);
            step += 1;
            taken.extend(run.take_commands());
            std::thread::sleep(Duration::from_millis(20));
            (!taken.is_empty()).then_some(())
        },
    );
    let waited = stepstream_protocol::unix_now() - fired;
    assert!(
        waited >= 3.9,
        "acted after {waited:.2} s, before the grace period passed"
    );
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].by, "rule:non_finite");
    run.command_done(taken[0].id, true, "stopped");
    // Once: no second stop comes, the restarted hub's and a stale timer's alike.
    assert!(take_within(&run, Duration::from_secs(1)).is_empty());
    assert!(
        run.finish(Outcome::Stopped("stopped by rule:non_finite".into()))
            .delivered
    );
    let commands = hub.json("/api/runs/nan-across/commands");
    assert_eq!(
        commands["commands"].as_array().unwrap().len(),
        1,
        "{commands}"
    );
}
