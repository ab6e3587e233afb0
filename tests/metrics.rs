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
    assert!(line("stepstream_run_steps_total", &vision, "").ends_with(" 40"));
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

/// A project or run name with a `"` or a `\` once broke the whole scrape: the crate writes
/// label values as given. (Control characters are refused at the hub's door.) Every sample line must parse, and the names come back.
#[test]
fn label_values_are_escaped() {
    let hub = Hub::start_with_tokens("", &[]);
    let id = stream(&hub, "a\"b\\c", "x y \"q\"", 3);
    let text = http_get(&hub.addr(), "/metrics", Some("r")).text();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        // `name{k="v",...} value`: after the labels, one space and a number.
        let labels_end = parse_labels(l).unwrap_or_else(|| panic!("unparsable line {l:?}"));
        let value = &l[labels_end..];
        assert!(
            value.starts_with(' ') && value.trim().parse::<f64>().is_ok(),
            "{l:?}"
        );
    }
    let last = text
        .lines()
        .find(|l| l.starts_with("stepstream_run_last_step") && l.contains(&id))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(last.contains(r#"project="a\"b\\c""#), "{last}");
    assert!(last.contains(r#"name="x y \"q\"""#), "{last}");
}

/// Where a sample line's labels end (just past `}`), reading quoted values with their
/// escapes as Prometheus does; `None` for a line it would refuse.
fn parse_labels(line: &str) -> Option<usize> {
    let name_end = line.find([' ', '{'])?;
    if line.as_bytes()[name_end] == b' ' {
        return Some(name_end);
    }
    let open = name_end;
    let bytes = line.as_bytes();
    let mut i = open + 1;
    loop {
        if bytes.get(i) == Some(&b'}') {
            return Some(i + 1);
        }
        let eq = i + line[i..].find('=')?;
        if !line[i..eq]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return None;
        }
        if bytes.get(eq + 1) != Some(&b'"') {
            return None;
        }
        i = eq + 2;
        loop {
            match bytes.get(i)? {
                b'\\' => match bytes.get(i + 1)? {
                    b'\\' | b'"' | b'n' => i += 2,
                    _ => return None,
                },
                b'"' => break,
                b'\n' => return None,
                _ => i += 1,
            }
        }
        i += 1;
        match bytes.get(i)? {
            b',' => i += 1,
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}
