//! `stepstream import`: TensorBoard event files (built here record by record: TF1-style
//! `simple_value`s and TF2 tensor-valued scalars) become runs; a second import adds only
//! what is new; a record cut short waits; a damaged file is named and the rest goes on.

use crate::util::*;
use prost::Message;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use stepstream_importers::tensorboard::event::{
    Event, Metadata, PluginData, Summary, Tensor, Value,
};
use stepstream_importers::tensorboard::records::frame;

/// One framed event record holding one summary value.
fn record(step: i64, wall: f64, value: Value) -> Vec<u8> {
    let e = Event {
        wall_time: wall,
        step,
        summary: Some(Summary { value: vec![value] }),
    };
    frame(&e.encode_to_vec())
}

/// A tensorboardX / PyTorch scalar: `simple_value`.
fn simple(step: i64, wall: f64, tag: &str, v: f32) -> Vec<u8> {
    let value = Value {
        tag: tag.into(),
        simple_value: Some(v),
        ..Default::default()
    };
    record(step, wall, value)
}

/// A TF2 `tf.summary.scalar`: a float tensor in `tensor_content`, plugin `scalars`.
fn tf2(step: i64, wall: f64, tag: &str, v: f32) -> Vec<u8> {
    let value = Value {
        tag: tag.into(),
        tensor: Some(Tensor {
            dtype: 1,
            content: v.to_le_bytes().to_vec(),
            ..Default::default()
        }),
        metadata: Some(Metadata {
            plugin_data: Some(PluginData {
                plugin_name: "scalars".into(),
            }),
        }),
        ..Default::default()
    };
    record(step, wall, value)
}

fn append(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// `stepstream import DIR` to the hub, once.
fn import(hub: &Hub, dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepstream"));
    cmd.args(["import", dir.to_str().unwrap(), "--hub", &hub.ws()]);
    cmd
}

fn runs_by_name(hub: &Hub) -> std::collections::HashMap<String, String> {
    hub.json("/api/runs")["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["run_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn event_files_become_runs_incrementally_with_their_wall_times() {
    let hub = Hub::start(&[]);
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("exp/a"), root.path().join("exp/b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let fa = a.join("events.out.tfevents.1764700000.host.1.0");
    let t0 = 1_764_700_000.0;
    for step in 0..10 {
        append(
            &fa,
            &simple(step, t0 + step as f64, "loss", 1.0 / (step + 1) as f32),
        );
        append(
            &fa,
            &tf2(step, t0 + step as f64, "train/acc", step as f32 / 10.0),
        );
        append(&fa, &simple(step, t0 + step as f64, "loss vs samples", 9.0));
    }
    append(
        &b.join("events.out.tfevents.1764700001.host.2.0"),
        &simple(3, t0, "eval/loss", 0.5),
    );
    succeed(&mut import(&hub, root.path()));
    let runs = runs_by_name(&hub);
    let (ra, rb) = (&runs["exp/a"], &runs["exp/b"]);
    let loss = hub.json(&format!("/api/runs/{ra}/series?metric=loss"));
    assert_eq!(loss["steps"].as_array().unwrap().len(), 10);
    assert_eq!(loss["values"][3], 0.25);
    assert_eq!(loss["times"][3], t0 + 3.0, "the event's wall time");
    let acc = hub.json(&format!("/api/runs/{ra}/series?metric=train%2Facc"));
    assert_eq!(
        acc["values"][5].as_f64().unwrap(),
        0.5f32 as f64,
        "a TF2 tensor scalar"
    );
    let metrics = hub.json(&format!("/api/runs/{ra}"))["metrics"].to_string();
    assert!(!metrics.contains("vs samples"), "{metrics}");
    assert_eq!(hub.json(&format!("/api/runs/{rb}"))["records"], 1);
    assert_eq!(
        hub.json(&format!("/api/runs/{ra}"))["records"],
        10,
        "one record per step"
    );

    // The file grows, ending in a record cut short: only the new whole steps are added.
    for step in 10..15 {
        append(&fa, &simple(step, t0 + step as f64, "loss", 0.01));
    }
    let last = simple(15, t0 + 15.0, "loss", 0.001);
    append(&fa, &last[..last.len() - 5]);
    succeed(&mut import(&hub, root.path()));
    assert_eq!(runs_by_name(&hub).len(), 2, "the same runs");
    let loss = hub.json(&format!("/api/runs/{ra}/series?metric=loss"));
    let steps = series_steps(&loss);
    assert_eq!(
        steps,
        (0..15).collect::<Vec<_>>(),
        "nothing twice, the cut record waits"
    );
    append(&fa, &last[last.len() - 5..]);
    succeed(&mut import(&hub, root.path()));
    let n = hub.json(&format!("/api/runs/{ra}/series?metric=loss"))["steps"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(n, 16, "completed, it is read");

    // A flipped bit: that directory stops at the damage and says where; the other goes on.
    let fb = b.join("events.out.tfevents.1764700001.host.2.0");
    append(&fb, &simple(4, t0, "eval/loss", 0.4));
    let mut bad = simple(5, t0, "eval/loss", 0.3);
    let at = bad.len() - 6;
    bad[at] ^= 0x10;
    append(&fb, &bad);
    append(&fa, &simple(16, t0 + 16.0, "loss", 0.0001));
    let out = import(&hub, root.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("checksum") && err.contains("exp/b"), "{err}");
    assert_eq!(
        hub.json(&format!("/api/runs/{rb}"))["records"],
        2,
        "up to the damage"
    );
    assert_eq!(
        hub.json(&format!("/api/runs/{ra}"))["records"],
        17,
        "the other run went on"
    );
}

#[test]
fn import_follow_streams_new_events_and_new_directories_until_stopped() {
    let hub = Hub::start(&[]);
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let fa = a.join("events.out.tfevents.1.host");
    append(&fa, &simple(0, 1_764_700_000.0, "loss", 1.0));
    let child = Command::new(env!("CARGO_BIN_EXE_stepstream"))
        .args(["import", root.path().to_str().unwrap(), "--hub", &hub.ws()])
        .args(["--follow", "--poll-ms", "100"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let records = |name: &str| {
        runs_by_name(&hub)
            .get(name)
            .and_then(|id| hub.json(&format!("/api/runs/{id}"))["records"].as_u64())
    };
    wait_for(
        "the first event",
        std::time::Duration::from_secs(20),
        || (records("a") == Some(1)).then_some(()),
    );
    for step in 1..5 {
        append(
            &fa,
            &simple(step, 1_764_700_000.0 + step as f64, "loss", 0.5),
        );
    }
    let b = root.path().join("b");
    std::fs::create_dir_all(&b).unwrap();
    append(
        &b.join("events.out.tfevents.2.host"),
        &tf2(7, 1_764_700_100.0, "acc", 0.9),
    );
    wait_for(
        "the new events and directory",
        std::time::Duration::from_secs(20),
        || (records("a") == Some(5) && records("b") == Some(1)).then_some(()),
    );
    // SIGTERM: it finishes its runs and exits cleanly.
    let err = stop(child, "-TERM");
    assert!(err.contains("loss: 5 of 5 values stored"), "{err}");
    assert!(
        err.contains("the hub stored all 5 values of 1 metrics"),
        "{err}"
    );
    let id = &runs_by_name(&hub)["a"];
    assert_eq!(hub.json(&format!("/api/runs/{id}"))["status"], "finished");
}

/// Event files holding images reach gigabytes: they are read in bounded chunks (once a whole
/// file was read into memory), and records that span chunk boundaries, or are larger than a
/// chunk, are read whole.
#[test]
fn a_large_event_file_is_read_in_chunks_and_every_scalar_arrives() {
    let hub = Hub::start(&[]);
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("events.out.tfevents.1.host");
    let mut bytes = Vec::new();
    for step in 0..60_000 {
        bytes.extend(simple(step, 1_764_700_000.0 + step as f64, "loss", 1.0));
    }
    // A 9 MiB record (an image's worth) that is no scalar event, then more scalars.
    let image = Value {
        tag: "samples/image".into(),
        tensor: Some(Tensor {
            dtype: 7,
            content: vec![0xAB; 9 << 20],
            ..Default::default()
        }),
        ..Default::default()
    };
    bytes.extend(record(60_000, 1_764_760_000.0, image));
    for step in 60_001..61_001 {
        bytes.extend(simple(step, 1_764_700_000.0 + step as f64, "loss", 2.0));
    }
    append(&file, &bytes);
    let out = Command::new(env!("CARGO_BIN_EXE_stepstream"))
        .args(["import", root.path().to_str().unwrap(), "--hub", &hub.ws()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("loss: 61000 of 61000 values stored"), "{err}");
    let runs = hub.json("/api/runs");
    assert_eq!(runs["runs"][0]["records"], 61_000);
    assert_eq!(runs["runs"][0]["last_step"], 61_000);
}
