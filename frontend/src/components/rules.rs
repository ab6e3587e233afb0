//! A project's alert rules in the page: the rules made here (list, delete), a form for a new
//! one (metric or pattern, condition or one of the hub's built-in rules, points in a row,
//! channels, action with its grace period) with a preview of where it would have fired on the selected run's history and a
//! test notice, and the operator's alerts file shown read-only. Channels are named by kind
//! only: the hub never sends the page an address, key or password.

use crate::fetch::{api_url, get_json};
use crate::write::{my_name, send};
use leptos::prelude::*;
use serde_json::{json, Value};
use stepstream_protocol::RunId;

fn enc(s: &str) -> String {
    String::from(js_sys::encode_uri_component(s))
}

#[component]
pub fn Rules(project: String, run: RunId) -> impl IntoView {
    let listing = RwSignal::new(None::<Value>);
    let said = RwSignal::new(String::new());
    let preview = RwSignal::new(String::new());
    let name = RwSignal::new(String::new());
    let metric = RwSignal::new("loss".to_string());
    let kind = RwSignal::new("above".to_string());
    let value = RwSignal::new("10".to_string());
    let window = RwSignal::new("50".to_string());
    let mode = RwSignal::new("min".to_string());
    let consecutive = RwSignal::new("1".to_string());
    let channels = RwSignal::new(Vec::<String>::new());
    let act = RwSignal::new("notify".to_string());
    let grace = RwSignal::new("600".to_string());
    let base = format!("/api/projects/{}/rules", enc(&project));
    let load = {
        let base = base.clone();
        move || {
            let url = api_url(&base);
            wasm_bindgen_futures::spawn_local(async move {
                match get_json(url).await {
                    Ok(v) => listing.set(Some(v)),
                    Err(e) => said.set(e),
                }
            });
        }
    };
    load();
    let rule = move || -> Value {
        let num = |s: String| s.trim().parse::<f64>().unwrap_or(f64::NAN);
        let kind_now = kind.get_untracked();
        let builtin = kind_now.strip_prefix("builtin:");
        let when = match kind_now.as_str() {
            _ if builtin.is_some() => json!({"builtin": builtin}),
            "above" => json!({"above": num(value.get_untracked())}),
            "below" => json!({"below": num(value.get_untracked())}),
            "non_finite" => json!("non_finite"),
            "stale" => json!({"stale": {"seconds": num(value.get_untracked())}}),
            "spike" => json!({"spike": {"factor": num(value.get_untracked()),
                "window": window.get_untracked().trim().parse::<u32>().unwrap_or(0)}}),
            _ => json!({"no_improvement": {"steps": num(value.get_untracked()) as i64,
                "mode": mode.get_untracked()}}),
        };
        let mut r = json!({
            "name": name.get_untracked().trim(),
            "metric": if builtin.is_some() { "*".to_string() } else { metric.get_untracked().trim().to_string() },
            "when": when,
            "consecutive": if builtin.is_some() { 1 } else { consecutive.get_untracked().trim().parse::<u32>().unwrap_or(1) },
            "channels": channels.get_untracked(),
        });
        if act.get_untracked() != "notify" {
            r["action"] =
                json!({"act": act.get_untracked(), "grace_s": num(grace.get_untracked())});
        }
        r
    };
    let post = {
        let (base, project) = (base.clone(), project.clone());
        move |what: &'static str, body: Value, then: Box<dyn Fn(Value)>| {
            let path = if what.is_empty() {
                base.clone()
            } else {
                format!("{base}/{what}")
            };
            let project = project.clone();
            wasm_bindgen_futures::spawn_local(async move {
                match send("POST", &path, &project, Some(body.to_string())).await {
                    Ok(v) => then(v),
                    Err(e) => said.set(e),
                }
            });
        }
    };
    let run_id = run.to_string();
    let on_preview = {
        let post = post.clone();
        move |_| {
            said.set(String::new());
            post(
                "preview",
                json!({"rule": rule(), "run_id": run_id}),
                Box::new(move |v: Value| {
                    let parts: Vec<String> = v["fired"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|f| {
                            let steps: Vec<String> = f["steps"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_i64)
                                .map(|s| s.to_string())
                                .collect();
                            if steps.is_empty() {
                                format!("{}: never", f["metric"].as_str().unwrap_or(""))
                            } else {
                                format!(
                                    "{}: at steps {}",
                                    f["metric"].as_str().unwrap_or(""),
                                    steps.join(", ")
                                )
                            }
                        })
                        .collect();
                    preview.set(if parts.is_empty() {
                        "no metric of this run matches".into()
                    } else {
                        format!("would have fired — {}", parts.join("; "))
                    });
                }),
            );
        }
    };
    let on_test = {
        let post = post.clone();
        move |_| {
            post(
                "test",
                json!({"rule": rule(), "by": my_name()}),
                Box::new(move |v: Value| {
                    let to: Vec<String> = v["sent_to"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c.as_str().map(str::to_string))
                        .collect();
                    said.set(format!(
                        "test notice sent to: {}",
                        if to.is_empty() {
                            "no channel".into()
                        } else {
                            to.join(", ")
                        }
                    ));
                }),
            )
        }
    };
    let on_save = {
        let (post, load) = (post.clone(), load.clone());
        move |_| {
            let load = load.clone();
            post(
                "",
                json!({"rule": rule(), "by": my_name()}),
                Box::new(move |_| {
                    said.set("saved: in force now".into());
                    load();
                }),
            )
        }
    };
    let project_for_delete = project.clone();
    view! {
        <details class="rules" data-testid="rules" data-project=project.clone()>
            <summary>{format!("Alert rules of project {project}")}</summary>
            <ul class="page-rules" data-testid="page-rules">
                {move || listing.get().map(|v| v["rules"].as_array().cloned().unwrap_or_default().into_iter().map(|r| {
                    let id = r["id"].as_u64().unwrap_or(0);
                    let rule = &r["rule"];
                    let action = rule["action"]["act"].as_str().map(|a| format!(", then {a} after {} s", rule["action"]["grace_s"])).unwrap_or_default();
                    let text = format!("{}: {} {}{action}", rule["name"].as_str().unwrap_or(""), rule["metric"].as_str().unwrap_or(""), r["describe"].as_str().unwrap_or(""));
                    let (load, project) = (load.clone(), project_for_delete.clone());
                    let delete = move |_| {
                        let (load, project) = (load.clone(), project.clone());
                        let path = format!("/api/projects/{}/rules/{id}", enc(&project));
                        wasm_bindgen_futures::spawn_local(async move {
                            match send("DELETE", &path, &project, None).await {
                                Ok(_) => load(),
                                Err(e) => said.set(e),
                            }
                        });
                    };
                    view! { <li data-id=id.to_string()>{text}" "<button class="delete-rule" on:click=delete>"delete"</button></li> }
                }).collect_view())}
            </ul>
            <div class="rule-form" data-testid="rule-form">
                <input class="rule-name" placeholder="name" prop:value=move || name.get() on:input=move |ev| name.set(event_target_value(&ev))/>
                <Show when=move || !kind.get().starts_with("builtin:")>
                    <input class="rule-metric" placeholder="metric or pattern (*/loss)" prop:value=move || metric.get() on:input=move |ev| metric.set(event_target_value(&ev))/>
                </Show>
                <select class="rule-kind" on:change=move |ev| kind.set(event_target_value(&ev))>
                    <option value="above">"above"</option>
                    <option value="below">"below"</option>
                    <option value="non_finite">"NaN / Inf"</option>
                    <option value="spike">"spike (x median)"</option>
                    <option value="no_improvement">"no improvement for N steps"</option>
                    <option value="stale">"no new point for N seconds"</option>
                    {move || listing.get().map(|v| v["builtins"].as_array().cloned().unwrap_or_default().into_iter().filter_map(|b| b.as_str().map(str::to_string)).map(|b| {
                        view! { <option value=format!("builtin:{b}")>{format!("built-in: {b}")}</option> }
                    }).collect_view())}
                </select>
                <Show when=move || !kind.get().starts_with("builtin:")>
                    <input class="rule-value" placeholder="value / factor / steps / seconds" prop:value=move || value.get() on:input=move |ev| value.set(event_target_value(&ev))/>
                </Show>
                <Show when=move || kind.get() == "spike">
                    <input class="rule-window" placeholder="window" prop:value=move || window.get() on:input=move |ev| window.set(event_target_value(&ev))/>
                </Show>
                <Show when=move || kind.get() == "no_improvement">
                    <select class="rule-mode" on:change=move |ev| mode.set(event_target_value(&ev))>
                        <option value="min">"lower is better"</option>
                        <option value="max">"higher is better"</option>
                    </select>
                </Show>
                <Show when=move || !kind.get().starts_with("builtin:")>
                    <label>" points in a row "<input class="rule-consecutive" size="4" prop:value=move || consecutive.get() on:input=move |ev| consecutive.set(event_target_value(&ev))/></label>
                </Show>
                <span class="rule-channels">
                    {move || listing.get().map(|v| v["channels"].as_array().cloned().unwrap_or_default().into_iter().filter_map(|c| c.as_str().map(str::to_string)).collect::<std::collections::BTreeSet<_>>().into_iter().map(|c| {
                        let c2 = c.clone();
                        view! { <label><input type="checkbox" class="rule-channel" value=c.clone() on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            channels.update(|list| { list.retain(|x| x != &c2); if on { list.push(c2.clone()); } });
                        }/>{c}</label> }
                    }).collect_view())}
                </span>
                <select class="rule-act" on:change=move |ev| act.set(event_target_value(&ev))>
                    <option value="notify">"notify"</option>
                    <option value="stop">"notify, then stop"</option>
                    <option value="checkpoint">"notify, then checkpoint"</option>
                </select>
                <Show when=move || act.get() != "notify">
                    <label>" after "<input class="rule-grace" size="5" prop:value=move || grace.get() on:input=move |ev| grace.set(event_target_value(&ev))/>" s unless acknowledged"</label>
                </Show>
                <div>
                    <button class="rule-preview" data-testid="rule-preview-button" on:click=on_preview>"Preview on this run"</button>
                    " "<button class="rule-test" data-testid="rule-test" on:click=on_test>"Send a test notice"</button>
                    " "<button class="rule-save" data-testid="rule-save" on:click=on_save>"Save"</button>
                </div>
                <p class="rule-preview" data-testid="rule-preview">{move || preview.get()}</p>
                <p class="rule-said" data-testid="rule-said">{move || said.get()}</p>
            </div>
            <details class="operator">
                <summary>"The hub's alerts file (read-only)"</summary>
                <pre data-testid="operator-toml">{move || listing.get().and_then(|v| v["operator_toml"].as_str().map(str::to_string)).unwrap_or_default()}</pre>
            </details>
        </details>
    }
}
