//! `GET /metrics`: Prometheus's text format, behind the read token, scoped like the API.

use crate::util::*;
use stepstream_collector::{Collector, Options, Outcome};

fn stream(hub: &Hub, project: &str, name: &str, steps: i64) -> String {
    let mut o = Options::new(&hub.ws(), project, name);
    o.token = Some("w".into());
    let run = Collector::start(o).unwrap();
    for step in 0..steps {
        run.log(step, &[("loss", 1.0 / (step + 1) as f64), ("lr", 0.5)]);
    }
    let id = run.run_id().to_string();
    assert!(run.finish(Outcome::Finished).delivered);
    id
}

#[test]
fn metrics_for_prometheus_are_guarded_and_scoped() {
    let hub = Hub::start_with_tokens(
        "[[tokens]]\ntoken = \"nlp\"\naccess = \"read\"\nprojects = [\"nlp\"]\n",
        &[],
    );
    let vision = stream(&hub, "vision", "resnet", 40);
    let nlp = stream(&hub, "nlp", "bert", 10);
    assert_eq!(http_get(&hub.addr(), "/metrics", None).status, 401);
    let all = http_get(&hub.addr(), "/metrics", Some("r"));
    assert_eq!(all.status, 200);
    let text = all.text();
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    let line = |name: &str, run: &str, extra: &str| {
        text.lines()
            .find(|l| {
                l.starts_with(name) && l.contains(&format!("run_id=\"{run}\"")) && l.contains(extra)
            })
            .unwrap_or_else(|| panic!("no {name} {extra} for {run} in\n{text}"))
            .to_string()
    };
    assert!(line("stepstream_run_last_step", &vision, "").ends_with(" 39"));
    assert!(line("stepstream_run_metric", &vision, "metric=\"loss\"").ends_with(" 0.025"));
    assert!(line("stepstream_run_status", &vision, "status=\"finished\"").ends_with(" 1"));
    assert!(line("stepstream_run_status", &vision, "status=\"running\"").ends_with(" 0"));
    assert!(line("stepstream_run_records_total", &nlp, "").ends_with(" 10"));
    assert!(line("stepstream_run_steps_per_second", &vision, "").contains("project=\"vision\""));
    assert!(text.contains("stepstream_storage_bytes "), "{text}");
    assert!(
        text.contains("stepstream_sockets{kind=\"viewer\"} 0"),
        "{text}"
    );
    // A token scoped to one project sees that project's runs only.
    let scoped = http_get(&hub.addr(), "/metrics", Some("nlp")).text();
    assert!(
        scoped.contains(&nlp) && !scoped.contains(&vision),
        "{scoped}"
    );
    assert!(scoped.contains("stepstream_runs 1"), "{scoped}");
}
