//! Golden files pin the bytes of every message. A mismatch is either a regression or a wire
//! change: then bump `codec::VERSION` and refresh on purpose with `UPDATE_GOLDEN=1 cargo test`.

use std::path::PathBuf;
use stepstream_protocol::*;

fn run_id() -> RunId {
    RunId::new("20261202-180455-9f3a").unwrap()
}

fn record(step: i64) -> StepRecord {
    StepRecord {
        step,
        wall_time: 1_764_700_000.25 + step as f64,
        values: vec![
            (MetricId(0), 2.5),
            (MetricId(1), f64::NAN),
            (MetricId(2), f64::INFINITY),
        ],
    }
}

/// A console line, a text sample and a table: one of each item body.
fn items(step: i64) -> Vec<Item> {
    vec![
        Item {
            step,
            wall_time: 1_764_700_000.5,
            key: String::new(),
            body: ItemBody::Line {
                stream: Stream::Stderr,
                text: "[WARNING] loss scale 65536 -> 32768".into(),
            },
        },
        Item {
            step,
            wall_time: 1_764_700_000.75,
            key: "generation".into(),
            body: ItemBody::Text("The cat sat".into()),
        },
        Item {
            step,
            wall_time: 1_764_700_001.0,
            key: "samples".into(),
            body: ItemBody::Table {
                columns: vec!["prompt".into(), "reward".into()],
                rows: vec![vec![Cell::Text("2+2=".into()), Cell::Number(0.5)]],
            },
        },
        Item {
            step,
            wall_time: 1_764_700_001.25,
            key: "grad/layer0".into(),
            body: ItemBody::Histogram(Histogram {
                lo: -0.5,
                hi: 0.5,
                counts: vec![1.0, 6.0, 1.0],
                nan: 1.0,
                pos_inf: 0.0,
                neg_inf: 0.0,
            }),
        },
        Item {
            step,
            wall_time: 1_764_700_001.5,
            key: "samples/0".into(),
            body: ItemBody::Image(Image {
                format: ImageFormat::Png,
                width: 2,
                height: 1,
                caption: "a cat".into(),
                data: vec![0x89, b'P', b'N', b'G'],
            }),
        },
    ]
}

fn command() -> Command {
    Command {
        id: 42,
        action: Action::Stop { checkpoint: true },
        by: "alice".into(),
        reason: "diverging".into(),
        issued_at: 1_764_700_002.5,
    }
}

fn summary() -> RunSummary {
    RunSummary {
        run_id: run_id(),
        project: "llama".into(),
        name: "lr-3e-4".into(),
        host: "node0".into(),
        rank: 0,
        world_size: 8,
        job: "llama-20261202".into(),
        framework: "mindspore".into(),
        started_at: 1_764_700_000.0,
        status: RunStatus::Stale,
        status_message: Some("no data for 31 s".into()),
        last_step: Some(300),
        last_point_at: Some(1_764_700_300.5),
        last_values: vec![("loss".into(), 1.25)],
        records: 300,
    }
}

/// One sample of every message, named `Direction_Message`.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let hub_error = HubError {
        code: ErrorCode::Unauthorized,
        message: "wrong token".into(),
        fatal: true,
    };
    vec![
        (
            "ToHub_Hello",
            ToHub::Hello(Hello {
                protocol: codec::VERSION,
                token: Some("s3cret".into()),
                run: RunIdentity {
                    run_id: run_id(),
                    project: "llama".into(),
                    name: "lr-3e-4".into(),
                    config_json: r#"{"lr":0.0003,"warmup":100}"#.into(),
                    host: "node0".into(),
                    rank: 0,
                    world_size: 8,
                    job: "llama-20261202".into(),
                    framework: "mindspore".into(),
                    started_at: 1_764_700_000.0,
                },
                writer: 0x5eed_cafe_0001,
                acked_through: 6,
            })
            .encode(),
        ),
        (
            "ToHub_DefineMetrics",
            ToHub::DefineMetrics(DefineMetrics {
                metrics: vec![
                    MetricDef {
                        id: MetricId(0),
                        name: "loss".into(),
                    },
                    MetricDef {
                        id: MetricId(1),
                        name: "lr".into(),
                    },
                ],
            })
            .encode(),
        ),
        (
            "ToHub_Batch",
            ToHub::Batch(Batch {
                seq: 7,
                records: vec![record(1), record(2)],
                items: items(2),
            })
            .encode(),
        ),
        (
            "ToHub_Heartbeat",
            ToHub::Heartbeat(Heartbeat {
                wall_time: 1_764_700_001.5,
            })
            .encode(),
        ),
        (
            "ToHub_Finish",
            ToHub::Finish(Finish {
                status: FinishStatus::Failed {
                    message: "CUDA OOM".into(),
                },
                wall_time: 1_764_700_002.0,
            })
            .encode(),
        ),
        (
            "FromHub_Welcome",
            FromHub::Welcome(Welcome {
                run_id: run_id(),
                last_seq: 6,
                last_step: Some(120),
                metrics: vec![MetricDef {
                    id: MetricId(0),
                    name: "loss".into(),
                }],
                limits: Limits::default(),
                linger_ms: 0,
            })
            .encode(),
        ),
        (
            "FromHub_Ack",
            FromHub::Ack(Ack {
                through_seq: 7,
                items_refused: 2,
            })
            .encode(),
        ),
        (
            "FromHub_FinishAck",
            FromHub::FinishAck(FinishAck {
                status: RunStatus::Failed,
            })
            .encode(),
        ),
        (
            "FromHub_HubError",
            FromHub::HubError(hub_error.clone()).encode(),
        ),
        ("FromHub_Command", FromHub::Command(command()).encode()),
        (
            "FromHub_Pace",
            FromHub::Pace(Pace { linger_ms: 25 }).encode(),
        ),
        (
            "ToHub_CommandReply",
            ToHub::CommandReply(CommandReply {
                id: 42,
                state: CommandState::Honoured,
                step: Some(1234),
                message: "saved /ckpt/step1234.ckpt".into(),
            })
            .encode(),
        ),
        (
            "ToHub_UserAlert",
            ToHub::UserAlert(UserAlert {
                title: "eval regressed".into(),
                text: "bleu 31.2 -> 27.9".into(),
                level: AlertLevel::Warning,
                step: 4000,
                wall_time: 1_764_700_004.0,
            })
            .encode(),
        ),
        (
            "ToHub_Finish_Stopped",
            ToHub::Finish(Finish {
                status: FinishStatus::Stopped {
                    message: "stopped by alice: diverging".into(),
                },
                wall_time: 1_764_700_003.0,
            })
            .encode(),
        ),
        (
            "ToViewer_CommandEvent",
            ToViewer::CommandEvent(CommandEvent {
                run_id: run_id(),
                command: Command {
                    id: 43,
                    action: Action::Note {
                        text: "lr halved".into(),
                    },
                    by: "bob".into(),
                    reason: String::new(),
                    issued_at: 1_764_700_010.0,
                },
                state: CommandState::Delivered,
                step: None,
                message: String::new(),
                at: 1_764_700_010.5,
            })
            .encode(),
        ),
        (
            "ToPeer_PeerRules",
            ToPeer::PeerRules(PeerRules {
                hub: 0x5eed,
                project: "llm".into(),
            })
            .encode(),
        ),
        (
            "ToPeer_PeerCommand",
            ToPeer::PeerCommand(PeerCommand {
                hub: 0x5eed,
                run_id: run_id(),
                id: 42,
            })
            .encode(),
        ),
        (
            "FromViewer_Subscribe",
            FromViewer::Subscribe(Subscribe {
                runs: vec![run_id()],
                metrics: Some(vec!["loss".into()]),
                from_step: Some(100),
                budget: Some(2000),
                after_seq: Some(41),
                items: true,
            })
            .encode(),
        ),
        (
            "FromViewer_Unsubscribe",
            FromViewer::Unsubscribe(Unsubscribe {
                runs: vec![run_id()],
            })
            .encode(),
        ),
        (
            "FromViewer_Zoom",
            FromViewer::Zoom(Zoom {
                id: 7,
                run_id: run_id(),
                metric: "loss".into(),
                from: 100,
                to: 200,
                budget: 1600,
            })
            .encode(),
        ),
        (
            "ToViewer_Zoomed",
            ToViewer::Zoomed(Zoomed {
                id: 7,
                run_id: run_id(),
                metric: "loss".into(),
                from: 100,
                to: 200,
                total_points: 2,
                downsampled: false,
                steps: vec![100, 150],
                values: vec![2.5, f64::NAN],
                times: vec![1_764_700_100.25, 1_764_700_150.25],
            })
            .encode(),
        ),
        (
            "ToViewer_RunList",
            ToViewer::RunList(RunList {
                runs: vec![summary()],
                now: 1_764_700_331.0,
                done: true,
            })
            .encode(),
        ),
        (
            "ToViewer_RunUpdate",
            ToViewer::RunUpdate(RunUpdate {
                run: summary(),
                now: 1_764_700_331.0,
            })
            .encode(),
        ),
        (
            "ToViewer_Metrics",
            ToViewer::Metrics(Metrics {
                run_id: run_id(),
                metrics: vec![MetricDef {
                    id: MetricId(0),
                    name: "loss".into(),
                }],
            })
            .encode(),
        ),
        (
            "ToViewer_Backfill",
            ToViewer::Backfill(Backfill {
                run_id: run_id(),
                through_seq: 6,
                downsampled: true,
                series: vec![Series {
                    metric: MetricId(0),
                    steps: vec![1, 50, 51, 100],
                    values: vec![3.0, 9.5, 0.5, 1.0],
                    times: vec![
                        1_764_700_001.0,
                        1_764_700_050.0,
                        1_764_700_051.0,
                        1_764_700_100.0,
                    ],
                }],
                done: true,
            })
            .encode(),
        ),
        (
            "ToViewer_Live",
            ToViewer::Live(Live {
                run_id: run_id(),
                seq: 7,
                records: vec![record(101)],
                items: items(101),
            })
            .encode(),
        ),
        (
            "ToViewer_StatusChange",
            ToViewer::StatusChange(StatusChange {
                run_id: run_id(),
                status: RunStatus::Running,
                message: None,
                at: 1_764_700_400.0,
            })
            .encode(),
        ),
        (
            "ToViewer_Resync",
            ToViewer::Resync(Resync {
                run_id: run_id(),
                after_seq: 7,
                reason: "viewer lagged 40 batches".into(),
            })
            .encode(),
        ),
        (
            "ToViewer_Alert",
            ToViewer::Alert(Alert {
                run_id: run_id(),
                rule: "grad_explosion".into(),
                fired: true,
                step: 202,
                value: 15.5,
                message: "grad_norm 15.5 above 10x its rolling mean".into(),
                at: 1_764_700_500.0,
            })
            .encode(),
        ),
        (
            "ToViewer_RunUpdates",
            ToViewer::RunUpdates(RunUpdates {
                runs: vec![summary()],
                now: 1_764_700_301.0,
            })
            .encode(),
        ),
        (
            "ToViewer_RunDeleted",
            ToViewer::RunDeleted(RunDeleted {
                run_id: run_id(),
                project: "llama".into(),
                by: "ada".into(),
                at: 1_764_700_302.0,
            })
            .encode(),
        ),
        ("ToViewer_HubError", ToViewer::HubError(hub_error).encode()),
        (
            "ToPeer_PeerBatch",
            ToPeer::PeerBatch(PeerBatch {
                hub: 0x5eed,
                run_id: run_id(),
                seq: 7,
                records: vec![record(300)],
            })
            .encode(),
        ),
        (
            "ToPeer_PeerMetrics",
            ToPeer::PeerMetrics(PeerMetrics {
                hub: 0x5eed,
                run_id: run_id(),
                metrics: vec![MetricDef {
                    id: MetricId(3),
                    name: "grad_norm".into(),
                }],
            })
            .encode(),
        ),
        (
            "ToPeer_PeerDeleted",
            ToPeer::PeerDeleted(PeerDeleted {
                hub: 0x5eed,
                run_id: run_id(),
                by: "ops".into(),
            })
            .encode(),
        ),
        (
            "ToPeer_PeerRun",
            ToPeer::PeerRun(PeerRun {
                hub: 0x5eed,
                run_id: run_id(),
                change: Some(StatusChange {
                    run_id: run_id(),
                    status: RunStatus::Stale,
                    message: Some("no data for 31 s".into()),
                    at: 1_764_700_331.0,
                }),
            })
            .encode(),
        ),
        (
            "ToPeer_PeerAlert",
            ToPeer::PeerAlert(PeerAlert {
                hub: 0x5eed,
                alert: Alert {
                    run_id: run_id(),
                    rule: "stale".into(),
                    fired: true,
                    step: 300,
                    value: f64::NAN,
                    message: "no data for 31 s".into(),
                    at: 1_764_700_331.0,
                },
            })
            .encode(),
        ),
    ]
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    for line in bytes.chunks(32) {
        for b in line {
            out.push_str(&format!("{b:02x}"));
        }
        out.push('\n');
    }
    out
}

#[test]
fn golden_bytes() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut failures = Vec::new();
    for (name, bytes) in samples() {
        let path = dir.join(format!("{name}.hex"));
        let got = hex(&bytes);
        if update {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("missing golden file {}", path.display()));
        if got != want {
            failures.push(format!(
                "{name}:\n  golden: {}\n  now:    {}",
                want.trim(),
                got.trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "wire bytes changed (a regression, or bump codec::VERSION and rerun with \
         UPDATE_GOLDEN=1):\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_borrowed_batch_encodes_as_the_message_does() {
    let b = Batch {
        seq: 9,
        records: vec![record(1), record(2)],
        items: items(2),
    };
    assert_eq!(b.encode(), ToHub::Batch(b.clone()).encode());
}

#[test]
fn every_sample_round_trips() {
    for (name, bytes) in samples() {
        let again = match name.split('_').next().unwrap() {
            "ToHub" => ToHub::decode(&bytes).unwrap().encode(),
            "FromHub" => FromHub::decode(&bytes).unwrap().encode(),
            "FromViewer" => FromViewer::decode(&bytes).unwrap().encode(),
            "ToViewer" => ToViewer::decode(&bytes).unwrap().encode(),
            "ToPeer" => ToPeer::decode(&bytes).unwrap().encode(),
            other => panic!("unknown direction {other}"),
        };
        assert_eq!(again, bytes, "{name} does not round-trip");
    }
}

#[test]
fn kinds_are_unique_across_directions() {
    // A second sample of one message (`ToHub_Finish_Stopped`) repeats its kind on purpose.
    let mut kinds: Vec<u8> = samples()
        .iter()
        .filter(|(name, _)| name.matches('_').count() == 1)
        .map(|(_, b)| b[3])
        .collect();
    // HubError is shared by two directions on purpose (0x1f and 0x3f), everything else once.
    kinds.sort_unstable();
    let n = kinds.len();
    kinds.dedup();
    assert_eq!(kinds.len(), n);
}

#[test]
fn bad_frames_are_errors_not_panics() {
    let good = ToHub::Batch(Batch {
        seq: 1,
        records: vec![record(1)],
        items: Vec::new(),
    })
    .encode();

    assert_eq!(ToHub::decode(&good[..3]), Err(DecodeError::Truncated(3)));

    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert!(matches!(
        ToHub::decode(&bad_magic),
        Err(DecodeError::BadMagic(_))
    ));

    let mut future = good.clone();
    future[2] = codec::VERSION + 1;
    assert_eq!(
        ToHub::decode(&future),
        Err(DecodeError::UnsupportedVersion {
            got: codec::VERSION + 1,
            supported: codec::VERSION
        })
    );

    let mut unknown = good.clone();
    unknown[3] = 0x0e;
    assert!(matches!(
        ToHub::decode(&unknown),
        Err(DecodeError::UnexpectedKind { kind: 0x0e, .. })
    ));

    let mut trailing = good.clone();
    trailing.push(0);
    assert!(matches!(
        ToHub::decode(&trailing),
        Err(DecodeError::Malformed { .. })
    ));

    // Every prefix of a valid frame is refused cleanly.
    for len in 0..good.len() {
        assert!(
            ToHub::decode(&good[..len]).is_err(),
            "prefix of {len} bytes decoded"
        );
    }

    // A length prefix that claims a huge vector must not allocate it.
    let mut huge = good[..4].to_vec();
    huge.push(1); // seq
    huge.extend_from_slice(&[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]); // u64 len
    assert!(matches!(
        ToHub::decode(&huge),
        Err(DecodeError::Malformed { .. })
    ));

    let oversized = vec![0u8; codec::MAX_FRAME_LEN + 1];
    assert!(matches!(
        ToHub::decode(&oversized),
        Err(DecodeError::TooLarge(_))
    ));
}

#[test]
fn non_finite_values_survive_the_wire() {
    let frame = ToHub::Batch(Batch {
        seq: 1,
        records: vec![record(3)],
        items: Vec::new(),
    })
    .encode();
    let ToHub::Batch(batch) = ToHub::decode(&frame).unwrap() else {
        panic!()
    };
    let values = &batch.records[0].values;
    assert_eq!(values[0].1, 2.5);
    assert!(values[1].1.is_nan());
    assert_eq!(values[2].1, f64::INFINITY);
}
