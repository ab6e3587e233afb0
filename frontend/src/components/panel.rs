//! What a run is: the run panel (config with nested keys flattened, host, rank and world
//! size, job, framework, start, duration, status with its message, alerts, downloads, the
//! embeddable widget's snippet), and
//! for several selected runs a config table with the keys that differ highlighted.

use super::commands::Commands;
use super::rules::Rules;
use crate::config::flatten;
use crate::fetch::api_url;
use crate::i18n::{self, t, Text};
use crate::state::{Ctx, STORE};
use leptos::prelude::*;
use std::collections::BTreeSet;
use stepstream_chart::scale::{clock, duration};
use stepstream_chart::theme::{color_of, css};

/// The widget's snippet for a run (its loss, else its first metric) and its iframe URL, on
/// the hub this page talks to. The page's own token is never put in: it may read everything.
fn embed(run: &str, last_values: &[(String, f64)]) -> (String, String) {
    let hub = match crate::fetch::api_base() {
        b if b.is_empty() => web_sys::window()
            .and_then(|w| w.location().origin().ok())
            .unwrap_or_default(),
        b => b,
    };
    let metric = last_values
        .iter()
        .map(|(n, _)| n.as_str())
        .find(|n| *n == "loss")
        .or_else(|| {
            last_values
                .iter()
                .map(|(n, _)| n.as_str())
                .find(|n| !n.starts_with("sys/"))
        })
        .unwrap_or("loss");
    let snippet = format!(
        "<div data-stepstream-run=\"{run}\" data-metric=\"{metric}\"></div>\n\
         <script src=\"{hub}/embed.js\" async></script>"
    );
    let frame = format!(
        "{hub}/embed?run={}&metric={}",
        String::from(js_sys::encode_uri_component(run)),
        String::from(js_sys::encode_uri_component(metric))
    );
    (snippet, frame)
}

#[component]
pub fn RunPanel(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    // The training's controls keep their state (a confirmation under way) while the panel
    // above them redraws every second: they are made again only when the run, or whether it
    // ended, changes.
    let target = Memo::new(move |_| {
        let selected = ctx.selected.get();
        let [id] = selected.as_slice() else {
            return None;
        };
        let r = ctx
            .runs
            .with(|runs| runs.iter().find(|r| &r.run_id == id).cloned())?;
        Some((id.clone(), r.project, r.job, r.status.is_terminal()))
    });
    view! {
        <Show when=move || ctx.selected.with(|s| s.len() == 1)>
            {move || {
                let Some(id) = ctx.selected.get().first().cloned() else { return ().into_any() };
                let summary = ctx.runs.get().into_iter().find(|r| r.run_id == id);
                let detail = ctx.details.get().get(&id).cloned();
                ctx.alerts.track();
                let alerts = STORE.with(|s| s.borrow().runs.get(&id).map_or(0, |d| d.alerts.iter().filter(|a| a.fired).count()));
                let Some(r) = summary else { return ().into_any() };
                let now = ctx.now.get() / 1000.0 + ctx.hub_offset.get();
                let end = if r.status.is_terminal() { r.last_point_at.unwrap_or(r.started_at) } else { now };
                let config = detail.as_ref().map(|d| flatten(&d["config"])).unwrap_or_default();
                let csv = api_url(&format!("/api/runs/{}/metrics.csv", id.as_str()));
                let parquet = api_url(&format!("/api/runs/{}/metrics.parquet", id.as_str()));
                let cfg = api_url(&format!("/api/runs/{}/config.json", id.as_str()));
                let color = css(color_of(id.as_str()));
                let l = lang.get();
                let (snippet, frame) = embed(id.as_str(), &r.last_values);
                view! {
                    <div class="run-panel" data-testid="run-panel" data-run-id=id.to_string()>
                        <h3><span class="swatch" style=format!("background:{color}")></span>{r.name.clone()}
                            <small>" "{r.project.clone()}" · "{id.to_string()}</small></h3>
                        <dl class="facts">
                            <dt>{t(l, Text::Status)}</dt>
                            <dd class=format!("status {}", r.status.as_str()) data-field="status">
                                {i18n::status(l, r.status)}{r.status_message.clone().map(|m| format!(" — {m}")).unwrap_or_default()}</dd>
                            <dt>{t(l, Text::Host)}</dt><dd data-field="host">{r.host.clone()}</dd>
                            <dt>{t(l, Text::Rank)}</dt><dd data-field="rank">{format!("{} / {}", r.rank, r.world_size)}
                                {(!r.job.is_empty()).then(|| format!(" · job {}", r.job))}</dd>
                            <dt>{t(l, Text::Framework)}</dt><dd data-field="framework">{r.framework.clone()}</dd>
                            <dt>{t(l, Text::Started)}</dt><dd data-field="started">{clock(r.started_at)}</dd>
                            <dt>{t(l, Text::Duration)}</dt><dd data-field="duration">{duration(end - r.started_at)}</dd>
                            <dt>{t(l, Text::AlertsWord)}</dt><dd data-field="alerts">{alerts}</dd>
                        </dl>
                        <p class="downloads">
                            <a class="csv" href=csv download="">{t(l, Text::Csv)}</a>" · "
                            <a class="parquet" href=parquet download="">"Parquet"</a>" · "
                            <a class="config" href=cfg download="">"config.json"</a>
                        </p>
                        <details class="embed" data-testid="embed">
                            <summary>{t(l, Text::Embed)}</summary>
                            <textarea readonly rows="3" data-field="snippet">{snippet}</textarea>
                            <p class="hint">{t(l, Text::EmbedHint)}" "
                                <a href=frame target="_blank" data-field="iframe">{t(l, Text::EmbedFrame)}</a></p>
                        </details>
                        <table class="config" data-testid="config">
                            <thead><tr><th>{t(l, Text::Key)}</th><th>{t(l, Text::Config)}</th></tr></thead>
                            <tbody>{config.into_iter().map(|(k, v)| view! {
                                <tr data-key=k.clone()><td>{k.clone()}</td><td>{v}</td></tr>
                            }).collect_view()}</tbody>
                        </table>
                    </div>
                }.into_any()
            }}
        </Show>
        {move || target.get().map(|(id, project, job, ended)| view! {
            <Commands ctx=ctx run=id.clone() project=project.clone() job=job ended=ended/>
            <Rules project=project run=id/>
        })}
        <Show when=move || ctx.selected.with(|s| s.len() > 1)>
            <Compare ctx=ctx/>
        </Show>
    }
}

/// The configs of the selected runs side by side; keys whose values differ are marked.
#[component]
fn Compare(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    view! {
        <div class="compare" data-testid="compare">
            <h3>{move || t(lang.get(), Text::Compare)}
                <label><input type="checkbox" class="only-diff" prop:checked=move || ctx.only_diff.get()
                    on:change=move |ev| ctx.only_diff.set(event_target_checked(&ev))/>
                    {move || t(lang.get(), Text::OnlyDiff)}</label></h3>
            {move || {
                let ids = ctx.selected.get();
                let details = ctx.details.get();
                // Until every config arrived, a missing one would read as "differs".
                if ids.iter().any(|id| !details.contains_key(id)) {
                    return view! { <p class="hint" data-testid="compare-loading">"…"</p> }.into_any();
                }
                let configs: Vec<Vec<(String, String)>> = ids.iter()
                    .map(|id| details.get(id).map(|d| flatten(&d["config"])).unwrap_or_default())
                    .collect();
                let keys: BTreeSet<String> = configs.iter().flatten().map(|(k, _)| k.clone()).collect();
                let only = ctx.only_diff.get();
                let rows: Vec<(String, Vec<Option<String>>, bool)> = keys.into_iter().map(|k| {
                    let vals: Vec<Option<String>> = configs.iter()
                        .map(|c| c.iter().find(|(ck, _)| *ck == k).map(|(_, v)| v.clone()))
                        .collect();
                    let differ = vals.iter().any(|v| v != &vals[0]);
                    (k, vals, differ)
                }).filter(|(_, _, d)| *d || !only).collect();
                view! {
                    <table class="config-diff">
                        <thead><tr><th>{t(lang.get(), Text::Key)}</th>
                            {ids.iter().map(|id| {
                                let c = css(color_of(id.as_str()));
                                view! { <th><span class="swatch" style=format!("background:{c}")></span>{ctx.label(id)}</th> }
                            }).collect_view()}</tr></thead>
                        <tbody>{rows.into_iter().map(|(k, vals, differ)| view! {
                            <tr class:diff=differ data-key=k.clone() data-diff=differ.to_string()>
                                <td>{k.clone()}</td>
                                {vals.into_iter().map(|v| view! { <td>{v.unwrap_or_else(|| "—".into())}</td> }).collect_view()}
                            </tr>
                        }).collect_view()}</tbody>
                    </table>
                }.into_any()
            }}
        </div>
    }
}
