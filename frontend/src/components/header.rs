//! The header (connection, theme, language), the stale banner, the legend of the watched
//! runs and their alerts.

use crate::i18n::{self, t, Text};
use crate::state::{Ctx, STORE};
use crate::view::remember_theme;
use leptos::prelude::*;
use stepstream_chart::theme::{color_of, css};

#[component]
pub fn Header(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    view! {
        <header>
            <h1>"stepstream"</h1>
            <span class="conn" data-conn=move || if ctx.live.get() { "live" } else { "reconnecting" }
                class:live=move || ctx.live.get()>
                {move || t(lang.get(), if ctx.live.get() { Text::Live } else { Text::Reconnecting })}
            </span>
            <button class="theme" data-theme=move || ctx.theme.get().code()
                title=move || t(lang.get(), Text::Theme)
                on:click=move |_| {
                    let next = ctx.theme.get_untracked().next();
                    remember_theme(next);
                    ctx.theme.set(next);
                }>
                {move || match ctx.theme.get() {
                    crate::view::ThemePref::Auto => "◐ auto",
                    crate::view::ThemePref::Light => "☀ light",
                    crate::view::ThemePref::Dark => "☾ dark",
                }}
            </button>
            <button class="lang" data-lang=move || lang.get().code()
                on:click=move |_| lang.update(|l| *l = l.other())>
                {move || t(lang.get(), Text::SwitchLanguage)}
            </button>
        </header>
    }
}

#[component]
pub fn StaleBanner(ctx: Ctx) -> impl IntoView {
    let stale = Memo::new(move |_| ctx.stale_runs());
    view! {
        <Show when=move || stale.with(|s| !s.is_empty())>
            <div class="banner" data-testid="stale-banner"
                data-runs=move || stale.with(|s| s.iter().map(|(r, _, _)| r.run_id.to_string()).collect::<Vec<_>>().join(","))>
                {move || stale.get().into_iter().map(|(r, quiet, last)| {
                    view! { <p>{i18n::stale(ctx.lang.get(), &r.name, quiet, &stepstream_chart::scale::clock(last / 1000.0))}</p> }
                }).collect_view()}
            </div>
        </Show>
        <Show when=move || ctx.deleted.with(|d| !d.is_empty())>
            <div class="banner deleted" data-testid="deleted-banner">
                {move || ctx.deleted.get().into_iter().map(|(run, by)| {
                    view! { <p>{format!("Run {run} was deleted by {by}.")}</p> }
                }).collect_view()}
                <button on:click=move |_| ctx.deleted.set(Vec::new())>"OK"</button>
            </div>
        </Show>
    }
}

#[component]
pub fn Legend(ctx: Ctx) -> impl IntoView {
    view! {
        <div class="legend">
            {move || {
                ctx.runs.track();
                ctx.configs.track();
                let grouping = ctx.grouping.get();
                let selected = ctx.selected.get();
                // Grouped: a group of two runs or more is one item in its colour.
                let runs = ctx.runs.get_untracked();
                let keys = crate::frame::group_keys(&ctx, &grouping, &selected, &runs);
                let key = |id: &stepstream_protocol::RunId| keys.iter().find(|(r, _)| r == id).and_then(|(_, k)| k.clone());
                let size = |k: &String| keys.iter().filter(|(_, x)| x.as_ref() == Some(k)).count();
                let mut shown: Vec<String> = Vec::new();
                selected.iter().filter_map(|id| {
                    match key(id).filter(|k| size(k) >= 2) {
                        Some(k) if shown.contains(&k) => None,
                        Some(k) => {
                            shown.push(k.clone());
                            let color = css(crate::bands::group_color(&k));
                            let name = format!("{k} ({} runs)", size(&k));
                            Some(view! { <span class="item group" data-group=k.clone() data-color=color.clone()>
                                <span class="swatch" style=format!("background:{color}")></span>{name}</span> }.into_any())
                        }
                        None => {
                            let name = ctx.label(id);
                            let color = css(color_of(id.as_str()));
                            Some(view! { <span class="item" data-run-id=id.to_string() data-color=color.clone()>
                                <span class="swatch" style=format!("background:{color}")></span>{name}</span> }.into_any())
                        }
                    }
                }).collect_view()
            }}
        </div>
    }
}

#[component]
pub fn AlertList(ctx: Ctx) -> impl IntoView {
    let items = move || {
        ctx.alerts.get();
        let selected = ctx.selected.get();
        let mut items: Vec<(String, stepstream_protocol::Alert)> = STORE.with(|s| {
            let s = s.borrow();
            selected
                .iter()
                .filter_map(|id| s.runs.get(id).map(|d| (id, d)))
                .flat_map(|(id, d)| {
                    let name = ctx.label(id);
                    d.alerts.iter().map(move |a| (name.clone(), a.clone()))
                })
                .collect()
        });
        items.sort_by(|a, b| b.1.at.total_cmp(&a.1.at));
        items
    };
    view! {
        <Show when=move || !items().is_empty()>
            <ul class="alerts" data-testid="alerts">
                {move || items().into_iter().map(|(name, a)| {
                    let state = if a.fired { "fired" } else { "resolved" };
                    view! {
                        <li class=format!("alert {state}") data-rule=a.rule.clone() data-step=a.step.to_string() data-state=state
                            title="show the console at this step"
                            on:click=move |_| ctx.console_step.set(Some(a.step))>
                            <b>{a.rule.clone()}</b>" · "{name}" · step "{a.step}" · "{a.message.clone()}
                        </li>
                    }
                }).collect_view()}
            </ul>
        </Show>
    }
}
