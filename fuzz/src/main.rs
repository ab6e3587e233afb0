//! `stepstream-fuzz TARGET COUNT [SEED]`: runs a fuzz target on COUNT mutated inputs (all
//! targets with `all`), seeded from the golden frames and sample CSVs, on every core; crashes
//! go to `fuzz/regressions/TARGET/`.

use std::path::{Path, PathBuf};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: stepstream-fuzz frame|csv|conversation|all COUNT [SEED]";
    let (Some(which), Some(count)) = (
        args.get(1),
        args.get(2)
            .and_then(|c| c.replace('_', "").parse::<u64>().ok()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let seed: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failed = false;
    for (name, target) in stepstream_fuzz::targets() {
        if which != "all" && which != name {
            continue;
        }
        let seeds = seeds(root, name);
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let started = std::time::Instant::now();
        let crash_dir = root.join("regressions").join(name);
        let outcomes: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    let seeds = &seeds;
                    let crash_dir = &crash_dir;
                    let share = count / workers + u64::from(w < count % workers);
                    s.spawn(move || {
                        stepstream_fuzz::run(
                            target,
                            seeds,
                            share,
                            seed ^ (w << 32),
                            4096,
                            crash_dir,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker"))
                .collect()
        });
        let executed: u64 = outcomes.iter().map(|o| o.executed).sum();
        let crashes: Vec<&PathBuf> = outcomes.iter().flat_map(|o| &o.crashes).collect();
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{name}: {executed} inputs in {secs:.1} s ({:.0}/s), {} crashes",
            executed as f64 / secs,
            crashes.len()
        );
        for c in &crashes {
            println!("  kept {}", c.display());
        }
        failed |= !crashes.is_empty();
    }
    if failed {
        std::process::exit(1);
    }
}

/// The corpus a target starts from.
fn seeds(root: &Path, target: &str) -> Vec<Vec<u8>> {
    stepstream_fuzz::seeds(&root.join(".."), target)
}
