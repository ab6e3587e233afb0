//! Acting on a run's training from the page: stop (a checkpoint first, by default),
//! checkpoint now, and a note on the charts, each confirmed in the panel before it is sent
//! (`POST /api/runs/{id}/commands`), and the run's command timeline as the hub tells it.
//!
//! A hub that guards writes asks for a write token of the run's project: the page asks its
//! user once and keeps it for the tab's session (never in the address bar, never the page's
//! read token).

use crate::fetch::api_base;
use crate::state::{Ctx, STORE};
use leptos::prelude::*;
use stepstream_protocol::{Action, CommandState, RunId};
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

const WRITE_TOKEN_KEY: &str = "stepstream.write_token";
const NAME_KEY: &str = "stepstream.name";

fn session() -> Option<web_sys::Storage> {
    web_sys::window().and_then(|w| w.session_storage().ok().flatten())
}

fn local() -> Option<web_sys::Storage> {
    web_sys::window().and_then(|w| w.local_storage().ok().flatten())
}

/// POSTs `body` to the run's commands with `token`; the status and the answer's text.
async fn post(run: &str, body: &str, token: Option<&str>) -> Result<(u16, String), String> {
    let window = web_sys::window().ok_or("no window")?;
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    let headers = web_sys::Headers::new().map_err(|e| format!("{e:?}"))?;
    headers
        .set("Content-Type", "application/json")
        .map_err(|e| format!("{e:?}"))?;
    // A read token the page holds lets the request through a guarded hub's reads; a write
    // token, when given, is what may command.
    if let Some(t) = token.map(str::to_string).or_else(crate::page::page_token) {
        headers
            .set("Authorization", &format!("Bearer {t}"))
            .map_err(|e| format!("{e:?}"))?;
    }
    init.set_headers(&headers);
    init.set_body(&wasm_bindgen::JsValue::from_str(body));
    let url = format!(
        "{}/api/runs/{}/commands",
        api_base(),
        String::from(js_sys::encode_uri_component(run))
    );
    let resp = JsFuture::from(window.fetch_with_str_and_init(&url, &init))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let resp: web_sys::Response = resp.dyn_into().map_err(|_| "not a response")?;
    let text = JsFuture::from(resp.text().map_err(|e| format!("{e:?}"))?)
        .await
        .map_err(|e| format!("{e:?}"))?
        .as_string()
        .unwrap_or_default();
    Ok((resp.status(), text))
}

/// Sends a command, asking for a write token once if the hub wants one; what to show.
async fn send(run: String, project: String, body: serde_json::Value) -> String {
    let body = body.to_string();
    let mut token = session().and_then(|s| s.get_item(WRITE_TOKEN_KEY).ok().flatten());
    for attempt in 0..2 {
        match post(&run, &body, token.as_deref()).await {
            Ok((201, _)) => return "sent".into(),
            Ok((401 | 403, text)) if attempt == 0 => {
                let asked = web_sys::window().and_then(|w| {
                    w.prompt_with_message(&format!(
                        "A write token of project {project} may command this run:"
                    ))
                    .ok()
                    .flatten()
                });
                match asked.filter(|t| !t.trim().is_empty()) {
                    Some(t) => {
                        if let Some(s) = session() {
                            let _ = s.set_item(WRITE_TOKEN_KEY, t.trim());
                        }
                        token = Some(t.trim().to_string());
                    }
                    None => return error_of(&text),
                }
            }
            Ok((_, text)) => return error_of(&text),
            Err(e) => return format!("not sent: {e}"),
        }
    }
    "not sent".into()
}

fn error_of(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| text.to_string())
}

/// What is about to be sent, shown for confirmation.
#[derive(Clone, PartialEq)]
enum Asking {
    Stop,
    Checkpoint,
}

#[component]
pub fn Commands(ctx: Ctx, run: RunId, project: String, job: String, ended: bool) -> impl IntoView {
    let asking = RwSignal::new(None::<Asking>);
    let result = RwSignal::new(String::new());
    let checkpoint_first = RwSignal::new(true);
    let all_ranks = RwSignal::new(false);
    let reason = RwSignal::new(String::new());
    let note = RwSignal::new(String::new());
    let by = RwSignal::new(
        local()
            .and_then(|s| s.get_item(NAME_KEY).ok().flatten())
            .unwrap_or_default(),
    );
    let id = run.to_string();
    let dispatch = {
        let (id, project) = (id.clone(), project.clone());
        Callback::new(move |action: &'static str| {
            let mut body = serde_json::json!({
                "action": action,
                "reason": reason.get_untracked(),
                "by": by.get_untracked(),
                "job": all_ranks.get_untracked(),
            });
            match action {
                "stop" => body["checkpoint"] = checkpoint_first.get_untracked().into(),
                "note" => body["text"] = note.get_untracked().into(),
                _ => {}
            }
            if let Some(s) = local() {
                let _ = s.set_item(NAME_KEY, &by.get_untracked());
            }
            asking.set(None);
            result.set("sending…".into());
            let (id, project) = (id.clone(), project.clone());
            wasm_bindgen_futures::spawn_local(async move {
                result.set(send(id, project, body).await);
            });
        })
    };
    let confirm = move |_| match asking.get_untracked() {
        Some(Asking::Stop) => dispatch.run("stop"),
        Some(Asking::Checkpoint) => dispatch.run("checkpoint"),
        None => {}
    };
    let send_note = move |_| {
        if !note.get_untracked().trim().is_empty() {
            dispatch.run("note");
            note.set(String::new());
        }
    };
    let timeline_run = run.clone();
    let has_job = !job.is_empty();
    view! {
        <section class="commands" data-testid="commands" data-run-id=id.clone()>
            <h4>"Training"</h4>
            <Show when=move || !ended>
                <div class="command-buttons">
                    <button class="stop" data-testid="stop" on:click=move |_| asking.set(Some(Asking::Stop))>"Stop…"</button>
                    <button class="checkpoint" data-testid="checkpoint" on:click=move |_| asking.set(Some(Asking::Checkpoint))>"Checkpoint…"</button>
                    <label><input type="checkbox" class="checkpoint-first" prop:checked=move || checkpoint_first.get()
                        on:change=move |ev| checkpoint_first.set(event_target_checked(&ev))/>" checkpoint before stopping"</label>
                    {has_job.then(|| view! {
                        <label><input type="checkbox" class="all-ranks" prop:checked=move || all_ranks.get()
                            on:change=move |ev| all_ranks.set(event_target_checked(&ev))/>" every rank of the job"</label>
                    })}
                </div>
                <div class="command-fields">
                    <input class="by" placeholder="your name" prop:value=move || by.get()
                        on:input=move |ev| by.set(event_target_value(&ev))/>
                    <input class="reason" placeholder="why" prop:value=move || reason.get()
                        on:input=move |ev| reason.set(event_target_value(&ev))/>
                </div>
                <div class="command-note">
                    <input class="note-text" placeholder="a note on the charts" prop:value=move || note.get()
                        on:input=move |ev| note.set(event_target_value(&ev))/>
                    <button class="note" data-testid="note" on:click=send_note>"Add note"</button>
                </div>
                <Show when=move || asking.get().is_some()>
                    <p class="confirm" data-testid="confirm-box">
                        {move || match asking.get() {
                            Some(Asking::Stop) => format!("Stop this training{}{}?",
                                if checkpoint_first.get() { " (checkpoint first)" } else { "" },
                                if all_ranks.get() { ", every rank of its job" } else { "" }),
                            _ => "Save a checkpoint now?".to_string(),
                        }}
                        " "<button class="confirm" data-testid="confirm" on:click=confirm>"Yes"</button>
                        " "<button class="cancel" on:click=move |_| asking.set(None)>"Cancel"</button>
                    </p>
                </Show>
                <p class="command-result" data-testid="command-result">{move || result.get()}</p>
            </Show>
            <ol class="timeline" data-testid="command-timeline">
                {move || {
                    ctx.commands.track();
                    let events: Vec<_> = STORE.with(|s| s.borrow().runs.get(&timeline_run)
                        .map(|d| d.commands.values().cloned().collect()).unwrap_or_default());
                    events.into_iter().map(|e| {
                        let what = match &e.command.action {
                            Action::Stop { checkpoint: true } => "stop (checkpoint first)".to_string(),
                            Action::Stop { .. } => "stop".to_string(),
                            Action::Checkpoint => "checkpoint".to_string(),
                            Action::Note { text } => format!("note “{text}”"),
                        };
                        let who = if e.command.by.is_empty() { String::new() } else { format!(" by {}", e.command.by) };
                        let why = if e.command.reason.is_empty() { String::new() } else { format!(" ({})", e.command.reason) };
                        let at = e.step.map(|s| format!(" at step {s}")).unwrap_or_default();
                        let said = if e.message.is_empty() { String::new() } else { format!(": {}", e.message) };
                        let done = matches!(e.state, CommandState::Honoured);
                        view! {
                            <li data-id=e.command.id.to_string() data-state=e.state.as_str() class:done=done>
                                {format!("{what}{who}{why} — {}{at}{said}", e.state.as_str())}
                            </li>
                        }
                    }).collect_view()
                }}
            </ol>
        </section>
    }
}
