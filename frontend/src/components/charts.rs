//! The charts: a toolbar for the whole page (smoothing, x axis, grouping runs into bands,
//! follow, metric filter), the
//! groups (training, speed, system, other; collapsible), and each chart's card with its own
//! switches (log scale, ignore outliers, enlarge, PNG) over a canvas and a crosshair overlay.

use crate::groups::{ChartSpec, Group};
use crate::i18n::{t, Lang, Text};
use crate::interact;
use crate::state::{mark_dirty, ChartOpts, Ctx};
use leptos::prelude::*;
use stepstream_chart::scale::Axis;
use wasm_bindgen::JsCast;

fn group_name(lang: Lang, g: Group) -> &'static str {
    t(
        lang,
        match g {
            Group::Training => Text::GroupTraining,
            Group::Speed => Text::GroupSpeed,
            Group::System => Text::GroupSystem,
            Group::Other => Text::GroupOther,
            Group::Layers => Text::GroupLayers,
        },
    )
}

#[component]
pub fn Toolbar(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    view! {
        <div class="toolbar">
            <label class="smoothing">{move || t(lang.get(), Text::Smoothing)}
                <input type="range" min="0" max="0.99" step="0.01" data-testid="smoothing"
                    prop:value=move || ctx.smoothing.get().to_string()
                    on:input=move |ev| ctx.set_smoothing(event_target_value(&ev).parse().unwrap_or(0.0))/>
                <span class="num">{move || format!("{:.2}", ctx.smoothing.get())}</span>
            </label>
            <label>{move || t(lang.get(), Text::XAxis)}
                <select class="axis" on:change=move |ev| {
                    let v = event_target_value(&ev);
                    match v.strip_prefix("metric:") {
                        Some(m) => {
                            ctx.x_metric.set(m.to_string());
                            ctx.axis.set(Axis::Metric);
                        }
                        None => ctx.axis.set(Axis::parse(&v).unwrap_or_default()),
                    }
                    ctx.follow();
                }>
                    {[(Axis::Step, Text::AxisStep), (Axis::Wall, Text::AxisWall), (Axis::Relative, Text::AxisRelative)]
                        .into_iter().map(|(a, txt)| view! {
                            <option value=a.code() prop:selected=move || ctx.axis.get() == a>{move || t(lang.get(), txt)}</option>
                        }).collect_view()}
                    {move || {
                        let (counts, others) = ctx.charts.with(|c| crate::groups::x_candidates(c));
                        // The chosen metric stays listed while no selected run has it yet.
                        let chosen = (ctx.axis.get() == Axis::Metric).then(|| ctx.x_metric.get());
                        let missing = chosen.clone().filter(|m| !counts.contains(m) && !others.contains(m));
                        let option = move |m: String| {
                            let selected = chosen.as_ref() == Some(&m);
                            view! { <option value=format!("metric:{m}") selected=selected>{m.clone()}</option> }
                        };
                        let counts = counts.into_iter().chain(missing).map(option.clone()).collect_view();
                        let others = others.into_iter().map(option).collect_view();
                        view! {
                            <optgroup label=move || t(lang.get(), Text::AxisCounts)>{counts}</optgroup>
                            <optgroup label=move || t(lang.get(), Text::AxisMetrics)>{others}</optgroup>
                        }
                    }}
                </select>
            </label>
            <Grouping ctx/>
            <label class="segments"><input class="all-segments" type="checkbox"
                prop:checked=move || ctx.all_segments.get()
                on:change=move |ev| { ctx.all_segments.set(event_target_checked(&ev)); mark_dirty(); }/>
                {move || t(lang.get(), Text::AllSegments)}</label>
            <button class="follow" class:active=move || ctx.window.with(Option::is_none)
                data-following=move || ctx.window.with(Option::is_none).to_string()
                on:click=move |_| ctx.follow()>
                {move || t(lang.get(), Text::Follow)}
                {move || ctx.window.get().map(|_| format!(" ({})", t(lang.get(), Text::Zoomed)))}
            </button>
            <input class="metric-filter" type="search" placeholder=move || t(lang.get(), Text::FilterMetrics)
                prop:value=move || ctx.filter.get()
                on:input=move |ev| { ctx.filter.set(event_target_value(&ev)); mark_dirty(); }/>
        </div>
    }
}

/// Grouping the selected runs: by job, a config key of theirs, or a name pattern; the
/// group's line (mean, median), its band (min-max, +/- std), and its members on demand.
#[component]
fn Grouping(ctx: Ctx) -> impl IntoView {
    use crate::view::{Center, GroupBy, Spread};
    let lang = ctx.lang;
    let set = move |f: &dyn Fn(&mut crate::view::Grouping)| {
        ctx.grouping.update(|g| f(g));
        mark_dirty();
    };
    // The selected runs' config keys, once the run list's configs are read.
    let keys = move || -> Vec<String> {
        let selected = ctx.selected.get();
        ctx.configs.with(|c| {
            let mut keys: Vec<String> = selected
                .iter()
                .filter_map(|id| c.as_ref()?.get(id))
                .flat_map(|cfg| cfg.iter().map(|(k, _)| k.clone()))
                .collect();
            keys.sort();
            keys.dedup();
            keys
        })
    };
    let code = move || match ctx.grouping.with(|g| g.by.clone()) {
        GroupBy::None => "none".to_string(),
        GroupBy::Job => "job".to_string(),
        GroupBy::Name(_) => "name".to_string(),
        GroupBy::Config(k) => format!("cfg:{k}"),
    };
    let on = move || ctx.grouping.with(|g| g.is_on());
    view! {
        <label class="grouping">{move || t(lang.get(), Text::GroupBy)}
            <select class="group-by"
                on:focus=move |_| if ctx.configs.with_untracked(Option::is_none) { ctx.load_configs() }
                on:change=move |ev| {
                    let v = event_target_value(&ev);
                    set(&|g| g.by = match v.as_str() {
                        "job" => GroupBy::Job,
                        "name" => GroupBy::Name(r"[-_]?seed[-_=]?\d+".to_string()),
                        v => v.strip_prefix("cfg:").map_or(GroupBy::None, |k| GroupBy::Config(k.to_string())),
                    });
                }>
                <option value="none" selected=move || code() == "none">{move || t(lang.get(), Text::GroupNone)}</option>
                <option value="job" selected=move || code() == "job">{move || t(lang.get(), Text::GroupJob)}</option>
                <option value="name" selected=move || code() == "name">{move || t(lang.get(), Text::GroupName)}</option>
                <optgroup label=move || t(lang.get(), Text::GroupConfig)>
                    {move || {
                        let chosen = code();
                        let mut keys = keys();
                        // The chosen key stays listed until the configs are read.
                        if let Some(k) = chosen.strip_prefix("cfg:") {
                            if !keys.iter().any(|x| x == k) {
                                keys.push(k.to_string());
                            }
                        }
                        keys.into_iter().map(|k| {
                            let value = format!("cfg:{k}");
                            let selected = value == chosen;
                            view! { <option value=value selected=selected>{k}</option> }
                        }).collect_view()
                    }}
                </optgroup>
            </select>
        </label>
        <Show when=move || ctx.grouping.with(|g| matches!(g.by, GroupBy::Name(_)))>
            <input class="group-pattern" type="text" title="regular expression taken out of run names"
                prop:value=move || ctx.grouping.with(|g| match &g.by { GroupBy::Name(p) => p.clone(), _ => String::new() })
                on:change=move |ev| { let p = event_target_value(&ev); set(&|g| g.by = GroupBy::Name(p.clone())); }/>
        </Show>
        <Show when=on>
            <select class="group-center" on:change=move |ev| {
                let median = event_target_value(&ev) == "median";
                set(&|g| g.center = if median { Center::Median } else { Center::Mean });
            }>
                <option value="mean" selected=move || ctx.grouping.with(|g| g.center == Center::Mean)>{move || t(lang.get(), Text::CenterMean)}</option>
                <option value="median" selected=move || ctx.grouping.with(|g| g.center == Center::Median)>{move || t(lang.get(), Text::CenterMedian)}</option>
            </select>
            <select class="group-band" on:change=move |ev| {
                let std = event_target_value(&ev) == "std";
                set(&|g| g.spread = if std { Spread::Std } else { Spread::MinMax });
            }>
                <option value="minmax" selected=move || ctx.grouping.with(|g| g.spread == Spread::MinMax)>{move || t(lang.get(), Text::BandMinMax)}</option>
                <option value="std" selected=move || ctx.grouping.with(|g| g.spread == Spread::Std)>{move || t(lang.get(), Text::BandStd)}</option>
            </select>
            <label><input class="group-members" type="checkbox"
                prop:checked=move || ctx.grouping.with(|g| g.members)
                on:change=move |ev| { let on = event_target_checked(&ev); set(&|g| g.members = on); }/>
                {move || t(lang.get(), Text::GroupMembers)}</label>
        </Show>
    }
}

#[component]
pub fn ChartGroups(ctx: Ctx) -> impl IntoView {
    let lang = ctx.lang;
    let visible = move |g: Group| -> Vec<ChartSpec> {
        let filter = ctx.filter.get().to_lowercase();
        ctx.charts
            .get()
            .into_iter()
            .filter(|s| s.group == g)
            .filter(|s| filter.is_empty() || s.key.to_lowercase().contains(&filter))
            .collect()
    };
    view! {
        {Group::ALL.into_iter().map(|g| {
            let open = move || !ctx.collapsed.with(|c| c.contains(&g));
            view! {
                <Show when=move || !visible(g).is_empty()>
                    <div class="group" data-group=g.code() class:collapsed=move || !open()>
                        <h3 class="group-head" on:click=move |_| {
                            ctx.collapsed.update(|c| if c.contains(&g) { c.retain(|x| *x != g) } else { c.push(g) });
                            mark_dirty();
                        }>{move || if open() { "▾ " } else { "▸ " }}{move || group_name(lang.get(), g)}
                            <small>{move || format!(" ({})", visible(g).len())}</small></h3>
                        <Show when=open>
                            <div class="grid">
                                <For each=move || visible(g) key=|s| s.key.clone() let:spec>
                                    <ChartCard ctx=ctx key=spec.key/>
                                </For>
                            </div>
                        </Show>
                    </div>
                </Show>
            }
        }).collect_view()}
    }
}

fn opts(ctx: &Ctx, key: &str) -> ChartOpts {
    ctx.chart_opts
        .with(|o| o.get(key).copied().unwrap_or_default())
}

fn set_opts(ctx: &Ctx, key: &str, f: impl FnOnce(&mut ChartOpts)) {
    ctx.chart_opts
        .update(|o| f(o.entry(key.to_string()).or_default()));
    mark_dirty();
}

/// Saves a chart's canvas as `<metric>.png`.
fn download_png(key: &str) {
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    let Some(canvas) = doc
        .query_selector(&format!("canvas[data-chart=\"{key}\"]"))
        .ok()
        .flatten()
        .and_then(|c| c.dyn_into::<web_sys::HtmlCanvasElement>().ok())
    else {
        return;
    };
    let Ok(url) = canvas.to_data_url() else {
        return;
    };
    let name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if let Ok(a) = doc.create_element("a") {
        let a: web_sys::HtmlAnchorElement = a.unchecked_into();
        a.set_href(&url);
        a.set_download(&format!("{name}.png"));
        a.click();
    }
}

#[component]
fn ChartCard(ctx: Ctx, key: String) -> impl IntoView {
    let lang = ctx.lang;
    let k = StoredValue::new(key.clone());
    let enlarged = move || {
        ctx.enlarged
            .with(|e| e.as_deref() == Some(k.get_value().as_str()))
    };
    mark_dirty();
    view! {
        <div class="chart" class:enlarged=enlarged data-chart-card=key.clone()>
            <div class="chart-tools">
                <label><input type="checkbox" class="log" prop:checked=move || opts(&ctx, &k.get_value()).log
                    on:change=move |ev| set_opts(&ctx, &k.get_value(), |o| o.log = event_target_checked(&ev))/>
                    {move || t(lang.get(), Text::LogScale)}</label>
                <label><input type="checkbox" class="robust" prop:checked=move || opts(&ctx, &k.get_value()).robust
                    on:change=move |ev| set_opts(&ctx, &k.get_value(), |o| o.robust = event_target_checked(&ev))/>
                    {move || t(lang.get(), Text::IgnoreOutliers)}</label>
                <button class="enlarge" on:click=move |_| {
                    let key = k.get_value();
                    ctx.enlarged.update(|e| *e = if e.as_deref() == Some(key.as_str()) { None } else { Some(key) });
                    mark_dirty();
                }>{move || if enlarged() { "⤡" } else { "⤢" }}" "{move || t(lang.get(), Text::Enlarge)}</button>
                <button class="png" on:click=move |_| download_png(&k.get_value())>{move || t(lang.get(), Text::Png)}</button>
            </div>
            <div class="plot">
                <canvas data-chart=key.clone()></canvas>
                <canvas class="overlay" data-overlay=key.clone()
                    on:wheel=move |ev| interact::wheel(&ctx, &k.get_value(), &ev)
                    on:mousedown=move |ev| interact::down(&ctx, &k.get_value(), &ev)
                    on:mouseup=move |_| interact::up(&ctx, &k.get_value())
                    on:mousemove=move |ev| interact::moved(&ctx, &k.get_value(), &ev)
                    on:mouseleave=move |_| interact::leave(&ctx)
                    on:dblclick=move |_| ctx.follow()></canvas>
            </div>
        </div>
    }
}

#[component]
pub fn Tooltip(ctx: Ctx) -> impl IntoView {
    view! {
        <Show when=move || ctx.hover.with(|h| h.as_ref().is_some_and(|h| !h.text.is_empty()))>
            <div class="tooltip" data-testid="tooltip"
                style=move || ctx.hover.with(|h| h.as_ref().map_or(String::new(), |h| format!("left:{}px;top:{}px", h.page_x + 14.0, h.page_y + 14.0)))>
                {move || ctx.hover.with(|h| h.as_ref().map(|h| h.text.clone()).unwrap_or_default())}
            </div>
        </Show>
    }
}
