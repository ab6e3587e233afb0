//! `DELETE /api/runs/{id}`: deletes a run that ended, with everything stored of it (a write
//! token of the run's project; a read token never). `?by=NAME` says who, for the pages
//! that are told.

use super::{find, ApiError};
use crate::auth::{Presented, Scope};
use crate::hub::DeleteError;
use crate::state::AppState;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Asked {
    #[serde(default)]
    by: String,
}

pub async fn delete(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Extension(Presented(token)): Extension<Presented>,
    Path(id): Path<String>,
    Query(asked): Query<Asked>,
) -> Result<Json<Value>, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let project = run.state(|st| st.identity.project.clone());
    if !app.auth.current().may_write(token.as_deref(), &project) {
        tracing::info!(
            run = id,
            "a delete without a write token of the run's project refused"
        );
        return Err(ApiError::MayNotWrite(project));
    }
    // A name, not a message: 100 characters are plenty.
    let by: String = match asked.by.trim() {
        "" => "api".into(),
        by => by.chars().take(100).collect(),
    };
    match app.hub.delete_run(&run, &by).await {
        Ok(_) => Ok(Json(json!({ "run_id": id, "deleted": true }))),
        Err(DeleteError::NotEnded(why)) => Err(ApiError::Conflict(why)),
        Err(DeleteError::Store(e)) => Err(e.into()),
    }
}
