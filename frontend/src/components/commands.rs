//! Acting on a run's training from the page: stop (a checkpoint first, by default),
//! checkpoint now, and a note on the charts, each confirmed in the panel before it is sent
//! (`POST /api/runs/{id}/commands`), and the run's command timeline as the hub tells it.
//! The run's fired alerts can be acknowledged (a rule's pending stop called off) or muted
//! for some hours from here too.

use crate::state::{Ctx, STORE};
use crate::write::{my_name, send, set_my_name};
use leptos::prelude::*;
use stepstream_chart::scale::clock;
use stepstream_protocol::{Action, CommandState, RunId};

/// Who the page says asked: the name its user gave, else "the page".
fn signed(name: &str) -> String {
    match name.trim() {
        "" => "the page".to_string(),
        n => n.to_string(),
    }
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
    let by = RwSignal::new(my_name());
    let id = run.to_string();
    let dispatch = {
        let (id, project) = (id.clone(), project.clone());
        Callback::new(move |action: &'static str| {
            let mut body = serde_json::json!({
                "action": action,
                "reason": reason.get_untracked(),
                "by": signed(&by.get_untracked()),
                "job": all_ranks.get_untracked(),
            });
            match action {
                "stop" => body["checkpoint"] = checkpoint_first.get_untracked().into(),
                "note" => body["text"] = note.get_untracked().into(),
                _ => {}
            }
            set_my_name(&by.get_untracked());
            asking.set(None);
            result.set("sending…".into());
            let path = format!(
                "/api/runs/{}/commands",
                String::from(js_sys::encode_uri_component(&id))
            );
            let project = project.clone();
            wasm_bindgen_futures::spawn_local(async move {
                let said = match send("POST", &path, &project, Some(body.to_string())).await {
                    Ok(_) => "sent".to_string(),
                    Err(e) => e,
                };
                result.set(said);
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
    let alerts_run = run.clone();
    let acknowledge = {
        let (id, project) = (id.clone(), project.clone());
        Callback::new(move |(rule, hours): (String, f64)| {
            let path = format!(
                "/api/runs/{}/alerts/{}/ack",
                String::from(js_sys::encode_uri_component(&id)),
                String::from(js_sys::encode_uri_component(&rule))
            );
            let body = serde_json::json!({"by": signed(&by.get_untracked()), "mute_hours": hours});
            let project = project.clone();
            wasm_bindgen_futures::spawn_local(async move {
                let said = match send("POST", &path, &project, Some(body.to_string())).await {
                    Ok(_) if hours > 0.0 => format!("{rule}: acknowledged, muted {hours} h"),
                    Ok(_) => format!("{rule}: acknowledged"),
                    Err(e) => e,
                };
                result.set(said);
            });
        })
    };
    let deleting = RwSignal::new(false);
    let deleted = RwSignal::new(String::new());
    let delete = {
        let (id, project) = (id.clone(), project.clone());
        Callback::new(move |()| {
            deleting.set(false);
            deleted.set("deleting…".into());
            let path = format!(
                "/api/runs/{}?by={}",
                String::from(js_sys::encode_uri_component(&id)),
                String::from(js_sys::encode_uri_component(&signed(&by.get_untracked())))
            );
            let project = project.clone();
            wasm_bindgen_futures::spawn_local(async move {
                // Once deleted, the hub tells every page (this one too): the run leaves.
                if let Err(e) = send("DELETE", &path, &project, None).await {
                    deleted.set(e);
                }
            });
        })
    };
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
            <Show when=move || ended>
                <div class="delete-run">
                    <button class="delete" data-testid="delete" on:click=move |_| deleting.set(true)>"Delete run…"</button>
                    <Show when=move || deleting.get()>
                        <p class="confirm" data-testid="delete-confirm-box">
                            "Delete this run and everything stored of it (points, console, samples, alerts)? This cannot be undone."
                            " "<button class="confirm" data-testid="delete-confirm" on:click=move |_| delete.run(())>"Delete"</button>
                            " "<button class="cancel" on:click=move |_| deleting.set(false)>"Cancel"</button>
                        </p>
                    </Show>
                    <p class="command-result" data-testid="delete-result">{move || deleted.get()}</p>
                </div>
            </Show>
            <ul class="run-alerts" data-testid="run-alerts">
                {move || {
                    ctx.alerts.track();
                    // The latest fired alert of each rule: what may be acknowledged or muted.
                    let mut fired: Vec<(String, String)> = STORE.with(|s| s.borrow().runs.get(&alerts_run)
                        .map(|d| d.alerts.iter().filter(|a| a.fired)
                            .map(|a| (a.rule.clone(), a.message.lines().next().unwrap_or("").to_string())).collect())
                        .unwrap_or_default());
                    fired.reverse();
                    let mut seen = std::collections::HashSet::new();
                    fired.retain(|(r, _)| seen.insert(r.clone()));
                    fired.into_iter().map(|(rule, line)| {
                        let (r1, r2) = (rule.clone(), rule.clone());
                        view! {
                            <li data-rule=rule.clone()>{format!("{rule}: {line} ")}
                                <button class="ack" on:click=move |_| acknowledge.run((r1.clone(), 0.0))>"Acknowledge"</button>" "
                                <button class="mute" on:click=move |_| acknowledge.run((r2.clone(), 4.0))>"Mute 4 h"</button>
                            </li>
                        }
                    }).collect_view()
                }}
            </ul>
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
                                {format!("{what}{who}{why} — {}{at}{said} (asked {}, {} {})",
                                    e.state.as_str(), clock(e.command.issued_at), e.state.as_str(), clock(e.at))}
                            </li>
                        }
                    }).collect_view()
                }}
            </ol>
        </section>
    }
}
