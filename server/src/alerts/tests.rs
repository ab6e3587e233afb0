//! Replays of healthy and sick runs through the rules.
use super::*;

/// Deterministic noise in [-1, 1].
fn noise(i: i64) -> f64 {
    let x = (i as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(17);
    (x % 20_001) as f64 / 10_000.0 - 1.0
}

struct Step {
    step: i64,
    values: Vec<(&'static str, f64)>,
}

/// A healthy run: decaying noisy loss, warmup + cosine lr, noisy grad norm, steady
/// throughput, with a config that says it warms up.
fn healthy(n: i64) -> Vec<Step> {
    (1..=n)
        .map(|s| {
            let t = s as f64;
            let lr = if s <= 100 {
                1e-3 * t / 100.0
            } else {
                1e-3 * 0.5 * (1.0 + (std::f64::consts::PI * (t - 100.0) / (n as f64 - 100.0)).cos())
            };
            Step {
                step: s,
                values: vec![
                    ("loss", 2.0 * (-t / 800.0).exp() + 0.3 + 0.05 * noise(s)),
                    ("lr", lr),
                    ("grad_norm", 1.0 + 0.3 * noise(s + 7)),
                    ("samples_per_sec", 200.0 * (1.0 + 0.1 * noise(s + 13))),
                    ("step_time", 0.05 * (1.0 + 0.2 * noise(s + 17))),
                    ("data_wait", 0.005 * (1.0 + noise(s + 19).abs())),
                ],
            }
        })
        .collect()
}

/// Replays steps; returns the fired events as (rule, step).
fn replay(steps: &[Step], config: &str) -> Vec<(&'static str, i64)> {
    let rules = Rules::default();
    let mut state = RunRules::new(config);
    let mut fired = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let f = state.findings(&rules, s.step, &s.values);
        for e in state.events(&rules, s.step, f, i as f64) {
            if let Event::Fired { rule, step, .. } = e {
                fired.push((rule, step));
            }
        }
    }
    fired
}

fn set(steps: &mut [Step], from: i64, to: i64, metric: &str, f: impl Fn(i64, f64) -> f64) {
    for s in steps.iter_mut().filter(|s| (from..=to).contains(&s.step)) {
        for v in s.values.iter_mut().filter(|(n, _)| *n == metric) {
            v.1 = f(s.step, v.1);
        }
    }
}

const CONFIG: &str = r#"{"lr": 0.001, "warmup_steps": 100}"#;

#[test]
fn healthy_noisy_runs_fire_nothing() {
    assert_eq!(replay(&healthy(3000), CONFIG), vec![]);
    // Also a run without warmup in its config, and a short one.
    let mut flat = healthy(500);
    set(&mut flat, 1, 500, "lr", |_, _| 1e-3);
    assert_eq!(replay(&flat, "{}"), vec![]);
}

#[test]
fn nan_fires_at_once() {
    let mut s = healthy(400);
    set(&mut s, 250, 250, "loss", |_, _| f64::NAN);
    assert_eq!(replay(&s, CONFIG), vec![("non_finite", 250)]);
}

#[test]
fn a_spike_fires_at_its_step() {
    let mut s = healthy(400);
    set(&mut s, 300, 300, "loss", |_, v| v * 6.0);
    assert_eq!(replay(&s, CONFIG), vec![("loss_spike", 300)]);
}

#[test]
fn divergence_fires_on_a_trend_not_a_step() {
    let mut s = healthy(1200);
    set(&mut s, 600, 1200, "loss", |step, v| {
        v * (1.0 + (step - 600) as f64 * 0.01)
    });
    let fired = replay(&s, CONFIG);
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0].0, "divergence");
    assert!((640..760).contains(&fired[0].1), "{fired:?}");
}

#[test]
fn ten_x_grad_norm_fires_after_consecutive_steps() {
    let mut s = healthy(400);
    set(&mut s, 200, 260, "grad_norm", |_, v| v * 15.0);
    assert_eq!(replay(&s, CONFIG), vec![("grad_explosion", 202)]);
}

#[test]
fn missing_warmup_and_lr_reset_on_resume() {
    let mut s = healthy(400);
    // Warmup configured but the lr starts at its peak.
    set(&mut s, 1, 100, "lr", |_, _| 1e-3);
    assert_eq!(replay(&s, CONFIG), vec![("lr_schedule", 2)]);

    // A jump from ~0 to the peak in one step.
    let mut s = healthy(400);
    set(&mut s, 1, 1, "lr", |_, _| 1e-9);
    set(&mut s, 2, 100, "lr", |_, _| 1e-3);
    assert_eq!(replay(&s, "{}"), vec![("lr_schedule", 3)]);
    // A warmup that starts at exactly 0 is fine.
    let mut s = healthy(400);
    set(&mut s, 1, 1, "lr", |_, _| 0.0);
    assert_eq!(replay(&s, "{}"), vec![]);

    // A resume at step 300 that restarts the schedule at the peak.
    let mut s = healthy(600);
    let mut resumed: Vec<Step> = healthy(600).into_iter().filter(|x| x.step > 250).collect();
    for r in resumed.iter_mut() {
        for v in r.values.iter_mut().filter(|(n, _)| *n == "lr") {
            v.1 = 1e-3;
        }
    }
    s.truncate(400);
    s.extend(resumed);
    assert_eq!(replay(&s, CONFIG).first(), Some(&("lr_schedule", 251)));
}

#[test]
fn throughput_collapse_and_stalled_data() {
    let mut s = healthy(400);
    set(&mut s, 300, 400, "samples_per_sec", |_, _| 50.0);
    assert_eq!(replay(&s, CONFIG), vec![("throughput_drop", 309)]);
    let mut s = healthy(400);
    set(&mut s, 300, 320, "step_time", |_, _| 1.5);
    assert_eq!(replay(&s, CONFIG), vec![("stalled_data", 309)]);
}

#[test]
fn accelerator_memory_near_its_limit() {
    let rules = Rules::default();
    let mut st = RunRules::new("{}");
    let ok = [("gpu0/mem_used_gb", 70.0), ("gpu0/mem_total_gb", 80.0)];
    assert!(st.findings(&rules, 1, &ok).is_empty());
    let full = [("gpu0/mem_used_gb", 79.5), ("gpu0/mem_total_gb", 80.0)];
    let f = st.findings(&rules, 2, &full);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].rule, "memory");
    assert!(f[0].message.contains("gpu0"));
}

#[test]
fn straggler_needs_a_persistently_slower_rank() {
    let rules = Rules::default();
    let mut id = stepstream_protocol::RunIdentity {
        run_id: stepstream_protocol::RunId::new("r3").unwrap(),
        project: "p".into(),
        name: "llama-rank3".into(),
        config_json: "{}".into(),
        host: "h".into(),
        rank: 3,
        world_size: 4,
        job: String::new(),
        framework: String::new(),
        started_at: 0.0,
    };
    // A name suffix is not a job: only the identity the collector sent groups ranks.
    assert_eq!(job_of(&id), None);
    id.job = "torchrun-42".into();
    assert_eq!(job_of(&id), Some(("p".into(), "torchrun-42".into())));
    let mut fast = RunRules::new("{}");
    let mut slow = RunRules::new("{}");
    let mut fired = None;
    for step in 0..200i64 {
        let t = 0.1 * (1.0 + 0.1 * noise(step));
        assert!(fast
            .straggler(&rules, &[("step_time", t)], &[0.1, 0.1, 0.1])
            .is_empty());
        if !slow
            .straggler(&rules, &[("step_time", 2.0 * t)], &[0.1, 0.1, 0.1])
            .is_empty()
            && fired.is_none()
        {
            fired = Some(step);
        }
    }
    assert!(fired.is_some_and(|s| s < 60), "{fired:?}");
}

#[test]
fn dedup_resolve_and_cooldown() {
    let rules = Rules::default();
    let mut st = RunRules::new("{}");
    let nan = |s| vec![("loss", if s < 0 { 1.0 } else { f64::NAN })];
    let mut all = Vec::new();
    for (i, step) in [1, 2, 3].iter().enumerate() {
        let f = st.findings(&rules, *step, &nan(*step));
        all.extend(st.events(&rules, *step, f, i as f64));
    }
    assert_eq!(all.len(), 1, "fires once while it holds: {all:?}");
    let f = st.findings(&rules, 4, &nan(-1));
    let e = st.events(&rules, 4, f, 10.0);
    assert!(matches!(
        e[0],
        Event::Resolved {
            rule: "non_finite",
            step: 4,
            ..
        }
    ));
    // Within the cooldown it does not fire again.
    let f = st.findings(&rules, 5, &nan(5));
    assert!(st.events(&rules, 5, f, 20.0).is_empty());
}

#[test]
fn alerts_resolve_only_on_evidence_about_their_metric() {
    let rules = Rules::default();
    let mut st = RunRules::new("{}");
    let f = st.findings(&rules, 1, &[("loss", f64::NAN)]);
    assert_eq!(st.events(&rules, 1, f, 0.0).len(), 1);
    let full = [("gpu0/mem_used_gb", 79.5), ("gpu0/mem_total_gb", 80.0)];
    let f = st.findings(&rules, 1, &full);
    assert!(matches!(
        st.events(&rules, 1, f, 0.5)[0],
        Event::Fired { rule: "memory", .. }
    ));
    // A system sample carries no loss, a training record no memory: neither resolves.
    let sys = st.findings(&rules, 1, &[("cpu_percent", 50.0)]);
    assert!(st.events(&rules, 1, sys, 1.0).is_empty());
    let f = st.findings(&rules, 2, &[("loss", f64::NAN)]);
    assert!(
        st.events(&rules, 2, f, 2.0).is_empty(),
        "still active: no second firing"
    );
    let f = st.findings(&rules, 3, &[("loss", 1.0)]);
    let e = st.events(&rules, 3, f, 3.0);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(matches!(
        e[0],
        Event::Resolved {
            rule: "non_finite",
            ..
        }
    ));
    let f = st.findings(
        &rules,
        3,
        &[("gpu0/mem_used_gb", 10.0), ("gpu0/mem_total_gb", 80.0)],
    );
    assert!(matches!(
        st.events(&rules, 3, f, 4.0)[0],
        Event::Resolved { rule: "memory", .. }
    ));
}

#[test]
fn lr_steps_at_the_ends_of_i64_do_not_overflow() {
    let rules = Rules::default();
    let mut st = RunRules::new("{}");
    for (step, lr) in [
        (i64::MIN, 1e-3),
        (i64::MAX, 1e-9),
        (i64::MIN, 1.0),
        (i64::MAX, 1e3),
    ] {
        let f = st.findings(&rules, step, &[("lr", lr)]);
        st.events(&rules, step, f, 0.0);
    }
}

/// The hub judges records by metric id through a per-run lookup; the rules' meaning is the
/// name path's. A sick run (every rule firing and resolving, the memory metrics defined
/// half-way, ids not in name order) must be judged identically, record by record.
#[test]
fn judging_by_id_is_judging_by_name() {
    use stepstream_protocol::{MetricDef, MetricId, StepRecord};
    let rules = Rules::default();
    let mut steps = healthy(900);
    set(&mut steps, 300, 300, "loss", |_, v| v * 6.0);
    set(&mut steps, 350, 350, "loss", |_, _| f64::NAN);
    set(&mut steps, 400, 470, "grad_norm", |_, v| v * 15.0);
    set(&mut steps, 500, 560, "samples_per_sec", |_, _| 50.0);
    set(&mut steps, 600, 640, "step_time", |_, _| 1.5);
    set(&mut steps, 700, 900, "loss", |step, v| {
        v * (1.0 + (step - 700) as f64 * 0.01)
    });
    for s in steps.iter_mut().filter(|s| s.step >= 450) {
        let used = if (480..520).contains(&s.step) {
            79.5
        } else {
            40.0
        };
        s.values.push(("gpu0/mem_used_gb", used));
        s.values.push(("gpu0/mem_total_gb", 80.0));
        s.values.push(("gpu1/mem_used_gb", 1.0));
    }
    let mut table: Vec<MetricDef> = Vec::new();
    let id_of = |table: &mut Vec<MetricDef>, name: &str| -> MetricId {
        if let Some(m) = table.iter().find(|m| m.name == name) {
            return m.id;
        }
        // Ids in no relation to names or first use, like a resumed collector's.
        let id = MetricId(1000 - 7 * table.len() as u32);
        table.push(MetricDef {
            id,
            name: name.to_string(),
        });
        table.sort_by_key(|m| m.id);
        id
    };
    let (mut by_name, mut by_id) = (RunRules::new(CONFIG), RunRules::new(CONFIG));
    let mut fired = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let record = StepRecord {
            step: s.step,
            wall_time: 0.0,
            values: s
                .values
                .iter()
                .map(|(n, v)| (id_of(&mut table, n), *v))
                .collect(),
        };
        let others = [0.01, 0.01];
        let mut want = by_name.findings(&rules, s.step, &s.values);
        want.merge(by_name.straggler(&rules, &s.values, &others));
        let mut sample = Sample::default();
        by_id.sample(&rules, &table, &record, &mut sample);
        let mut got = by_id.judge(&rules, s.step, &sample);
        got.merge(by_id.straggler_at(&rules, &sample, &others));
        // Debug text, not `==`: a NaN finding is equal to itself there.
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "step {}", s.step);
        let now = i as f64;
        let want = by_name.events(&rules, s.step, want, now);
        let got = by_id.events(&rules, s.step, got, now);
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "step {}", s.step);
        fired.extend(got.iter().filter_map(|e| match e {
            Event::Fired { rule, .. } => Some(*rule),
            _ => None,
        }));
    }
    fired.sort_unstable();
    fired.dedup();
    // The replay exercised every record-judged rule.
    assert_eq!(
        fired,
        [
            "divergence",
            "grad_explosion",
            "loss_spike",
            "memory",
            "non_finite",
            "stalled_data",
            "straggler",
            "throughput_drop"
        ]
    );
}
