//! `stepstream`: the hub (`serve`), the CSV follower (`tail`), the live demo (`demo`), and
//! commands for a running training (`stop`, `checkpoint`, `note`).

mod api;
mod command;
mod demo;
mod export;
mod follow;
mod token;
mod watch;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
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
    Serve(Box<ServeArgs>),
    /// Stream a metrics CSV (step,timestamp,loss,lr,...) or a MindFormers training log
    /// (--format mindformers) to a hub, following it as it grows.
    Tail(follow::TailArgs),
    /// A live demo: a hub on loopback and four small trainings streaming to it (one blows up;
    /// one drifts and is stopped by a rule).
    Demo(DemoArgs),
    /// Import TensorBoard event files (tensorboardX, PyTorch, MindFormers, TF2 scalars) into a
    /// hub: one run per directory holding event files. Run it again on a growing directory
    /// to add what is new, or with --follow to keep streaming it.
    Import(follow::ImportArgs),
    /// Issue a scoped token into the hub's tokens file (`serve --tokens FILE`): a read token
    /// for some projects or runs (what an embedding page should hold), or a write token for
    /// some projects. Prints the token; the running hub picks it up within a second.
    Token(token::TokenArgs),
    /// Stop a running training at its next safe point, saving a checkpoint first where the
    /// framework can (a write token of the run's project).
    Stop(command::StopArgs),
    /// Save a checkpoint of a running training at its next safe point, and go on.
    Checkpoint(command::Target),
    /// Put a note (a marker with text) on a run's charts.
    Note(command::NoteArgs),
    /// Delete runs that ended, with everything stored of them (a write token of their
    /// project); the pages watching them are told.
    Delete(command::DeleteArgs),
    /// Export runs' metrics into files, one per run: Parquet (typed columns, the run's config
    /// in the file's metadata; for pandas, polars, DuckDB) or CSV, by run id or --project.
    Export(export::ExportArgs),
    /// Watch the hub in a terminal (over SSH, in tmux): the run list, charts of the chosen
    /// runs, their alerts and console, pushed live.
    Watch(watch::WatchArgs),
    /// Copy the hub's SQLite database to DEST while the hub runs: one consistent moment,
    /// checked. (PostgreSQL: use pg_dump.)
    Backup(BackupArgs),
    /// Put a backup in place of the hub's SQLite database (the hub must be stopped).
    Restore(RestoreArgs),
}

#[derive(clap::Args)]
struct BackupArgs {
    /// Where the copy goes (never overwritten).
    dest: PathBuf,
    /// The hub's SQLite database.
    #[arg(long, default_value = "stepstream-data/hub.db", env = "STEPSTREAM_DB")]
    db: PathBuf,
}

#[derive(clap::Args)]
struct RestoreArgs {
    /// A file `stepstream backup` wrote.
    backup: PathBuf,
    /// The database to replace.
    #[arg(long, default_value = "stepstream-data/hub.db", env = "STEPSTREAM_DB")]
    db: PathBuf,
}

fn backup(args: BackupArgs) -> Result<()> {
    let copied = stepstream_server::store::backup(&args.db, &args.dest)
        .with_context(|| format!("backing up {}", args.db.display()))?;
    println!(
        "{}: {} runs, {} bytes",
        args.dest.display(),
        copied.runs,
        copied.bytes
    );
    Ok(())
}

fn restore(args: RestoreArgs) -> Result<()> {
    let copied = stepstream_server::store::restore(&args.backup, &args.db)
        .with_context(|| format!("restoring {}", args.backup.display()))?;
    println!(
        "{}: {} runs, {} bytes, from {}",
        args.db.display(),
        copied.runs,
        copied.bytes,
        args.backup.display()
    );
    Ok(())
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
    /// Keep everything in PostgreSQL instead (`postgres://user@host/db`), which several hubs
    /// can share; `--db` is then unused. The schema is created and migrated on start.
    #[arg(long, env = "STEPSTREAM_STORE", hide_env_values = true)]
    store: Option<String>,
    /// Join the hubs sharing `--store` through this NATS server (`nats://host:4222`): a
    /// viewer on any hub sees every run, and one hub judges each run.
    #[arg(
        long,
        env = "STEPSTREAM_NATS",
        requires = "store",
        hide_env_values = true
    )]
    nats: Option<String>,
    /// NATS user (with `--nats-password-file`).
    #[arg(long, env = "STEPSTREAM_NATS_USER", requires = "nats_password_file")]
    nats_user: Option<String>,
    /// A file holding the NATS user's password.
    #[arg(long, env = "STEPSTREAM_NATS_PASSWORD_FILE", requires = "nats_user")]
    nats_password_file: Option<PathBuf>,
    /// A file holding a NATS token.
    #[arg(long, env = "STEPSTREAM_NATS_TOKEN_FILE")]
    nats_token_file: Option<PathBuf>,
    /// A file holding a NATS nkey seed (`SU...`).
    #[arg(long, env = "STEPSTREAM_NATS_NKEY_FILE")]
    nats_nkey_file: Option<PathBuf>,
    /// A NATS `.creds` file (JWT and nkey seed).
    #[arg(long, env = "STEPSTREAM_NATS_CREDS")]
    nats_creds: Option<PathBuf>,
    /// PEM certificate(s) of the CA behind the NATS server's TLS certificate (TLS required).
    #[arg(long, env = "STEPSTREAM_NATS_CA")]
    nats_ca: Option<PathBuf>,
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
    /// While the collectors of four or more runs are busy, milliseconds between the starts of
    /// two database commits, at most (0: commit at once). The batches of every run that
    /// arrive meanwhile share one commit: with many runs this costs the hub far less CPU and
    /// disk, for up to this much more before a record is acknowledged (collectors do not
    /// wait for that, and a lone hub shows a batch to viewers before its commit; in a
    /// cluster the other hubs' viewers see it after). Fewer busy runs never wait.
    #[arg(long, default_value_t = stepstream_server::DEFAULT_COMMIT_INTERVAL.as_secs_f64() * 1e3)]
    commit_interval: f64,
    /// The linger the hub asks of collectors: `auto` (none while it receives under 2,000
    /// records a second, so each reaches viewers at once, rising to 40 ms at 8,000, which
    /// saves it most of its per-frame work), or milliseconds always. A collector's own
    /// `linger` is the most it waits.
    #[arg(long, default_value = "auto")]
    linger: String,
    /// Delete ended runs of a project on the hub's own, PROJECT=RULE (repeatable): an age
    /// since the run ended (`30d`, `12h`, `90m`, `45s`), a count of the last runs that ended
    /// to keep (`100`), or both (`30d,100`: a run goes when either says so). `*` is every
    /// project without its own rule. Runs that have not ended are never deleted.
    #[arg(long = "retain", value_name = "PROJECT=RULE")]
    retain: Vec<String>,
    /// Alert rules and notification channels (TOML; see docs/alerts.md). Without it the default
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
    /// A reverse proxy's address (repeat or comma-separate): from it, the per-address
    /// connection limit keys on the client named last in `X-Forwarded-For`. From anyone
    /// else that header is ignored.
    #[arg(long, env = "STEPSTREAM_TRUSTED_PROXIES", value_delimiter = ',')]
    trusted_proxy: Vec<std::net::IpAddr>,
    /// A limit, NAME=VALUE (repeatable): record_values, run_metrics, name_bytes,
    /// config_bytes, batch_records, runs, runs_per_project, connections_per_addr,
    /// viewer_budget. See docs/hub.md for the defaults.
    #[arg(long = "limit", value_name = "NAME=VALUE")]
    limits: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The terminal view owns the screen: a log line would tear it.
    if !matches!(cli.command, Command::Watch(_)) {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info,tower_http=warn".into()),
            )
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Tail(args) => follow::tail_file(args),
        Command::Demo(args) => run_demo(args),
        Command::Token(args) => token::issue_token(args),
        Command::Import(args) => follow::import_dir(args),
        Command::Stop(args) => command::stop(args),
        Command::Checkpoint(args) => command::checkpoint(args),
        Command::Note(args) => command::note(args),
        Command::Delete(args) => command::delete(args),
        Command::Export(args) => export::export(args),
        Command::Watch(args) => watch::watch(args),
        Command::Backup(args) => backup(args),
        Command::Restore(args) => restore(args),
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
pub(crate) fn token(
    given: Option<String>,
    file: Option<&std::path::Path>,
) -> Result<Option<String>> {
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

/// The hub and a write token, as every command that writes takes them.
#[derive(clap::Args)]
pub(crate) struct Writing {
    /// The hub (`ws://host:7070`, or as a browser names it, `http://host:7070`).
    #[arg(long, default_value = "ws://127.0.0.1:7070", env = "STEPSTREAM_HUB")]
    pub hub: String,
    /// A write token (of the run's project where the hub scopes tokens; a read token may
    /// not write). Prefer `--token-file`: a command line is visible to every user of the
    /// machine.
    #[arg(long, env = "STEPSTREAM_WRITE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the write token (its first line, trimmed).
    #[arg(long, env = "STEPSTREAM_WRITE_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// For a `wss://` or `https://` hub with a private CA: its PEM certificate(s).
    #[arg(long, env = "STEPSTREAM_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

impl Writing {
    pub fn token(&self) -> Result<Option<String>> {
        token(self.token.clone(), self.token_file.as_deref())
    }

    pub fn api(&self) -> Result<api::Api> {
        api::Api::new(&self.hub, self.token()?, self.ca_file.as_deref())
    }
}

/// The hub and a read token, as every command that reads takes them.
#[derive(clap::Args)]
pub(crate) struct Reading {
    /// The hub (`ws://host:7070`, `wss://...`, or as a browser names it, `http://...`).
    #[arg(long, default_value = "ws://127.0.0.1:7070", env = "STEPSTREAM_HUB")]
    pub hub: String,
    /// A read token. Prefer `--token-file`: a command line is visible to every user of the
    /// machine.
    #[arg(long, env = "STEPSTREAM_READ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the read token (its first line, trimmed).
    #[arg(long, env = "STEPSTREAM_READ_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// For a `wss://` or `https://` hub with a private CA: its PEM certificate(s).
    #[arg(long, env = "STEPSTREAM_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

impl Reading {
    pub fn token(&self) -> Result<Option<String>> {
        token(self.token.clone(), self.token_file.as_deref())
    }

    pub fn api(&self) -> Result<api::Api> {
        api::Api::new(&self.hub, self.token()?, self.ca_file.as_deref())
    }
}

/// A positive, finite number of seconds (a year at most) as a duration.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    if !(value > 0.0 && value <= 365.0 * 86_400.0) {
        bail!("{flag} must be a number of seconds above 0 and at most a year, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

/// `--linger`: `auto` (the hub's pace follows its load), or milliseconds always.
fn linger(given: &str) -> Result<Option<u32>> {
    if given == "auto" {
        return Ok(None);
    }
    match given.parse::<u32>() {
        Ok(ms) if ms <= 60_000 => Ok(Some(ms)),
        _ => bail!("--linger must be `auto` or milliseconds from 0 to 60000, not {given:?}"),
    }
}

fn commit_interval(ms: f64) -> Result<Duration> {
    if !(0.0..=1000.0).contains(&ms) {
        bail!("--commit-interval must be milliseconds from 0 to 1000, not {ms}");
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

fn serve(args: ServeArgs) -> Result<()> {
    let mut limits = stepstream_server::limits::HubLimits::default();
    for spec in &args.limits {
        limits.set(spec).map_err(anyhow::Error::msg)?;
    }
    if let Some(url) = &args.store {
        anyhow::ensure!(
            url.starts_with("postgres://") || url.starts_with("postgresql://"),
            "--store takes a postgres:// URL (without it the hub keeps SQLite at --db)"
        );
    }
    let settings = Settings {
        bind: args.bind,
        db: args.db,
        store: args.store,
        nats: args.nats,
        nats_auth: stepstream_server::cluster::NatsAuth {
            user: args.nats_user,
            password: token(None, args.nats_password_file.as_deref())?,
            token: token(None, args.nats_token_file.as_deref())?,
            nkey_seed: token(None, args.nats_nkey_file.as_deref())?,
            creds_file: args.nats_creds,
            ca_file: args.nats_ca,
        },
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
            ..Auth::default()
        },
        tokens_file: args.tokens.clone(),
        fsync: args.fsync,
        commit_interval: commit_interval(args.commit_interval)?,
        linger: linger(&args.linger)?,
        retention: {
            let mut r = stepstream_server::hub::retention::Retention::default();
            for spec in &args.retain {
                r.add(spec).map_err(anyhow::Error::msg)?;
            }
            r
        },
        insecure_no_auth: args.insecure_no_auth,
        allowed_hosts: args.allow_host,
        allowed_origins: args.allow_origin,
        trusted_proxies: args.trusted_proxy,
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
        store: None,
        nats: None,
        nats_auth: Default::default(),
        policy: StatusPolicy {
            stale_after: Duration::from_secs(30),
            fail_after: Some(Duration::from_secs(600)),
        },
        auth: Auth::default(),
        tokens_file: None,
        fsync: false,
        commit_interval: stepstream_server::DEFAULT_COMMIT_INTERVAL,
        linger: None,
        retention: Default::default(),
        insecure_no_auth: false,
        alerts: demo::alerts(),
        allowed_hosts: Vec::new(),
        allowed_origins: Vec::new(),
        trusted_proxies: Vec::new(),
        tls: None,
        limits: Default::default(),
    };
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let running = rt
        .block_on(stepstream_server::start(settings))
        .context("cannot start the demo hub")?;
    let addr = running.addr;
    println!("stepstream demo: open http://{addr}/ to watch four trainings live");
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
