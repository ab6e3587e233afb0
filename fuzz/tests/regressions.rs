//! Every kept crash input still passes its target, and a short fuzz of each target is clean.
//! The long runs (10 million inputs per target) are `stepstream-fuzz TARGET 10000000`.

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn kept_regressions_pass() {
    for (name, target) in stepstream_fuzz::targets() {
        let dir = repo().join("fuzz/regressions").join(name);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let input = std::fs::read(entry.path()).unwrap();
            target(&input);
        }
    }
}

#[test]
fn a_short_fuzz_of_every_target_is_clean() {
    let crashes = tempfile::tempdir().unwrap();
    for (name, target) in stepstream_fuzz::targets() {
        let count = if name == "conversation" {
            3_000
        } else {
            50_000
        };
        let seeds = stepstream_fuzz::seeds(repo(), name);
        let out = stepstream_fuzz::run(target, &seeds, count, 7, 4096, crashes.path());
        assert_eq!(out.executed, count);
        assert!(out.crashes.is_empty(), "{name}: {:?}", out.crashes);
    }
}
