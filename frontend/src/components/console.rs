//! The Console panel: the selected runs' lines, live. It follows the newest line unless
//! scrolled up; a regular expression searches, and stream and run filters narrow. A click on
//! a line puts the charts' crosshair at its step; a click on a chart (or on an alert) scrolls
//! here to that step.

use crate::console::{self, Line};
use crate::i18n::{t, Text};
use crate::state::{Ctx, Hover};
use leptos::html;
use leptos::prelude::*;

/// Lines drawn at once, at most (the newest that pass the filters).
const SHOWN: usize = 2_000;

/// The charts' crosshair at a line's step (on the step axis; at its time on the others).
fn crosshair_at(ctx: &Ctx, line: &Line) {
    let started = ctx.runs.with_untracked(|runs| {
        runs.iter()
            .find(|r| r.run_id == line.run)
            .map_or(0.0, |r| r.started_at)
    });
    let x = crate::lines::x_at_step(
        ctx.axis.get_untracked(),
        &ctx.x_metric.get_untracked(),
        &line.run,
        line.step,
        line.wall_time,
        started,
    );
    ctx.console_step.set(Some(line.step));
    let Some(x) = x else {
        return;
    };
    ctx.hover.set(Some(Hover {
        x,
        chart: String::new(),
        text: String::new(),
        page_x: 0.0,
        page_y: 0.0,
    }));
    crate::frame::overlay_dirty();
}

/// The search as a case-insensitive regular expression (`None` when empty).
fn compile(q: &str) -> Result<Option<regex_lite::Regex>, String> {
    if q.is_empty() {
        return Ok(None);
    }
    regex_lite::RegexBuilder::new(q)
        .case_insensitive(true)
        .size_limit(1 << 20)
        .build()
        .map(Some)
        .map_err(|e| e.to_string())
}

#[component]
pub fn ConsolePanel(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    let query = RwSignal::new(String::new());
    let stream = RwSignal::new(String::new());
    let only_run = RwSignal::new(String::new());
    let follow = RwSignal::new(true);
    let list: NodeRef<html::Div> = NodeRef::new();
    // Why the search is not a regular expression, if it is not.
    let pattern = Memo::new(move |_| compile(&query.get()).map(|_| ()));
    let shown = Memo::new(move |_| {
        ctx.console.get();
        ctx.selected.track();
        let p = compile(&query.get()).ok().flatten();
        let around = ctx.console_step.get().filter(|_| !follow.get());
        console::shown(p.as_ref(), &stream.get(), &only_run.get(), SHOWN, around)
    });
    // Follow the newest line unless the reader scrolled up; a step asked for scrolls to it.
    Effect::new(move |_| {
        shown.track();
        let target = ctx.console_step.get();
        let Some(el) = list.get() else {
            return;
        };
        let el: web_sys::Element = el.into();
        if let Some(step) = target.filter(|_| !follow.get_untracked()) {
            let found = el
                .query_selector(&format!(
                    ".line[data-step='{step}'], .line[data-after='{step}']"
                ))
                .ok()
                .flatten();
            if let Some(line) = found {
                // Within the box only (not the page): a third of the way down.
                let below =
                    line.get_bounding_client_rect().top() - el.get_bounding_client_rect().top();
                let top = el.scroll_top() as f64 + below - el.client_height() as f64 / 3.0;
                el.set_scroll_top(top.max(0.0) as i32);
            }
        } else if follow.get_untracked() {
            // At the next frame, when the page is laid out anyway: reading the height now,
            // while the rest of the page is being built (a run just opened), would lay it
            // out in the middle.
            request_animation_frame(move || el.set_scroll_top(el.scroll_height()));
        }
    });
    // A step asked for from a chart or an alert: stop following, load it if older.
    Effect::new(move |_| {
        if let Some(step) = ctx.console_step.get() {
            follow.set(false);
            console::load_at(step);
        }
    });
    let on_scroll = move |_| {
        if let Some(el) = list.get_untracked() {
            let el: web_sys::Element = el.into();
            let at_end = el.scroll_top() + el.client_height() >= el.scroll_height() - 4;
            if follow.get_untracked() != at_end {
                follow.set(at_end);
            }
        }
    };
    let download = move || {
        let runs = ctx.selected.get();
        let run = only_run.get();
        let run = if run.is_empty() {
            runs.first().map(|r| r.to_string()).unwrap_or_default()
        } else {
            run
        };
        crate::fetch::api_url(&format!("/api/runs/{run}/console?format=text"))
    };
    view! {
        <section class="console" data-testid="console" data-follow=move || follow.get().to_string()>
            <div class="console-head">
                <h3>{move || t(lang.get(), Text::Console)}</h3>
                <input class="console-search" type="search"
                    class:invalid=move || pattern.with(Result::is_err)
                    title=move || pattern.get().err().unwrap_or_default()
                    placeholder=move || t(lang.get(), Text::ConsoleSearch)
                    prop:value=move || query.get()
                    on:input=move |ev| query.set(event_target_value(&ev))/>
                <select class="console-stream" on:change=move |ev| stream.set(event_target_value(&ev))>
                    <option value="">{move || t(lang.get(), Text::AllStreams)}</option>
                    <option value="stdout">"stdout"</option>
                    <option value="stderr">"stderr"</option>
                </select>
                <Show when=move || ctx.selected.with(|s| s.len() > 1)>
                    <select class="console-run" on:change=move |ev| only_run.set(event_target_value(&ev))>
                        <option value="">{move || t(lang.get(), Text::AllRuns)}</option>
                        {move || ctx.selected.get().into_iter().map(|id| {
                            let label = ctx.label(&id);
                            view! { <option value=id.to_string()>{label}</option> }
                        }).collect_view()}
                    </select>
                </Show>
                <button class="console-follow" on:click=move |_| {
                    ctx.console_step.set(None);
                    follow.set(true);
                }>{move || t(lang.get(), Text::Follow)}</button>
                <a class="console-download" href=download download="">{move || t(lang.get(), Text::Download)}</a>
                <span class="console-dropped">{move || {
                    let dropped = shown.with(|s| s.1);
                    (dropped > 0).then(|| format!("{dropped} {}", t(lang.get(), Text::LinesDropped)))
                }}</span>
            </div>
            <div class="console-lines" node_ref=list on:scroll=on_scroll>
                {move || {
                    let (lines, _) = shown.get();
                    let target = ctx.console_step.get();
                    // The first line at or after a step asked for carries `data-after`.
                    let first_after = target.and_then(|s| lines.iter().position(|l| l.step >= s));
                    let many = ctx.selected.with(|s| s.len() > 1);
                    lines.into_iter().enumerate().map(|(i, l)| {
                        let label = many.then(|| ctx.label(&l.run));
                        let after = (Some(i) == first_after).then(|| target.unwrap_or(0).to_string());
                        let step = l.step;
                        let line = l.clone();
                        view! {
                            <div class="line" class:stderr=l.stderr class:target=after.is_some()
                                data-step=step.to_string() data-after=after data-run=l.run.to_string()
                                on:click=move |_| crosshair_at(&ctx, &line)>
                                <span class="step">{step}</span>
                                {label.map(|n| view! { <span class="who">{n}</span> })}
                                <span class="text">{l.text.clone()}</span>
                            </div>
                        }
                    }).collect_view()
                }}
            </div>
        </section>
    }
}
