use super::*;
use stepstream_protocol::{Backfill, Live, MetricDef, Metrics, RunList, Series, StepRecord};

fn summary(id: &str, project: &str, status: RunStatus, started: f64) -> RunSummary {
    RunSummary {
        run_id: RunId::new(id).unwrap(),
        project: project.into(),
        name: id.into(),
        host: "h".into(),
        rank: 0,
        world_size: 1,
        job: String::new(),
        framework: "test".into(),
        started_at: started,
        status,
        status_message: None,
        last_step: Some(9),
        last_point_at: Some(100.0),
        last_values: vec![("loss".into(), 0.5)],
        records: 10,
    }
}

fn list(runs: Vec<RunSummary>) -> ToViewer {
    ToViewer::RunList(RunList {
        runs,
        now: 100.0,
        done: true,
    })
}

#[test]
fn a_project_target_lists_its_runs_and_charts_the_newest_running_one() {
    let mut app = App::new(Some("llm".into()));
    let out = app.on_message(list(vec![
        summary("a", "llm", RunStatus::Finished, 3.0),
        summary("b", "llm", RunStatus::Running, 1.0),
        summary("c", "cv", RunStatus::Running, 2.0),
    ]));
    let ids: Vec<&str> = app.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["b", "a"], "running first; the other project left out");
    match &out[..] {
        [FromViewer::Subscribe(s)] => assert_eq!(s.runs[0].as_str(), "b"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_target_is_charted_with_its_projects_runs_listed() {
    let mut app = App::new(Some("a".into()));
    app.on_message(list(vec![
        summary("a", "llm", RunStatus::Finished, 3.0),
        summary("b", "llm", RunStatus::Running, 1.0),
        summary("c", "cv", RunStatus::Running, 2.0),
    ]));
    assert_eq!(app.runs.len(), 2);
    assert!(app.chosen.contains(&RunId::new("a").unwrap()));
    assert_eq!(app.runs[app.cursor].run_id.as_str(), "a");
}

#[test]
fn history_then_live_points_chart_with_zoom_to_raw_points_and_smoothing() {
    let run = RunId::new("r").unwrap();
    let mut app = App::new(None);
    app.on_message(list(vec![summary("r", "p", RunStatus::Running, 1.0)]));
    app.on_message(ToViewer::Metrics(Metrics {
        run_id: run.clone(),
        metrics: vec![
            MetricDef {
                id: MetricId(0),
                name: "lr".into(),
            },
            MetricDef {
                id: MetricId(1),
                name: "loss".into(),
            },
        ],
    }));
    app.on_message(ToViewer::Backfill(Backfill {
        run_id: run.clone(),
        through_seq: 1,
        downsampled: false,
        series: vec![Series {
            metric: MetricId(1),
            steps: (0..100).collect(),
            values: (0..100).map(|s| 10.0 - s as f64 * 0.05).collect(),
            times: vec![0.0; 100],
        }],
        done: true,
    }));
    assert_eq!(app.metric.as_deref(), Some("loss"));
    app.on_message(ToViewer::Live(Live {
        run_id: run.clone(),
        seq: 2,
        records: vec![StepRecord {
            step: 100,
            wall_time: 1.0,
            values: vec![(MetricId(1), f64::NAN), (MetricId(0), 0.1)],
        }],
        items: vec![],
    }));
    assert_eq!(app.span(), Some((0, 100)));
    assert!(
        app.last_value(&run).unwrap().1.is_nan(),
        "a NaN is shown as it came"
    );
    assert_eq!(app.metric_names(), ["loss", "lr"]);
    // Zoom in: half the window about its middle, and the hub is asked for its raw points.
    let out = app.on_key(Key::ZoomIn);
    assert_eq!(app.window, Some((25, 75)));
    match &out[..] {
        [FromViewer::Zoom(z)] => assert_eq!((z.from, z.to, z.metric.as_str()), (25, 75, "loss")),
        other => panic!("{other:?}"),
    }
    assert_eq!(app.points(&run).len(), 51);
    app.on_key(Key::Left);
    assert_eq!(app.window, Some((13, 63)));
    app.on_key(Key::ZoomOut);
    app.on_key(Key::ZoomOut);
    assert_eq!(
        app.window, None,
        "zoomed out past every point: the whole run"
    );
    app.on_key(Key::Smooth);
    let smoothed = app.points(&run);
    assert!(
        (smoothed[0].1 - 10.0).abs() < 1e-9,
        "debiased: starts at the first value"
    );
    assert!(
        smoothed[50].1 > 10.0 - 50.0 * 0.05,
        "smoothing lags a falling loss"
    );
    app.on_key(Key::NextMetric);
    assert_eq!(app.metric.as_deref(), Some("lr"));
}

#[test]
fn choosing_runs_subscribes_and_unsubscribes() {
    let mut app = App::new(None);
    app.on_message(list(vec![
        summary("a", "p", RunStatus::Running, 2.0),
        summary("b", "p", RunStatus::Running, 1.0),
    ]));
    assert_eq!(app.chosen.len(), 1);
    app.on_key(Key::Down);
    let out = app.on_key(Key::Toggle);
    assert!(matches!(&out[..], [FromViewer::Subscribe(s)] if s.runs[0].as_str() == "b"));
    assert_eq!(app.chosen.len(), 2);
    let out = app.on_key(Key::Only);
    assert!(matches!(&out[..], [FromViewer::Unsubscribe(u)] if u.runs[0].as_str() == "a"));
    assert_eq!(app.chosen.len(), 1);
    let out = app.on_key(Key::Toggle);
    assert!(matches!(&out[..], [FromViewer::Unsubscribe(_)]));
    assert!(app.chosen.is_empty());
    // A reconnect subscribes the chosen runs again.
    app.on_key(Key::Toggle);
    let out = app.on_connect();
    assert!(matches!(&out[..], [FromViewer::Subscribe(s)] if s.runs.len() == 1));
}

#[test]
fn numbers_keep_six_significant_digits() {
    assert_eq!(super::super::draw::number(0.123456789), "0.123457");
    assert_eq!(super::super::draw::number(2.5), "2.5");
    assert_eq!(super::super::draw::number(12345.678), "12345.7");
    assert_eq!(super::super::draw::number(1e-7), "1.0000e-7");
    assert_eq!(super::super::draw::number(f64::NAN), "NaN");
}
