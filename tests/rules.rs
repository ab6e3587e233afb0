//! Alert rules made in the page, in Chromium against the real hub: a rule written in the
//! form, previewed on the selected run's history, a test notice at a real HTTP receiver,
//! saved and in force within a second on a live run; the alert acknowledged from the page;
//! the operator's file shown read-only and no channel secret anywhere in the page.

use crate::browser::Browser;
use crate::util::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::RunId;

/// A real HTTP receiver: every JSON body POSTed to it, with when it came.
pub struct Receiver {
    pub port: u16,
    pub bodies: Arc<Mutex<Vec<(serde_json::Value, Instant)>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                if let Ok(v) = serde_json::from_slice(&body) {
                    kept.lock().unwrap().push((v, Instant::now()));
                }
                let _ = reader.into_inner().write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        Receiver { port, bodies }
    }

    /// How many notices with this `rule` and `state` came.
    pub fn count(&self, rule: &str, state: &str) -> usize {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .filter(|(b, _)| b["rule"] == rule && b["state"] == state)
            .count()
    }

    /// The first notice whose `rule` and `state` are these.
    pub fn find(&self, rule: &str, state: &str) -> Option<(serde_json::Value, Instant)> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .find(|(b, _)| b["rule"] == rule && b["state"] == state)
            .cloned()
    }
}

fn set(page: &mut Browser, selector: &str, value: &str) {
    page.eval(&format!(
        "(() => {{ const e = document.querySelector('{selector}'); e.value = {value:?}; \
         e.dispatchEvent(new Event(e.tagName == 'SELECT' ? 'change' : 'input')); }})()"
    ));
}

#[test]
fn a_rule_made_in_the_page_is_previewed_tested_and_in_force_within_a_second() {
    let hook = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        format!(
            "[[channels]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook?key=SECRETKEY42\"\n\
             [actions.divergence]\nact = \"stop\"\ngrace_s = 600\n",
            hook.port
        ),
    )
    .unwrap();
    let hub = Hub::start(&["--alerts", alerts.to_str().unwrap()]);
    let mut opts = Options::new(&hub.ws(), "rules", "rising");
    opts.run_id = Some(RunId::new("rising-1").unwrap());
    let run = Collector::start(opts).unwrap();
    // A loss that rises by 0.01 a step: above 0.5 from step 51.
    for step in 0..100 {
        run.log(step, &[("loss", step as f64 * 0.01)]);
    }
    run.flush();
    wait_for("the history", Duration::from_secs(20), || {
        (hub.run_json("rising-1")?["last_step"].as_i64()? == 99).then_some(())
    });
    let mut page = Browser::open(&format!("http://{}/?lang=en&run=rising-1", hub.addr()));
    page.wait(
        "the rules form",
        Duration::from_secs(20),
        "document.querySelector('[data-testid=rules]') != null",
    );
    page.eval("document.querySelector('[data-testid=rules]').open = true");
    page.wait(
        "the operator's file and the channel kinds",
        Duration::from_secs(10),
        "document.querySelector('[data-testid=operator-toml]').textContent.includes('[actions.divergence]') && \
         document.querySelector('.rule-channel[value=webhook]') != null && \
         document.querySelector('.rule-kind option[value=\"builtin:divergence\"]') != null",
    );
    set(&mut page, ".rule-name", "loss high");
    set(&mut page, ".rule-metric", "loss");
    set(&mut page, ".rule-kind", "above");
    set(&mut page, ".rule-value", "0.5");
    set(&mut page, ".rule-consecutive", "3");
    page.eval("document.querySelector('.rule-channel[value=webhook]').click()");
    page.eval("document.querySelector('[data-testid=rule-preview-button]').click()");
    let preview = page.wait(
        "the preview",
        Duration::from_secs(10),
        "document.querySelector('[data-testid=rule-preview]').textContent",
    );
    assert_eq!(preview, "would have fired — loss: at steps 53", "{preview}");
    page.screenshot("rules-panel");
    page.eval("document.querySelector('[data-testid=rule-test]').click()");
    wait_for("the test notice", Duration::from_secs(10), || {
        hook.find("custom:loss high", "test")
    });
    // Saved: in force on the live run within a second of the save's answer.
    page.eval("document.querySelector('[data-testid=rule-save]').click()");
    page.wait(
        "saved",
        Duration::from_secs(10),
        "document.querySelector('[data-testid=rule-said]').textContent.includes('saved') && \
         document.querySelectorAll('[data-testid=page-rules] li').length == 1",
    );
    let saved = Instant::now();
    let mut step = 100;
    let (_, fired_at) = wait_for(
        "the rule's alert at the receiver",
        Duration::from_secs(10),
        || {
            run.log(step, &[("loss", step as f64 * 0.01)]);
            run.flush();
            step += 1;
            std::thread::sleep(Duration::from_millis(20));
            hook.find("custom:loss high", "fired")
        },
    );
    let took = fired_at.duration_since(saved);
    println!("saved to notified: {} ms", took.as_millis());
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The page never holds a channel's address or key.
    assert_eq!(
        page.eval("document.documentElement.outerHTML.includes('SECRETKEY42')"),
        false
    );
    let listed = hub.get("/api/projects/rules/rules").text();
    assert!(
        !listed.contains("SECRETKEY42") && !listed.contains("/hook"),
        "{listed}"
    );
    // Acknowledged from the page.
    page.wait(
        "the alert listed",
        Duration::from_secs(10),
        "document.querySelector('[data-testid=run-alerts] li[data-rule=\"custom:loss high\"] .ack') != null",
    );
    page.eval("document.querySelector('[data-testid=run-alerts] li[data-rule=\"custom:loss high\"] .mute').click()");
    page.wait(
        "acknowledged",
        Duration::from_secs(10),
        "document.querySelector('[data-testid=command-result]').textContent.includes('muted 4 h')",
    );
    let acks = hub.json("/api/runs/rising-1/alerts")["acks"].clone();
    assert_eq!(acks[0]["rule"], "custom:loss high", "{acks}");
    assert!(
        acks[0]["mute_until"].as_f64().unwrap() > stepstream_protocol::unix_now() + 3.9 * 3600.0
    );
    // Deleted from the page: no longer judged.
    page.eval("document.querySelector('[data-testid=page-rules] li .delete-rule').click()");
    page.wait(
        "deleted",
        Duration::from_secs(10),
        "document.querySelectorAll('[data-testid=page-rules] li').length == 0",
    );
    assert!(hub.json("/api/projects/rules/rules")["rules"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(run.finish(Outcome::Finished).delivered);
}

/// A page rule on the hub's clock: a metric without a new point for its seconds fires once
/// (the training hangs, its heartbeats go on), and resolves when points come again.
#[test]
fn a_stale_page_rule_fires_on_the_hubs_clock_and_resolves_when_points_come_back() {
    let hook = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        format!("[[channels]]\nkind = \"webhook\"\nname = \"oncall\"\nurl = \"http://127.0.0.1:{}/hook\"\n", hook.port),
    )
    .unwrap();
    let hub = Hub::start(&["--alerts", alerts.to_str().unwrap()]);
    let rule = r#"{"rule":{"name":"eval silent","metric":"eval_*","when":{"stale":{"seconds":2}},"channels":["oncall"]}}"#;
    let r = http_request_body(
        &hub.addr(),
        "POST",
        "/api/projects/p/rules",
        &[("Content-Type", "application/json")],
        rule.as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut opts = Options::new(&hub.ws(), "p", "hangs");
    opts.run_id = Some(RunId::new("hangs-1").unwrap());
    let run = Collector::start(opts).unwrap();
    run.log(0, &[("loss", 1.0), ("eval_acc", 0.5)]);
    run.flush();
    let last = Instant::now();
    // Only the loss comes now: the evaluation went quiet.
    let (_, fired) = wait_for("the stale rule's alert", Duration::from_secs(10), || {
        run.log(1, &[("loss", 1.0)]);
        run.flush();
        std::thread::sleep(Duration::from_millis(50));
        hook.find("custom:eval silent/eval_acc", "fired")
    });
    let after = fired.duration_since(last);
    assert!(
        after >= Duration::from_secs(2) && after < Duration::from_secs(5),
        "{after:?}"
    );
    run.log(2, &[("eval_acc", 0.6)]);
    run.flush();
    wait_for("resolved", Duration::from_secs(10), || {
        hook.find("custom:eval silent/eval_acc", "resolved")
    });
    assert_eq!(hook.count("custom:eval silent/eval_acc", "fired"), 1);
    assert!(run.finish(Outcome::Finished).delivered);
}

/// A page rule that picks one of the hub's built-in rules: on its project's runs, the
/// built-in's alerts go to the rule's channels only and carry its action (here a stop after
/// a second); other projects' runs keep the operator's channels (all) and no action. The
/// preview replays the run's history through the built-in judge; a second rule for the same
/// built-in, an unknown built-in and a metric other than `*` are refused by name.
#[test]
fn a_page_rule_on_a_built_in_rule_picks_its_channels_and_its_action_for_its_project() {
    let (oncall, team) = (Receiver::start(), Receiver::start());
    let dir = tempfile::tempdir().unwrap();
    let alerts = dir.path().join("alerts.toml");
    std::fs::write(
        &alerts,
        format!(
            "[[channels]]\nkind = \"webhook\"\nname = \"oncall\"\nurl = \"http://127.0.0.1:{}/hook\"\n\
             [[channels]]\nkind = \"webhook\"\nname = \"team\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
            oncall.port, team.port
        ),
    )
    .unwrap();
    let hub = Hub::start(&["--alerts", alerts.to_str().unwrap()]);
    let post = |body: &str| {
        http_request_body(
            &hub.addr(),
            "POST",
            "/api/projects/llm/rules",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    };
    let rule = r#"{"rule":{"name":"nan stops","metric":"*","when":{"builtin":"non_finite"},"channels":["oncall"],"action":{"act":"stop","grace_s":1}}}"#;
    let r = post(rule);
    assert_eq!(r.status, 201, "{}", r.text());
    let again = post(&rule.replace("nan stops", "nan again"));
    assert_eq!(again.status, 409, "{}", again.text());
    assert!(again.text().contains("non_finite"), "{}", again.text());
    let unknown = post(&rule.replace("\"non_finite\"", "\"nan\""));
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    assert!(
        unknown.text().contains("no built-in rule"),
        "{}",
        unknown.text()
    );
    let metric = post(&rule.replace("\"*\"", "\"loss\""));
    assert_eq!(metric.status, 400, "{}", metric.text());
    let listed = hub.json("/api/projects/llm/rules");
    assert!(listed["builtins"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b == "divergence"));

    let start = |project: &str, id: &str| {
        let mut opts = Options::new(&hub.ws(), project, id);
        opts.run_id = Some(RunId::new(id).unwrap());
        let run = Collector::start(opts).unwrap();
        for step in 0..20 {
            run.log(step, &[("loss", 2.0 - step as f64 * 0.01)]);
        }
        run.log(20, &[("loss", f64::NAN)]);
        run.flush();
        run
    };
    let mine = start("llm", "llm-nan");
    let other = start("cv", "cv-nan");
    wait_for(
        "the other project's alert on both channels",
        Duration::from_secs(10),
        || {
            (team.count("non_finite", "fired") >= 1 && oncall.count("non_finite", "fired") >= 1)
                .then_some(())
        },
    );
    let (notice, _) = wait_for(
        "the llm run's alert at oncall",
        Duration::from_secs(10),
        || {
            oncall
                .bodies
                .lock()
                .unwrap()
                .iter()
                .find(|(b, _)| b["rule"] == "non_finite" && b["run_id"] == "llm-nan")
                .cloned()
        },
    );
    assert!(
        notice["message"]
            .as_str()
            .unwrap()
            .contains("will save a checkpoint and stop"),
        "{notice}"
    );
    // The rule's action: a stop signed by the built-in rule, after its grace second.
    let stop = wait_for("the rule's stop", Duration::from_secs(10), || {
        mine.take_commands().into_iter().next()
    });
    assert_eq!(stop.by, "rule:non_finite");
    assert!(matches!(
        stop.action,
        stepstream_protocol::Action::Stop { checkpoint: true }
    ));
    // Only oncall heard of the llm run; the cv run's alert went to both and stops nothing.
    std::thread::sleep(Duration::from_millis(1500));
    let heard = |r: &Receiver, run: &str| {
        r.bodies
            .lock()
            .unwrap()
            .iter()
            .filter(|(b, _)| b["rule"] == "non_finite" && b["run_id"] == run)
            .count()
    };
    assert_eq!((heard(&oncall, "llm-nan"), heard(&team, "llm-nan")), (1, 0));
    assert_eq!((heard(&oncall, "cv-nan"), heard(&team, "cv-nan")), (1, 1));
    assert!(other.take_commands().is_empty());
    // The preview replays the history through the built-in judge.
    let preview = http_request_body(
        &hub.addr(),
        "POST",
        "/api/projects/llm/rules/preview",
        &[("Content-Type", "application/json")],
        format!(
            r#"{{"rule":{},"run_id":"llm-nan"}}"#,
            &rule[8..rule.len() - 1]
        )
        .as_bytes(),
    );
    assert_eq!(preview.status, 200, "{}", preview.text());
    let fired: serde_json::Value = serde_json::from_str(&preview.text()).unwrap();
    assert_eq!(
        fired["fired"][0]["steps"],
        serde_json::json!([20]),
        "{fired}"
    );
    mine.command_done(stop.id, true, "stopped");
    assert!(mine.finish(Outcome::Stopped("by rule".into())).delivered);
    assert!(other.finish(Outcome::Finished).delivered);
}
