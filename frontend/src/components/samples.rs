//! The sample panels: one per key of the selected runs' text and table samples, with a step
//! slider (or "latest", which follows new samples live), the same key of every selected run
//! side by side at that step, and, for text, a diff of one run's sample between two steps.

use crate::samples::{self, Body};
use crate::state::Ctx;
use leptos::prelude::*;
use stepstream_protocol::RunId;

#[component]
pub fn SamplePanels(ctx: Ctx) -> impl IntoView {
    let keys = Memo::new(move |_| {
        ctx.samples.get();
        samples::keys()
    });
    view! {
        <div class="samples" data-testid="samples">
            <For each=move || keys.get() key=|k| k.clone() let:key>
                <SamplePanel ctx=ctx key=key/>
            </For>
        </div>
    }
}

fn body_view(body: Body) -> AnyView {
    match body {
        Body::Text(t) => view! { <pre class="sample-text">{t}</pre> }.into_any(),
        // Histograms are drawn by `histograms::HistogramView`.
        Body::Histogram(h) => view! {
            <p class="none">{format!("histogram of {} bins", h.counts.len())}</p>
        }
        .into_any(),
        Body::Image {
            src,
            caption,
            width,
            height,
        } => view! {
            <figure class="sample-image">
                <img src=crate::fetch::api_url(&src) alt=caption.clone()
                    width=width.min(512).to_string()
                    style=format!("aspect-ratio:{width}/{height}")/>
                <figcaption>{caption}</figcaption>
            </figure>
        }
        .into_any(),
        Body::Table { columns, rows } => view! {
            <table class="sample-table">
                <thead><tr>{columns.into_iter().map(|c| view! { <th>{c}</th> }).collect_view()}</tr></thead>
                <tbody>{rows.into_iter().map(|r| view! {
                    <tr>{r.into_iter().map(|c| view! { <td>{c}</td> }).collect_view()}</tr>
                }).collect_view()}</tbody>
            </table>
        }
        .into_any(),
    }
}

#[component]
fn SamplePanel(ctx: Ctx, key: String) -> impl IntoView {
    let key = StoredValue::new(key);
    samples::load_key(&key.get_value());
    // `None`: the latest step, live.
    let chosen = RwSignal::new(None::<usize>);
    let diff_from = RwSignal::new(None::<usize>);
    let steps = Memo::new(move |_| {
        ctx.samples.get();
        samples::steps(&key.get_value())
    });
    let index = move || {
        let n = steps.with(Vec::len);
        chosen
            .get()
            .map_or(n.saturating_sub(1), |i| i.min(n.saturating_sub(1)))
    };
    let step = move || steps.with(|s| s.get(index()).copied());
    let shown = move || {
        ctx.samples.track();
        let runs: Vec<RunId> = ctx.selected.get();
        let Some(step) = step() else {
            return Vec::new();
        };
        samples::at(&runs, &key.get_value(), step)
    };
    let diff = move || {
        let from = diff_from.get()?;
        let a_step = steps.with(|s| s.get(from).copied())?;
        let b_step = step()?;
        let runs = ctx.selected.get();
        let run = runs.first()?;
        let a = samples::at(std::slice::from_ref(run), &key.get_value(), a_step);
        let b = samples::at(std::slice::from_ref(run), &key.get_value(), b_step);
        match (&a[0].1, &b[0].1) {
            (Some((_, Body::Text(a))), Some((_, Body::Text(b)))) => {
                Some((a_step, b_step, samples::diff(a, b)))
            }
            _ => None,
        }
    };
    view! {
        <section class="sample-panel" data-key=move || key.get_value()
            data-step=move || step().map(|s| s.to_string()).unwrap_or_default()>
            <div class="sample-head">
                <h3>{move || key.get_value()}</h3>
                <input class="sample-slider" type="range" min="0"
                    max=move || steps.with(|s| s.len().saturating_sub(1)).to_string()
                    prop:value=move || index().to_string()
                    on:input=move |ev| {
                        let i: usize = event_target_value(&ev).parse().unwrap_or(0);
                        let last = steps.with(|s| s.len().saturating_sub(1));
                        chosen.set((i < last).then_some(i));
                    }/>
                <span class="sample-step">{move || step().map(|s| format!("step {s}")).unwrap_or_default()}</span>
                <label><input type="checkbox" class="sample-latest"
                    prop:checked=move || chosen.get().is_none()
                    on:change=move |ev| if event_target_checked(&ev) {
                        chosen.set(None)
                    } else {
                        chosen.set(Some(index()))
                    }/>" latest"</label>
                <label><input type="checkbox" class="sample-diff"
                    prop:checked=move || diff_from.get().is_some()
                    on:change=move |ev| diff_from.set(
                        event_target_checked(&ev).then(|| index().saturating_sub(1)))/>" diff"</label>
                <Show when=move || diff_from.get().is_some()>
                    <input class="sample-diff-from" type="range" min="0"
                        max=move || steps.with(|s| s.len().saturating_sub(1)).to_string()
                        prop:value=move || diff_from.get().unwrap_or(0).to_string()
                        on:input=move |ev| diff_from.set(event_target_value(&ev).parse().ok())/>
                </Show>
            </div>
            <Show when=move || {
                ctx.samples.track();
                samples::is_histogram(&key.get_value())
            }>
                <super::histograms::HistogramView ctx=ctx key=key step=Signal::derive(step)/>
            </Show>
            <Show when=move || diff_from.get().is_none()
                fallback=move || view! {
                    <div class="sample-diff-view">{move || diff().map(|(a, b, lines)| view! {
                        <div class="diff-head">{format!("step {a} → step {b}")}</div>
                        {lines.into_iter().map(|(mark, line)| {
                            let class = match mark { '+' => "add", '-' => "del", _ => "same" };
                            view! { <div class=format!("diff-line {class}")>{format!("{mark} {line}")}</div> }
                        }).collect_view()}
                    })}</div>
                }>
                <div class="sample-runs" class:hidden=move || {
                    ctx.samples.track();
                    samples::is_histogram(&key.get_value())
                }>
                    {move || shown().into_iter().map(|(run, found)| {
                        let label = ctx.label(&run);
                        let at = found.as_ref().map(|(s, _)| s.to_string()).unwrap_or_default();
                        view! {
                            <div class="sample-run" data-run=run.to_string() data-at=at>
                                <div class="who">{label}</div>
                                {match found {
                                    Some((_, body)) => body_view(body),
                                    None => view! { <p class="none">"—"</p> }.into_any(),
                                }}
                            </div>
                        }
                    }).collect_view()}
                </div>
            </Show>
        </section>
    }
}
