//! Streaming what a job already writes, without touching its script: `stepstream tail` (a
//! metrics CSV, or MindFormers' training log) and `stepstream import` (TensorBoard event
//! files). Each file or directory maps to one run, by host and absolute path, so running
//! either again resumes the run and sends only what the hub does not have.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_importers::tail;
use stepstream_protocol::{ErrorCode, RunId};

#[derive(clap::Args)]
pub struct TailArgs {
    /// The file to stream: a metrics CSV, or with `--format mindformers` a training log.
    file: PathBuf,
    /// `csv` (a header, then rows) or `mindformers` (MindFormers' training log: its loss
    /// monitor's lines, older and newer shapes; other lines skipped).
    #[arg(long, default_value = "csv", value_parser = ["csv", "mindformers"])]
    format: String,
    #[command(flatten)]
    to: crate::Writing,
    #[arg(long, default_value = "default")]
    project: String,
    /// Run name (default: the file's name).
    #[arg(long)]
    name: Option<String>,
    /// Run id (default: derived from the file's path, so a restarted tail resumes the run).
    #[arg(long)]
    run_id: Option<String>,
    /// A JSON file of hyper-parameters to attach to the run.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Stop at the end of the file instead of following it.
    #[arg(long)]
    no_follow: bool,
    /// How often to look for new lines, in milliseconds.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// A directory: every directory under it holding `events.out.tfevents.*` files is a run.
    dir: PathBuf,
    #[command(flatten)]
    to: crate::Writing,
    #[arg(long, default_value = "tensorboard")]
    project: String,
    /// Keep following the directories (and new ones) as they grow, until Ctrl-C.
    #[arg(long)]
    follow: bool,
    /// How often to look for new events while following, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
}

/// A run id (`KIND-STEM-HASH`) from the host and the absolute path, so the same file or
/// directory always maps to the same run, and two containers tailing the same path
/// (`/workspace/metrics.csv`) do not.
fn run_id_for(kind: &str, path: &std::path::Path, host: &str) -> Result<RunId> {
    let abs =
        std::fs::canonicalize(path).with_context(|| format!("cannot open {}", path.display()))?;
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let key = format!("{host}\n{}", abs.to_string_lossy());
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let stem: String = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    Ok(RunId::new(format!("{kind}-{stem}-{:016x}", h))?)
}

pub fn tail_file(args: TailArgs) -> Result<()> {
    let run_id = match &args.run_id {
        Some(id) => RunId::new(id.clone())?,
        None => run_id_for("tail", &args.file, &stepstream_collector::hostname())?,
    };
    let config_json = match &args.config {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read the config {}", p.display()))?,
        None => format!(
            "{{\"source\":{}}}",
            serde_json::to_string(&args.file.display().to_string())?
        ),
    };
    let name = args.name.clone().unwrap_or_else(|| {
        args.file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tail".into())
    });
    let mut options = Options::new(&args.to.hub, &args.project, &name);
    options.token = args.to.token()?;
    options.run_id = Some(run_id.clone());
    options.config_json = config_json;
    let format = match args.format.as_str() {
        "mindformers" => tail::Format::MindFormers,
        _ => tail::Format::Csv,
    };
    options.framework = match format {
        tail::Format::MindFormers => "mindformers (log tail)".into(),
        tail::Format::Csv => "csv tail".into(),
    };
    options.ca_file = args.to.ca_file.clone();
    let collector = Collector::start(options)?;

    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc_flag(flag);

    // A tail that resumes must know what the hub has, or it would send those rows twice.
    let Some(after_step) = hub_last_step(&collector, &args.to.hub, &stop, "tail")? else {
        return Ok(());
    };
    eprintln!(
        "stepstream tail: streaming {} as run {run_id}{}",
        args.file.display(),
        after_step.map_or(String::new(), |s| format!(", resuming after step {s}"))
    );
    let report = tail::tail(
        &args.file,
        format,
        &collector,
        after_step,
        !args.no_follow,
        Duration::from_millis(args.poll_ms.max(10)),
        &stop,
    )?;
    let last_error = collector.last_error();
    let sent = collector.finish(Outcome::Finished);
    eprintln!(
        "stepstream tail: {} rows read, {} bad rows skipped, {} already on the hub",
        report.rows, report.bad_rows, report.skipped,
    );
    if report.console_lines > 0 {
        eprintln!(
            "stepstream tail: {} of {} log lines stored as the run's console",
            sent.items_acked, report.console_lines
        );
    }
    let mut problems = stored_or_not("tail", &report.logged, &sent, last_error);
    if sent.items_acked < report.console_lines {
        problems.push(format!(
            "{} log lines were not stored as the run's console",
            report.console_lines - sent.items_acked
        ));
    }
    if report.bad_rows > 0 {
        problems.push(format!(
            "{} lines that look like records could not be read (each reported above) and \
             are not on the hub",
            report.bad_rows
        ));
    }
    if !problems.is_empty() {
        bail!(
            "not everything read is stored:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// Says, per metric, how many of the values read the hub acknowledged (it acknowledges only
/// what it committed), and returns what was not stored: a tail or import never reports
/// success for a value the hub refused (its limits, a bad name) or never acknowledged.
fn stored_or_not(
    who: &str,
    logged: &std::collections::BTreeMap<String, u64>,
    sent: &stepstream_collector::Report,
    last_error: Option<String>,
) -> Vec<String> {
    let stored: std::collections::HashMap<&str, u64> =
        sent.stored.iter().map(|(n, c)| (n.as_str(), *c)).collect();
    let mut problems = Vec::new();
    let mut kept = 0u64;
    for (name, &n) in logged {
        let got = stored.get(name.as_str()).copied().unwrap_or(0).min(n);
        kept += got;
        eprintln!("stepstream {who}:   {name}: {got} of {n} values stored");
        if got < n {
            problems.push(format!("{name}: {} of {n} values not stored", n - got));
        }
    }
    if !sent.delivered {
        problems.push(format!(
            "{} records not acknowledged by the hub",
            sent.unacked
        ));
    }
    if sent.dropped + sent.lost > 0 {
        problems.push(format!(
            "{} records dropped or lost before reaching the hub",
            sent.dropped + sent.lost
        ));
    }
    if !problems.is_empty() {
        if let Some(e) = last_error {
            problems.push(format!("the hub's last word: {e}"));
        }
    } else {
        eprintln!(
            "stepstream {who}: the hub stored all {kept} values of {} metrics",
            logged.len()
        );
    }
    problems
}

/// Sets `flag` on Ctrl-C / SIGTERM.
fn ctrlc_flag(flag: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            #[cfg(unix)]
            {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
        });
        flag.store(true, Ordering::Relaxed);
    });
}

/// Waits for the hub's welcome and returns its last step for the run (`Some(None)`: it has
/// none); `None` when stopped first; an error when the hub refuses the run for good. Says
/// every 2 s what it is waiting for.
fn hub_last_step(
    collector: &Collector,
    hub: &str,
    stop: &AtomicBool,
    who: &str,
) -> Result<Option<Option<i64>>> {
    loop {
        if let Some(last) = collector.wait_welcome(Duration::from_secs(2)) {
            return Ok(Some(last));
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        // A refusal no retry can change (a wrong token, a run of another project, a limit)
        // ends the command; a hub that is down or a second writer still running is waited for.
        if let Some((code, why)) = collector.refused_by_hub() {
            if matches!(code, ErrorCode::Unauthorized | ErrorCode::Limit) {
                // Nothing was accepted: the collector is let go without waiting for a
                // delivery that cannot come.
                let _ = collector.finish_shared(Outcome::Killed(why.clone()), Duration::ZERO);
                bail!("the hub at {hub} refuses this run ({code:?}): {why}");
            }
        }
        eprintln!(
            "stepstream {who}: waiting for the hub at {hub} ({})",
            collector.last_error().unwrap_or_default()
        );
    }
}

/// `stepstream import`: each directory of event files to a run, incrementally.
pub fn import_dir(args: ImportArgs) -> Result<()> {
    use stepstream_importers::tensorboard::{discover, RunDir};
    let root = std::fs::canonicalize(&args.dir)
        .with_context(|| format!("cannot open {}", args.dir.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    ctrlc_flag(stop.clone());
    let host = stepstream_collector::hostname();
    let token = args.to.token()?;
    let mut runs: Vec<(RunDir, Collector)> = Vec::new();
    let mut failed = 0u64;
    let mut broken: Vec<String> = Vec::new();
    loop {
        // New directories (all of them, the first time).
        for dir in discover(&root)?.into_keys() {
            if runs.iter().any(|(r, _)| r.dir == dir) {
                continue;
            }
            let name = match dir.strip_prefix(&root) {
                Ok(rel) if !rel.as_os_str().is_empty() => rel.to_string_lossy().into_owned(),
                _ => root
                    .file_name()
                    .map_or("tensorboard".into(), |n| n.to_string_lossy().into_owned()),
            };
            let run_id = run_id_for("tb", &dir, &host)?;
            let mut options = Options::new(&args.to.hub, &args.project, &name);
            options.token = token.clone();
            options.run_id = Some(run_id.clone());
            options.framework = "tensorboard import".into();
            options.ca_file = args.to.ca_file.clone();
            let collector = Collector::start(options)?;
            let Some(after) = hub_last_step(&collector, &args.to.hub, &stop, "import")? else {
                return Ok(());
            };
            eprintln!(
                "stepstream import: {} as run {run_id}{}",
                dir.display(),
                after.map_or(String::new(), |s| format!(", after step {s}"))
            );
            runs.push((RunDir::new(dir, after), collector));
        }
        for (run, collector) in &mut runs {
            if let Err(e) = run.poll(collector) {
                eprintln!(
                    "stepstream import: {e}; the rest of {} is not read",
                    run.dir.display()
                );
            }
            collector.flush();
        }
        if !args.follow || stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(Duration::from_millis(args.poll_ms.max(50)));
    }
    for (run, collector) in runs {
        let r = &run.report;
        let last_error = collector.last_error();
        let sent = collector.finish(Outcome::Finished);
        eprintln!(
            "stepstream import: {}: {} events ({} points) read, {} already on the hub, {} \
             undecodable",
            run.dir.display(),
            r.events - r.skipped,
            r.points,
            r.skipped,
            r.undecodable,
        );
        let mut problems = stored_or_not("import", &r.logged, &sent, last_error);
        if r.samples > 0 {
            eprintln!(
                "stepstream import: {}: {} of {} text, image and histogram summaries stored",
                run.dir.display(),
                sent.items_acked,
                r.samples
            );
        }
        if sent.items_acked < r.samples {
            problems.push(format!(
                "{} text, image or histogram summaries were not stored ({} refused by the                  hub's limits)",
                r.samples - sent.items_acked,
                sent.items_refused
            ));
        }
        if !problems.is_empty() {
            failed += 1;
            broken.push(format!(
                "{}: not everything read is stored: {}",
                run.dir.display(),
                problems.join("; ")
            ));
        }
        if let Some(why) = &run.broken {
            broken.push(format!("{}: {why}", run.dir.display()));
        }
    }
    if !broken.is_empty() {
        bail!(
            "{failed} runs not wholly stored, or damaged event files (imported up to the \
             damage):\n{}",
            broken.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_run_ids_differ_by_host_for_the_same_path() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let a = run_id_for("tail", file.path(), "container-a").unwrap();
        let b = run_id_for("tail", file.path(), "container-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, run_id_for("tail", file.path(), "container-a").unwrap());
    }
}
