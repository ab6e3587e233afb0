//! `stepstream`: the hub (`serve`), the CSV follower (`tail`) and the live demo (`demo`).

mod demo;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stepstream_collector::{tail, Collector, Options, Outcome};
use stepstream_protocol::RunId;
use stepstream_server::{Auth, Settings, StatusPolicy};

#[derive(Parser)]
#[command(
    name = "stepstream",
    version,
    about = "Live monitoring for deep-learning training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the hub: collectors stream in, browsers and scripts watch.
    Serve(ServeArgs),
    /// Stream a metrics CSV (step,timestamp,loss,lr,...) to a hub, following it as it grows.
    Tail(TailArgs),
    /// A live demo: a hub on loopback and three small trainings (one diverging) streaming to it.
    Demo(DemoArgs),
    /// Import TensorBoard event files (tensorboardX, PyTorch, MindFormers, TF2 scalars) into a
    /// hub: one run per directory holding event files. Run it again on a growing directory
    /// to add what is new, or with --follow to keep streaming it.
    Import(ImportArgs),
    /// Issue a scoped token into the hub's tokens file (`serve --tokens FILE`): a read token
    /// for some projects or runs (what an embedding page should hold), or a write token for
    /// some projects. Prints the token; the running hub picks it up within a second.
    Token(TokenArgs),
}

#[derive(clap::Args)]
struct ImportArgs {
    /// A directory: every directory under it holding `events.out.tfevents.*` files is a run.
    dir: PathBuf,
    #[arg(long, default_value = "ws://127.0.0.1:7070", env = "STEPSTREAM_HUB")]
    hub: String,
    #[arg(long, env = "STEPSTREAM_WRITE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[arg(long, default_value = "tensorboard")]
    project: String,
    /// Keep following the directories (and new ones) as they grow, until Ctrl-C.
    #[arg(long)]
    follow: bool,
    /// How often to look for new events while following, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// For a `wss://` hub with a private CA: its PEM certificate(s).
    #[arg(long, env = "STEPSTREAM_CA_FILE")]
    ca_file: Option<PathBuf>,
}

#[derive(clap::Args)]
struct TokenArgs {
    /// The tokens file the hub was started with (created if missing, mode 0600).
    #[arg(long)]
    tokens: PathBuf,
    /// A write token (collectors of the given projects) instead of a read token.
    #[arg(long)]
    write: bool,
    /// A project the token covers (repeat for several).
    #[arg(long = "project")]
    projects: Vec<String>,
    /// A run the token covers (read tokens; repeat for several).
    #[arg(long = "run")]
    runs: Vec<String>,
    /// Every project: an unscoped token.
    #[arg(long, conflicts_with_all = ["projects", "runs"])]
    all: bool,
    /// Who or what holds it (a comment in the file), e.g. `team wiki`.
    #[arg(long)]
    label: Option<String>,
}

#[derive(clap::Args)]
struct DemoArgs {
    #[arg(long, default_value = "127.0.0.1:7070")]
    bind: SocketAddr,
    #[arg(long, default_value = "stepstream-data/demo.db")]
    db: PathBuf,
    /// Training steps per run.
    #[arg(long, default_value_t = 3000)]
    steps: usize,
    /// Steps per second per run (0 = as fast as it trains).
    #[arg(long, default_value_t = 25.0)]
    rate: f64,
    /// Exit when the trainings end instead of serving on.
    #[arg(long)]
    exit_when_done: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on. Anything but loopback requires tokens.
    #[arg(long, default_value = "127.0.0.1:7070", env = "STEPSTREAM_BIND")]
    bind: SocketAddr,
    /// SQLite database file (created if missing).
    #[arg(long, default_value = "stepstream-data/hub.db", env = "STEPSTREAM_DB")]
    db: PathBuf,
    /// Seconds without data or heartbeat after which a running run is stale.
    #[arg(long, default_value_t = 30.0)]
    stale_after: f64,
    /// Seconds of silence after which a stale run is marked failed (0 = never).
    #[arg(long, default_value_t = 600.0)]
    fail_after: f64,
    /// Token collectors must present. Prefer the file or the environment: a command line is
    /// visible to every user of the machine in `ps`.
    #[arg(long, env = "STEPSTREAM_WRITE_TOKEN", hide_env_values = true)]
    write_token: Option<String>,
    /// A file holding the write token (surrounding whitespace ignored).
    #[arg(
        long,
        env = "STEPSTREAM_WRITE_TOKEN_FILE",
        conflicts_with = "write_token"
    )]
    write_token_file: Option<PathBuf>,
    /// Token viewers and API clients must present.
    #[arg(long, env = "STEPSTREAM_READ_TOKEN", hide_env_values = true)]
    read_token: Option<String>,
    /// A file holding the read token (surrounding whitespace ignored).
    #[arg(
        long,
        env = "STEPSTREAM_READ_TOKEN_FILE",
        conflicts_with = "read_token"
    )]
    read_token_file: Option<PathBuf>,
    /// Serve HTTPS and `wss://` with this certificate chain (PEM); reloaded when it changes.
    #[arg(long, env = "STEPSTREAM_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "STEPSTREAM_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Scoped tokens (TOML, `[[tokens]]` with `token`, `access` = "read" | "write",
    /// `projects`, `runs`): per-project write tokens, read tokens for some projects or runs.
    #[arg(long, env = "STEPSTREAM_TOKENS")]
    tokens: Option<PathBuf>,
    /// Allow listening beyond loopback without tokens.
    #[arg(long)]
    insecure_no_auth: bool,
    /// fsync every commit: survive power loss too, not only a killed process.
    #[arg(long)]
    fsync: bool,
    /// Alert rules and notification channels (TOML; see README). Without it the default
    /// rules run and alerts show in the web app, with no notifications.
    #[arg(long, env = "STEPSTREAM_ALERTS")]
    alerts: Option<PathBuf>,
    /// A name requests may carry in `Host` besides the bound address (a DNS name, a reverse
    /// proxy's); repeat or comma-separate. Anything else is refused (DNS rebinding).
    #[arg(long, env = "STEPSTREAM_ALLOW_HOSTS", value_delimiter = ',')]
    allow_host: Vec<String>,
    /// An origin (`https://wiki.example.org`) whose pages may use the hub (sockets and API)
    /// besides the hub's own; repeat or comma-separate; `*` for any. Browsers' requests from
    /// any other origin are refused (cross-site WebSocket hijacking).
    #[arg(long, env = "STEPSTREAM_ALLOW_ORIGINS", value_delimiter = ',')]
    allow_origin: Vec<String>,
    /// A limit, NAME=VALUE (repeatable): record_values, run_metrics, name_bytes,
    /// config_bytes, batch_records, runs, runs_per_project, connections_per_addr,
    /// viewer_budget. See the README for the defaults.
    #[arg(long = "limit", value_name = "NAME=VALUE")]
    limits: Vec<String>,
}

#[derive(clap::Args)]
struct TailArgs {
    /// The file to stream: a metrics CSV, or with `--format mindformers` a training log.
    file: PathBuf,
    /// `csv` (a header, then rows) or `mindformers` (MindFormers' training log: its loss
    /// monitor's lines, older and newer shapes; other lines skipped).
    #[arg(long, default_value = "csv", value_parser = ["csv", "mindformers"])]
    format: String,
    /// Hub address.
    #[arg(long, default_value = "ws://127.0.0.1:7070", env = "STEPSTREAM_HUB")]
    hub: String,
    #[arg(long, env = "STEPSTREAM_WRITE_TOKEN", hide_env_values = true)]
    token: Option<String>,
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
    /// For a `wss://` hub with a private CA: its PEM certificate(s).
    #[arg(long, env = "STEPSTREAM_CA_FILE")]
    ca_file: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Tail(args) => tail_file(args),
        Command::Demo(args) => run_demo(args),
        Command::Token(args) => issue_token(args),
        Command::Import(args) => import_dir(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stepstream: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A token given directly, or read from a file; empty means none.
fn token(given: Option<String>, file: Option<&std::path::Path>) -> Result<Option<String>> {
    let token = match file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => given,
    };
    Ok(token.filter(|t| !t.is_empty()))
}

/// A positive, finite number of seconds (a year at most) as a duration.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    if !(value > 0.0 && value <= 365.0 * 86_400.0) {
        bail!("{flag} must be a number of seconds above 0 and at most a year, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

fn serve(args: ServeArgs) -> Result<()> {
    let mut limits = stepstream_server::limits::HubLimits::default();
    for spec in &args.limits {
        limits.set(spec).map_err(anyhow::Error::msg)?;
    }
    let settings = Settings {
        bind: args.bind,
        db: args.db,
        policy: StatusPolicy {
            stale_after: seconds("--stale-after", args.stale_after)?,
            fail_after: if args.fail_after == 0.0 {
                None
            } else {
                Some(seconds("--fail-after", args.fail_after)?)
            },
        },
        auth: Auth {
            write: token(args.write_token, args.write_token_file.as_deref())?,
            read: token(args.read_token, args.read_token_file.as_deref())?,
            scoped: match &args.tokens {
                Some(path) => {
                    let text = std::fs::read_to_string(path).with_context(|| {
                        format!("cannot read the tokens file {}", path.display())
                    })?;
                    stepstream_server::auth::TokensFile::parse(&text)
                        .map_err(|e| anyhow::anyhow!("the tokens file {}: {e}", path.display()))?
                }
                None => Vec::new(),
            },
        },
        tokens_file: args.tokens.clone(),
        fsync: args.fsync,
        insecure_no_auth: args.insecure_no_auth,
        allowed_hosts: args.allow_host,
        allowed_origins: args.allow_origin,
        limits,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(stepstream_server::TlsFiles { cert, key }),
            _ => None,
        },
        alerts: match &args.alerts {
            Some(path) => {
                stepstream_server::notify::AlertsConfig::load(path).map_err(anyhow::Error::msg)?
            }
            None => Default::default(),
        },
    };
    if args.insecure_no_auth {
        tracing::warn!(
            "--insecure-no-auth: anyone who can reach {} can read and write runs",
            settings.bind
        );
    }
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    rt.block_on(async move {
        let running = stepstream_server::start(settings)
            .await
            .context("cannot start the hub")?;
        println!("stepstream hub listening on {scheme}://{}", running.addr);
        tokio::select! {
            r = running.wait() => r.context("the hub stopped"),
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("interrupted; stopping");
                Ok(())
            }
        }
    })
}

fn run_demo(args: DemoArgs) -> Result<()> {
    let settings = Settings {
        bind: args.bind,
        db: args.db,
        policy: StatusPolicy {
            stale_after: Duration::from_secs(30),
            fail_after: Some(Duration::from_secs(600)),
        },
        auth: Auth::default(),
        tokens_file: None,
        fsync: false,
        insecure_no_auth: false,
        alerts: Default::default(),
        allowed_hosts: Vec::new(),
        allowed_origins: Vec::new(),
        tls: None,
        limits: Default::default(),
    };
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let running = rt
        .block_on(stepstream_server::start(settings))
        .context("cannot start the demo hub")?;
    let addr = running.addr;
    println!("stepstream demo: open http://{addr}/ to watch three trainings live");
    if !stepstream_server::web::embedded() {
        eprintln!("stepstream demo: this binary has no web app built in (run scripts/build-web); the JSON API is at http://{addr}/api/runs");
    }
    let hub = format!("ws://{addr}");
    let (steps, rate) = (args.steps, args.rate);
    let trainings = std::thread::spawn(move || demo::run_all(&hub, steps, rate));
    let result = trainings.join().expect("demo trainings");
    result?;
    if args.exit_when_done {
        return Ok(());
    }
    println!("stepstream demo: all runs ended; still serving http://{addr}/ (Ctrl-C to stop)");
    rt.block_on(async {
        tokio::select! {
            r = running.wait() => r.context("the hub stopped"),
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })
}

/// A run id from the host and the file's absolute path, so the same file always maps to the
/// same run, and two containers tailing the same path (`/workspace/metrics.csv`) do not.
fn run_id_for(path: &std::path::Path, host: &str) -> Result<RunId> {
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
    Ok(RunId::new(format!("tail-{stem}-{:016x}", h))?)
}

fn tail_file(args: TailArgs) -> Result<()> {
    let run_id = match &args.run_id {
        Some(id) => RunId::new(id.clone())?,
        None => run_id_for(&args.file, &stepstream_collector::hostname())?,
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
    let mut options = Options::new(&args.hub, &args.project, &name);
    options.token = args.token.clone();
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
    options.ca_file = args.ca_file.clone();
    let collector = Collector::start(options)?;

    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc_flag(flag);

    // A tail that resumes must know what the hub has, or it would send those rows twice.
    let Some(after_step) = hub_last_step(&collector, &args.hub, &stop, "tail") else {
        return Ok(());
    };
    eprintln!(
        "stepstream tail: streaming {} as run {run_id}{}",
        args.file.display(),
        after_step.map_or(String::new(), |s| format!(", resuming after step {s}"))
    );
    let report = tail::tail_format(
        &args.file,
        format,
        &collector,
        after_step,
        !args.no_follow,
        Duration::from_millis(args.poll_ms.max(10)),
        &stop,
    )?;
    let sent = collector.finish(Outcome::Finished);
    eprintln!(
        "stepstream tail: {} rows sent, {} bad rows skipped, {} already on the hub; {}",
        report.rows,
        report.bad_rows,
        report.skipped,
        if sent.delivered {
            "all acknowledged"
        } else {
            "NOT all acknowledged"
        }
    );
    if !sent.delivered {
        bail!("{} records were not acknowledged by the hub", sent.unacked);
    }
    Ok(())
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
/// none); `None` when stopped first. Says every 2 s what it is waiting for.
fn hub_last_step(
    collector: &Collector,
    hub: &str,
    stop: &AtomicBool,
    who: &str,
) -> Option<Option<i64>> {
    loop {
        if let Some(last) = collector.wait_welcome(Duration::from_secs(2)) {
            return Some(last);
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        eprintln!(
            "stepstream {who}: waiting for the hub at {hub} ({})",
            collector.last_error().unwrap_or_default()
        );
    }
}

/// `stepstream import`: each directory of event files to a run, incrementally.
fn import_dir(args: ImportArgs) -> Result<()> {
    use stepstream_collector::tensorboard::{discover, RunDir};
    let root = std::fs::canonicalize(&args.dir)
        .with_context(|| format!("cannot open {}", args.dir.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    ctrlc_flag(stop.clone());
    let host = stepstream_collector::hostname();
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
            let run_id = run_id_for(&dir, &host)?;
            let run_id = RunId::new(run_id.as_str().replacen("tail-", "tb-", 1))?;
            let mut options = Options::new(&args.hub, &args.project, &name);
            options.token = args.token.clone();
            options.run_id = Some(run_id.clone());
            options.framework = "tensorboard import".into();
            options.ca_file = args.ca_file.clone();
            let collector = Collector::start(options)?;
            let Some(after) = hub_last_step(&collector, &args.hub, &stop, "import") else {
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
        let sent = collector.finish(Outcome::Finished);
        eprintln!(
            "stepstream import: {}: {} events ({} points) sent, {} already on the hub, {} \
             undecodable; {}",
            run.dir.display(),
            r.events - r.skipped,
            r.points,
            r.skipped,
            r.undecodable,
            if sent.delivered {
                "all acknowledged"
            } else {
                "NOT all acknowledged"
            }
        );
        if !sent.delivered {
            failed += sent.unacked;
        }
        if let Some(why) = &run.broken {
            broken.push(format!("{}: {why}", run.dir.display()));
        }
    }
    if failed > 0 {
        bail!("{failed} records were not acknowledged by the hub");
    }
    if !broken.is_empty() {
        bail!(
            "damaged event files (what came before the damage was imported):\n{}",
            broken.join("\n")
        );
    }
    Ok(())
}

/// `stepstream token`: appends a new scoped token to the tokens file, checking that the
/// file still parses with it, and prints the token.
fn issue_token(args: TokenArgs) -> Result<()> {
    use std::io::Write;
    use stepstream_server::auth::{new_token, TokensFile};
    if !args.all && args.projects.is_empty() && args.runs.is_empty() {
        anyhow::bail!("say what the token covers: --project P, --run R (read tokens), or --all");
    }
    let token = new_token().context("no randomness from the operating system")?;
    let quote = |v: &[String]| {
        v.iter()
            .map(|s| serde_json::Value::String(s.clone()).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut entry = String::from("\n[[tokens]]\n");
    if let Some(label) = &args.label {
        entry.push_str(&format!("# {}\n", label.replace(['\n', '\r'], " ")));
    }
    entry.push_str(&format!(
        "# issued {}\ntoken = \"{token}\"\naccess = \"{}\"\n",
        stepstream_protocol::utc_stamp(stepstream_protocol::unix_now()),
        if args.write { "write" } else { "read" }
    ));
    if !args.projects.is_empty() {
        entry.push_str(&format!("projects = [{}]\n", quote(&args.projects)));
    }
    if !args.runs.is_empty() {
        entry.push_str(&format!("runs = [{}]\n", quote(&args.runs)));
    }
    let old = match std::fs::read_to_string(&args.tokens) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", args.tokens.display())),
    };
    TokensFile::parse(&format!("{old}{entry}"))
        .map_err(|e| anyhow::anyhow!("{} would not parse: {e}", args.tokens.display()))?;
    let mut file = std::fs::OpenOptions::new();
    file.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
    file.open(&args.tokens)
        .and_then(|mut f| f.write_all(entry.as_bytes()))
        .with_context(|| format!("cannot write {}", args.tokens.display()))?;
    eprintln!(
        "issued a {} token into {}; a hub serving it picks it up within a second",
        if args.write { "write" } else { "read" },
        args.tokens.display()
    );
    println!("{token}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_run_ids_differ_by_host_for_the_same_path() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let a = run_id_for(file.path(), "container-a").unwrap();
        let b = run_id_for(file.path(), "container-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, run_id_for(file.path(), "container-a").unwrap());
    }
}
