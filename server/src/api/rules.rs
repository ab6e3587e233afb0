//! A project's alert rules over HTTP: the rules made in the page (list, add, delete, a
//! preview of where one would have fired on a run's history, a test notice), and the
//! operator's alerts file shown read-only: its rules, actions and endings, and the kinds of
//! its channels, never their addresses, keys or passwords.

use super::{find, ApiError};
use crate::alerts::custom::{self, PageRule, PROJECT_RULES};
use crate::auth::{Presented, Scope};
use crate::state::AppState;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use stepstream_protocol::unix_now;

fn may_read(scope: &Scope, project: &str) -> Result<(), ApiError> {
    if scope.allows(project, "") {
        Ok(())
    } else {
        Err(ApiError::NotCovered(project.to_string()))
    }
}

fn may_write(app: &AppState, token: &Option<String>, project: &str) -> Result<(), ApiError> {
    if app.auth.current().may_write(token.as_deref(), project) {
        Ok(())
    } else {
        Err(ApiError::MayNotWrite(project.to_string()))
    }
}

fn checked(rule: &PageRule, app: &AppState) -> Result<(), ApiError> {
    rule.check().map_err(ApiError::BadRequest)?;
    for c in &rule.channels {
        if !app.hub.has_channel(c) {
            return Err(ApiError::BadRequest(format!(
                "this hub has no {c:?} channel (it has: {})",
                app.hub.channel_labels().join(", ")
            )));
        }
    }
    Ok(())
}

/// `GET /api/projects/{project}/rules`.
pub async fn list(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(project): Path<String>,
) -> Result<Json<Value>, ApiError> {
    may_read(&scope, &project)?;
    let stored = app.hub.store.rules().await?;
    let rules: Vec<Value> = stored
        .iter()
        .filter(|r| r.project == project)
        .filter_map(|r| {
            let rule: PageRule = serde_json::from_str(&r.body).ok()?;
            Some(json!({"id": r.id, "rule": rule, "describe": rule.describe(), "by": r.by, "at": r.at}))
        })
        .collect();
    Ok(Json(json!({
        "project": project,
        "rules": rules,
        "channels": app.hub.channel_labels(),
        "builtins": crate::alerts::actions::BUILTIN_RULES,
        "operator_toml": app.hub.operator_toml,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adding {
    rule: PageRule,
    #[serde(default)]
    by: String,
}

/// `POST /api/projects/{project}/rules`: a write token of the project.
pub async fn add(
    State(app): State<AppState>,
    Extension(Presented(token)): Extension<Presented>,
    Path(project): Path<String>,
    Json(asked): Json<Adding>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    may_write(&app, &token, &project)?;
    checked(&asked.rule, &app)?;
    if app.hub.rules_of(&project).len() >= PROJECT_RULES {
        return Err(ApiError::TooMany(format!(
            "project {project:?} has {PROJECT_RULES} rules (the most it may have)"
        )));
    }
    if app
        .hub
        .rules_of(&project)
        .iter()
        .any(|(_, r)| r.name == asked.rule.name)
    {
        return Err(ApiError::Conflict(format!(
            "project {project:?} has a rule named {:?} already",
            asked.rule.name
        )));
    }
    if let Some(builtin) = asked.rule.builtin() {
        if app.hub.builtin_rule_of(&project, builtin).is_some() {
            return Err(ApiError::Conflict(format!(
                "project {project:?} has a rule for the built-in {builtin:?} already"
            )));
        }
    }
    let by = match asked.by.trim() {
        "" => "api".to_string(),
        b => b.chars().take(128).collect(),
    };
    let id = app.hub.add_rule(&project, asked.rule, by).await?;
    tracing::info!(project, id, "page rule added");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

/// `DELETE /api/projects/{project}/rules/{id}`: a write token of the project.
pub async fn delete(
    State(app): State<AppState>,
    Extension(Presented(token)): Extension<Presented>,
    Path((project, id)): Path<(String, u64)>,
) -> Result<Json<Value>, ApiError> {
    may_write(&app, &token, &project)?;
    if !app.hub.delete_rule(&project, id).await? {
        return Err(ApiError::BadRequest(format!(
            "project {project:?} has no rule {id}"
        )));
    }
    Ok(Json(json!({ "deleted": id })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Previewing {
    rule: PageRule,
    run_id: String,
}

/// `POST /api/projects/{project}/rules/preview`: where the rule would have fired on the
/// run's stored history, per metric it reads (a read of the run suffices).
pub async fn preview(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(project): Path<String>,
    Json(asked): Json<Previewing>,
) -> Result<Json<Value>, ApiError> {
    may_read(&scope, &project)?;
    asked.rule.check().map_err(ApiError::BadRequest)?;
    let run = find(&app, &asked.run_id, &scope).await?;
    if let Some(builtin) = asked.rule.builtin() {
        let steps = app.hub.preview_builtin(&run, builtin).await?;
        let fired = [json!({ "metric": builtin, "steps": steps })];
        return Ok(Json(json!({ "run_id": asked.run_id, "fired": fired })));
    }
    let (metrics, through) = run.state(|st| (st.metrics.clone(), st.tail.last_seq));
    let read: HashMap<u32, String> = metrics
        .iter()
        .filter(|m| asked.rule.reads(&m.name))
        .map(|m| (m.id.0, m.name.clone()))
        .collect();
    let wanted = read.clone();
    let points = app
        .hub
        .store
        .scan_values(
            run.key,
            0,
            through,
            BTreeMap::<u32, Vec<(i64, f64, f64)>>::new(),
            move |acc, step, wall, metric, v| {
                if wanted.contains_key(&metric.0) {
                    acc.entry(metric.0).or_default().push((step, v, wall));
                }
            },
        )
        .await?;
    let fired: Vec<Value> = points
        .into_iter()
        .map(|(id, pts)| {
            let name = read.get(&id).cloned().unwrap_or_default();
            let steps = custom::preview(&asked.rule, &name, pts);
            json!({ "metric": name, "steps": steps })
        })
        .collect();
    Ok(Json(json!({ "run_id": asked.run_id, "fired": fired })))
}

/// `POST /api/projects/{project}/rules/test`: a test notice on the rule's channels.
pub async fn test(
    State(app): State<AppState>,
    Extension(Presented(token)): Extension<Presented>,
    Path(project): Path<String>,
    Json(asked): Json<Adding>,
) -> Result<Json<Value>, ApiError> {
    may_write(&app, &token, &project)?;
    checked(&asked.rule, &app)?;
    let notice = crate::notify::Notice {
        run_id: String::new(),
        project: project.clone(),
        run_name: String::new(),
        rule: match asked.rule.builtin() {
            Some(builtin) => builtin.to_string(),
            None => format!("custom:{}", asked.rule.name),
        },
        state: "test",
        step: 0,
        value: f64::NAN,
        message: format!(
            "a test of rule {:?}: {} on {}",
            asked.rule.name,
            asked.rule.describe(),
            asked.rule.metric
        ),
        at: unix_now(),
        link: None,
    };
    let sent = app.hub.notify_to(notice, &asked.rule.channels);
    Ok(Json(json!({ "sent_to": sent })))
}
