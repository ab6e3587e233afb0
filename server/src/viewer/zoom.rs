//! A viewer's zoom window: one metric of a run at its own resolution, read through the step
//! index by the same routine as the series endpoint (`downsample::window`), answered on the
//! socket, so the page has one way in from the hub.

use super::{error, frame, visible, Out};
use crate::auth::Scope;
use crate::hub::Hub;
use std::sync::Arc;
use stepstream_protocol::{ErrorCode, ToViewer, Zoom, Zoomed};

/// Points one zoom answer may hold, at most: a window is a chart's width of pixel columns,
/// and its frame stays far inside a viewer's queue.
pub(super) const ZOOM_POINTS: u32 = 100_000;

/// Reads the window and sends it, or an error that says why not.
pub(super) async fn answer(hub: Arc<Hub>, scope: Scope, zoom: Zoom, out: Out) {
    let most = ZOOM_POINTS.min(hub.limits.viewer_budget);
    if !(4..=most).contains(&zoom.budget) {
        let msg = format!(
            "zoom budget {} is outside 4..={most} points (limit viewer_budget)",
            zoom.budget
        );
        let _ = out.send(error(ErrorCode::Limit, &msg, false)).await;
        return;
    }
    let found = hub.find_run(&zoom.run_id).await;
    let Some(run) = found.filter(|_| visible(&hub, &scope, &zoom.run_id)) else {
        let msg = format!("unknown run {}", zoom.run_id);
        let _ = out.send(error(ErrorCode::UnknownRun, &msg, false)).await;
        return;
    };
    let (metric, last_seq) = run.state(|st| {
        let metric = st
            .metrics
            .iter()
            .find(|m| m.name == zoom.metric)
            .map(|m| m.id);
        (metric, st.tail.last_seq)
    });
    let Some(metric) = metric else {
        let msg = format!("run {} has no metric {:?}", zoom.run_id, zoom.metric);
        let _ = out.send(error(ErrorCode::UnknownRun, &msg, false)).await;
        return;
    };
    let read = crate::downsample::window(
        &hub.store,
        run.key,
        last_seq,
        metric,
        (Some(zoom.from), Some(zoom.to)),
        zoom.budget as usize,
    )
    .await;
    let window = match read {
        Ok(Some(w)) => w,
        Ok(None) => {
            let msg = format!("empty step range {}..{}", zoom.from, zoom.to);
            let _ = out
                .send(error(ErrorCode::ProtocolViolation, &msg, false))
                .await;
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "zoom read failed");
            let _ = out
                .send(error(
                    ErrorCode::Storage,
                    "the window could not be read",
                    false,
                ))
                .await;
            return;
        }
    };
    let _ = out
        .send(frame(ToViewer::Zoomed(Zoomed {
            id: zoom.id,
            run_id: zoom.run_id,
            metric: zoom.metric,
            from: window.from,
            to: window.to,
            total_points: window.total,
            downsampled: window.downsampled,
            steps: window.steps,
            values: window.values,
            times: window.times,
        })))
        .await;
}
