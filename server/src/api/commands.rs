//! Commands for a run's training over HTTP: `POST /api/runs/{id}/commands` queues one (a write
//! token of the run's project; a read token never), `GET` lists the run's timeline.

use super::{find, ApiError};
use crate::auth::{Presented, Scope};
use crate::hub::commands::CommandError;
use crate::state::AppState;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use stepstream_protocol::{Action, CommandEvent};

/// A command as asked for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Asked {
    /// `stop`, `checkpoint` or `note`.
    action: String,
    /// With `stop`: save a checkpoint first (the default).
    #[serde(default = "yes")]
    checkpoint: bool,
    /// With `note`: its text.
    #[serde(default)]
    text: String,
    #[serde(default)]
    reason: String,
    /// Who asks, as they call themselves (the page sends the name its user gave).
    #[serde(default)]
    by: String,
    /// Every rank of the run's job, not the run alone.
    #[serde(default)]
    job: bool,
}

fn yes() -> bool {
    true
}

/// A command as the API shows it.
pub fn event_json(e: &CommandEvent) -> Value {
    let mut v = json!({
        "id": e.command.id,
        "run_id": e.run_id.as_str(),
        "action": e.command.action.name(),
        "by": e.command.by,
        "reason": e.command.reason,
        "issued_at": e.command.issued_at,
        "state": e.state.as_str(),
        "step": e.step,
        "message": e.message,
        "at": e.at,
    });
    match &e.command.action {
        Action::Stop { checkpoint } => v["checkpoint"] = json!(checkpoint),
        Action::Note { text } => v["text"] = json!(text),
        Action::Checkpoint => {}
    }
    v
}

pub async fn list(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let run_id = run.state(|st| st.identity.run_id.clone());
    let commands = app.hub.store.commands(run.key, run_id).await?;
    let list: Vec<Value> = commands.iter().map(event_json).collect();
    Ok(Json(json!({ "run_id": id, "commands": list })))
}

pub async fn post(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Extension(Presented(token)): Extension<Presented>,
    Path(id): Path<String>,
    Json(asked): Json<Asked>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (project, job) = run.state(|st| (st.identity.project.clone(), st.identity.job.clone()));
    if !app.auth.current().may_write(token.as_deref(), &project) {
        tracing::info!(
            run = id,
            "a command without a write token of the run's project refused"
        );
        return Err(ApiError::MayNotWrite(project));
    }
    let action = match asked.action.as_str() {
        "stop" => Action::Stop {
            checkpoint: asked.checkpoint,
        },
        "checkpoint" => Action::Checkpoint,
        "note" if !asked.text.trim().is_empty() => Action::Note { text: asked.text },
        "note" => return Err(ApiError::BadRequest("a note needs a text".into())),
        other => {
            return Err(ApiError::BadRequest(format!(
                "unknown action {other:?}: use stop, checkpoint or note"
            )))
        }
    };
    let by = if asked.by.trim().is_empty() {
        "api".to_string()
    } else {
        asked.by.trim().to_string()
    };
    // The job's ranks: every live run of the project with the same job (a lone run: itself).
    let targets = if asked.job && !job.is_empty() {
        let mut ranks: Vec<_> = app
            .hub
            .runs()
            .into_iter()
            .filter(|r| {
                r.state(|st| {
                    st.identity.project == project
                        && st.identity.job == job
                        && !st.status.is_terminal()
                })
            })
            .collect();
        ranks.sort_by_key(|r| r.state(|st| st.identity.rank));
        if ranks.is_empty() {
            vec![run]
        } else {
            ranks
        }
    } else {
        vec![run]
    };
    let mut queued = Vec::new();
    for target in targets {
        let event = app
            .hub
            .command(&target, action.clone(), by.clone(), asked.reason.clone())
            .await
            .map_err(|e| match e {
                CommandError::Ended { .. } => ApiError::Conflict(e.to_string()),
                CommandError::Limit(m) => ApiError::TooMany(m),
                CommandError::Store(e) => ApiError::Store(e),
            })?;
        queued.push(event_json(&event));
    }
    Ok((StatusCode::CREATED, Json(json!({ "commands": queued }))))
}

/// An acknowledgement as asked for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acknowledging {
    #[serde(default)]
    by: String,
    /// Mute the rule's notices for this run this many hours (0 to a week).
    #[serde(default)]
    mute_hours: f64,
}

/// `POST /api/runs/{id}/alerts/{rule}/ack`: acknowledges the rule's alert on the run (a
/// pending rule action is called off) and may mute its notices for some hours; a write
/// token of the run's project.
pub async fn acknowledge(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Extension(Presented(token)): Extension<Presented>,
    Path((id, rule)): Path<(String, String)>,
    Json(asked): Json<Acknowledging>,
) -> Result<Json<Value>, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (project, run_id) =
        run.state(|st| (st.identity.project.clone(), st.identity.run_id.clone()));
    if !app.auth.current().may_write(token.as_deref(), &project) {
        return Err(ApiError::MayNotWrite(project));
    }
    if !(0.0..=168.0).contains(&asked.mute_hours) {
        return Err(ApiError::BadRequest(format!(
            "mute_hours must be 0 to 168 (a week), not {}",
            asked.mute_hours
        )));
    }
    let alerts = app.hub.store.alerts(run.key, run_id).await?;
    if !alerts.iter().any(|a| a.rule == rule && a.fired) {
        return Err(ApiError::BadRequest(format!(
            "run {id} has no alert {rule:?} to acknowledge"
        )));
    }
    let by = match asked.by.trim() {
        "" => "api".to_string(),
        b if b.len() > crate::hub::commands::COMMAND_TEXT_BYTES || b.contains('\0') => {
            return Err(ApiError::BadRequest(
                "the name is too long or holds a NUL".into(),
            ))
        }
        b => b.to_string(),
    };
    let now = stepstream_protocol::unix_now();
    let mute_until = (asked.mute_hours > 0.0).then_some(now + asked.mute_hours * 3600.0);
    app.hub
        .store
        .acknowledge(run.key, rule.clone(), by.clone(), mute_until, now)
        .await?;
    tracing::info!(run = id, rule, by, ?mute_until, "alert acknowledged");
    Ok(Json(json!({
        "run_id": id,
        "rule": rule,
        "by": by,
        "at": now,
        "mute_until": mute_until,
    })))
}
