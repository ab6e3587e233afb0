//! `stepstream stop`, `checkpoint` and `note`: a command for a running training, through the
//! hub's API (`POST /api/runs/{id}/commands`), optionally waiting until the training
//! answered (and, for a stop, ended), told by the hub over the viewer socket, not polled.

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use stepstream_protocol::{CommandState, FromViewer, RunId, Subscribe, ToViewer};
use tokio_tungstenite::tungstenite::Message;

use crate::api::Failure;

#[derive(clap::Args)]
pub struct Target {
    /// The run's id.
    run: String,
    #[command(flatten)]
    to: crate::Writing,
    /// Why, for the run's timeline and its notice.
    #[arg(long, default_value = "")]
    reason: String,
    /// Who asks (default: $USER@host).
    #[arg(long)]
    by: Option<String>,
    /// Every rank of the run's job.
    #[arg(long)]
    job: bool,
    /// Wait up to this many seconds for the training's answer (and, for a stop, its end);
    /// exit non-zero if it declined or did not answer in time. 0: do not wait.
    #[arg(long, default_value_t = 0.0)]
    wait: f64,
}

#[derive(clap::Args)]
pub struct StopArgs {
    #[command(flatten)]
    target: Target,
    /// Stop without saving a checkpoint first.
    #[arg(long)]
    no_checkpoint: bool,
}

#[derive(clap::Args)]
pub struct NoteArgs {
    #[command(flatten)]
    target: Target,
    /// The note's text (a marker on the run's charts).
    #[arg(long)]
    text: String,
}

pub fn stop(args: StopArgs) -> Result<()> {
    let body = serde_json::json!({"action": "stop", "checkpoint": !args.no_checkpoint});
    send(&args.target, body, true)
}

pub fn checkpoint(target: Target) -> Result<()> {
    send(&target, serde_json::json!({"action": "checkpoint"}), false)
}

pub fn note(args: NoteArgs) -> Result<()> {
    send(
        &args.target,
        serde_json::json!({"action": "note", "text": args.text}),
        false,
    )
}

fn who_asks(by: &Option<String>) -> String {
    by.clone().unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "someone".into());
        format!("{user}@{}", stepstream_collector::hostname())
    })
}

#[derive(clap::Args)]
pub struct DeleteArgs {
    /// The ids of the runs to delete (each must have ended).
    #[arg(required = true)]
    runs: Vec<String>,
    #[command(flatten)]
    to: crate::Writing,
    /// Who deletes, as the pages watching are told (default: $USER@host).
    #[arg(long)]
    by: Option<String>,
}

/// `stepstream delete RUN...`: deletes runs that ended (`DELETE /api/runs/{id}`), each said
/// as it goes; non-zero when any was refused or not found.
pub fn delete(args: DeleteArgs) -> Result<()> {
    let api = args.to.api()?;
    let by = who_asks(&args.by);
    let mut failed = 0;
    for run in &args.runs {
        let run = RunId::new(run.clone()).map_err(anyhow::Error::msg)?;
        let req = api.request("DELETE", &format!("/api/runs/{run}"));
        match req.query("by", &by).call().map_err(|e| api.failed(e)) {
            Ok(_) => println!("run {run} deleted"),
            Err(Failure::Refused(code, why)) => {
                eprintln!("run {run} not deleted ({code}): {why}");
                failed += 1;
            }
            Err(Failure::Unreachable(e)) => return Err(e),
        }
    }
    if failed > 0 {
        bail!("{failed} of {} runs not deleted", args.runs.len());
    }
    Ok(())
}

fn send(t: &Target, mut body: serde_json::Value, stop: bool) -> Result<()> {
    let api = t.to.api()?;
    let token = t.to.token()?;
    let run = RunId::new(t.run.clone()).map_err(anyhow::Error::msg)?;
    let by = who_asks(&t.by);
    body["reason"] = t.reason.clone().into();
    body["by"] = by.into();
    body["job"] = t.job.into();
    let req = api.request("POST", &format!("/api/runs/{run}/commands"));
    let started = Instant::now();
    let req = req.set("Content-Type", "application/json");
    let answer = match req
        .send_string(&body.to_string())
        .map_err(|e| api.failed(e))
    {
        Ok(r) => crate::api::json(r, "the hub's answer")?,
        Err(Failure::Refused(code, why)) => bail!("the hub refused the command ({code}): {why}"),
        Err(Failure::Unreachable(e)) => return Err(e),
    };
    let queued: Vec<(String, u64)> = answer["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["run_id"].as_str()?.to_string(), c["id"].as_u64()?)))
        .collect();
    for (run, id) in &queued {
        println!("command {id} queued for run {run}");
    }
    if t.wait <= 0.0 {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let waited = Duration::from_secs_f64(t.wait);
    let outcome = rt.block_on(async {
        tokio::time::timeout(waited, wait_for(&api, token.as_deref(), &queued, stop)).await
    });
    match outcome {
        Err(_) => bail!("the training did not answer within {} s", t.wait),
        Ok(Err(e)) => Err(e),
        Ok(Ok(())) => {
            println!("answered after {:.3} s", started.elapsed().as_secs_f64());
            Ok(())
        }
    }
}

/// Waits on the viewer socket until every queued command is final (and, for a stop, its run
/// ended); an error for a command declined or expired.
async fn wait_for(
    api: &crate::api::Api,
    token: Option<&str>,
    queued: &[(String, u64)],
    stop: bool,
) -> Result<()> {
    let ws = api
        .base
        .replacen("http://", "ws://", 1)
        .replacen("https://", "wss://", 1);
    let mut url = format!("{ws}/ws/viewer");
    if let Some(t) = token {
        url.push_str("?token=");
        url.extend(form_urlencoded_byte(t));
    }
    let tls = tokio_tungstenite::Connector::Rustls(api.tls.clone());
    let (mut socket, _) =
        tokio_tungstenite::connect_async_tls_with_config(&url, None, false, Some(tls))
            .await
            .with_context(|| format!("cannot open the viewer socket at {ws}"))?;
    let runs: Vec<RunId> = queued
        .iter()
        .filter_map(|(r, _)| RunId::new(r.clone()).ok())
        .collect();
    let subscribe = FromViewer::Subscribe(Subscribe {
        runs: runs.clone(),
        metrics: Some(Vec::new()),
        from_step: None,
        budget: Some(1),
        after_seq: None,
        items: false,
    });
    socket
        .send(Message::Binary(subscribe.encode().into()))
        .await?;
    let mut open: std::collections::HashSet<u64> = queued.iter().map(|(_, id)| *id).collect();
    let mut running: std::collections::HashSet<RunId> = runs.into_iter().collect();
    let mut failure = None;
    while let Some(msg) = socket.next().await {
        let Message::Binary(bytes) = msg? else {
            continue;
        };
        match ToViewer::decode(&bytes) {
            Ok(ToViewer::CommandEvent(e)) if open.contains(&e.command.id) => match e.state {
                CommandState::Honoured => {
                    println!(
                        "run {}: {} honoured at step {}{}",
                        e.run_id,
                        e.command.action.name(),
                        e.step.map_or("?".into(), |s| s.to_string()),
                        if e.message.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", e.message)
                        }
                    );
                    open.remove(&e.command.id);
                }
                CommandState::Declined | CommandState::Expired => {
                    println!(
                        "run {}: {} {}: {}",
                        e.run_id,
                        e.command.action.name(),
                        e.state.as_str(),
                        e.message
                    );
                    failure = Some(format!("command {} was {}", e.command.id, e.state.as_str()));
                    open.remove(&e.command.id);
                }
                _ => {}
            },
            Ok(ToViewer::StatusChange(s))
                if s.status.is_terminal() && running.remove(&s.run_id) =>
            {
                println!("run {} ended: {}", s.run_id, s.status.as_str());
            }
            _ => {}
        }
        if open.is_empty() && (!stop || running.is_empty() || failure.is_some()) {
            break;
        }
    }
    match failure {
        Some(f) => bail!(f),
        None if !open.is_empty() => bail!("the hub closed the connection before the answer"),
        None => Ok(()),
    }
}

/// A token as a URL's query carries it (base64's `+`, `/` and `=` escaped).
fn form_urlencoded_byte(t: &str) -> impl Iterator<Item = char> + '_ {
    t.chars().flat_map(|c| {
        let keep = c.is_ascii_alphanumeric() || "-_.~".contains(c);
        let s = if keep {
            c.to_string()
        } else {
            format!("%{:02X}", c as u32)
        };
        s.chars().collect::<Vec<_>>()
    })
}
