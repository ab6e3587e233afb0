//! The run list: search (name, project, run id, job, config `key=value`, numeric filters
//! such as `val_loss<2.1` on a metric's last value or a config key), a status filter,
//! columns the user adds (`table`), sorting by any column, grouping by project, the list
//! as CSV, and the ranks of one distributed job shown as one row that expands. Past
//! [`WINDOWED_ABOVE`] rows only those in view are drawn (10,000 runs scroll). Each run's
//! colour is its own, here as on the charts.

use crate::i18n::{self, t, Text};
use crate::state::{Column, Config, Ctx};
use crate::table;
use leptos::prelude::*;
use std::cmp::Ordering;
use std::collections::HashMap;
use stepstream_chart::scale::value;
use stepstream_chart::theme::{color_of, css};
use stepstream_protocol::{RunId, RunStatus, RunSummary};

/// A line of the list.
#[derive(Clone)]
enum Row {
    Project(String),
    Run(RunSummary, bool),
    Job(String, Vec<RunSummary>),
}

fn loss(r: &RunSummary) -> Option<f64> {
    r.last_values
        .iter()
        .find(|(k, _)| k == "loss")
        .map(|(_, v)| *v)
}

/// Rows drawn at once, at most, past which only those in view are (with spacers above and
/// below standing for the rest).
pub const WINDOWED_ABOVE: usize = 150;
/// A row's height in CSS pixels once windowed (`tr.run` in `style.css`).
const ROW_PX: f64 = 29.0;

fn compare(
    a: &RunSummary,
    b: &RunSummary,
    col: Column,
    (extra, configs): (&[String], Option<&HashMap<RunId, Config>>),
) -> Ordering {
    let f =
        |x: Option<f64>, y: Option<f64>| x.unwrap_or(f64::MIN).total_cmp(&y.unwrap_or(f64::MIN));
    match col {
        Column::Project => a.project.cmp(&b.project),
        Column::Name => a.name.cmp(&b.name),
        Column::Status => a.status.as_str().cmp(b.status.as_str()),
        Column::LastStep => a.last_step.cmp(&b.last_step),
        Column::LastLoss => f(loss(a), loss(b)),
        Column::Age => f(b.last_point_at, a.last_point_at),
        Column::Started => a.started_at.total_cmp(&b.started_at),
        Column::Extra(i) => {
            let Some(key) = extra.get(i as usize) else {
                return Ordering::Equal;
            };
            let config = |r: &RunSummary| configs.and_then(|c| c.get(&r.run_id));
            table::compare(a, b, config(a), config(b), key)
        }
    }
}

/// Whether a run matches every search word: `key=value` against its flattened config,
/// anything else against its name, project, id and job.
fn matches(r: &RunSummary, words: &[String], config: Option<&Vec<(String, String)>>) -> bool {
    words.iter().all(|w| match w.split_once('=') {
        Some((k, v)) => config.is_some_and(|c| {
            c.iter()
                .any(|(ck, cv)| ck.to_lowercase() == k && cv.to_lowercase() == v)
        }),
        None => [&r.name, &r.project, &r.job, &r.run_id.to_string()]
            .iter()
            .any(|s| s.to_lowercase().contains(w.as_str())),
    })
}

fn rows(ctx: &Ctx) -> Vec<Row> {
    let search = table::normalize(&ctx.search.get().to_lowercase());
    let mut words: Vec<String> = search.split_whitespace().map(String::from).collect();
    let filters: Vec<table::Filter> = words.iter().filter_map(|w| table::filter(w)).collect();
    words.retain(|w| table::filter(w).is_none());
    let extra = table::columns(&ctx.columns.get());
    let wants_configs =
        !filters.is_empty() || !extra.is_empty() || words.iter().any(|w| w.contains('='));
    if wants_configs && ctx.configs.with_untracked(Option::is_none) {
        ctx.load_configs();
    }
    let configs = ctx.configs.get();
    let status = ctx.status_filter.get();
    let (col, asc) = ctx.sort.get();
    let mut runs: Vec<RunSummary> = ctx
        .runs
        .get()
        .into_iter()
        .filter(|r| status.is_empty() || r.status.as_str() == status)
        .filter(|r| {
            let config = configs.as_ref().and_then(|c| c.get(&r.run_id));
            matches(r, &words, config) && filters.iter().all(|f| f.passes(r, config))
        })
        .collect();
    let order = |a: &RunSummary, b: &RunSummary| {
        let o =
            compare(a, b, col, (&extra, configs.as_ref())).then_with(|| a.run_id.cmp(&b.run_id));
        if asc {
            o
        } else {
            o.reverse()
        }
    };
    runs.sort_by(order);
    // Ranks of one job gather under the job's row, placed where its first rank sorts.
    let mut items: Vec<Row> = Vec::new();
    for r in runs {
        if r.job.is_empty() {
            items.push(Row::Run(r, false));
            continue;
        }
        let found = items.iter_mut().find_map(|it| match it {
            Row::Job(j, ranks) if *j == r.job && ranks[0].project == r.project => Some(ranks),
            _ => None,
        });
        match found {
            Some(ranks) => ranks.push(r),
            None => items.push(Row::Job(r.job.clone(), vec![r])),
        }
    }
    if ctx.by_project.get() {
        let project = |it: &Row| match it {
            Row::Run(r, _) => r.project.clone(),
            Row::Job(_, ranks) => ranks[0].project.clone(),
            Row::Project(p) => p.clone(),
        };
        items.sort_by_key(project);
        let mut grouped = Vec::new();
        for it in items {
            let p = project(&it);
            if !grouped
                .iter()
                .any(|g| matches!(g, Row::Project(q) if *q == p))
            {
                grouped.push(Row::Project(p));
            }
            grouped.push(it);
        }
        items = grouped;
    }
    let expanded = ctx.expanded.get();
    let mut out = Vec::new();
    for it in items {
        if let Row::Job(job, mut ranks) = it {
            ranks.sort_by_key(|r| r.rank);
            let open = expanded.contains(&job);
            let children = ranks.clone();
            out.push(Row::Job(job, ranks));
            if open {
                out.extend(children.into_iter().map(|r| Row::Run(r, true)));
            }
        } else {
            out.push(it);
        }
    }
    out
}

#[component]
pub fn RunList(ctx: Ctx) -> impl IntoView {
    // The job whose stop awaits confirmation, and what the last stop said: kept here, as the
    // rows are drawn again with every list update.
    let stopping = RwSignal::new(None::<String>);
    let stop_said = RwSignal::new((String::new(), String::new()));
    let lang = ctx.lang;
    let scroll_top = RwSignal::new(0.0f64);
    let scroller: NodeRef<leptos::html::Div> = NodeRef::new();
    let header = move |col: Column, text: Text| {
        view! {
            <th data-sort=format!("{col:?}").to_lowercase()
                class:sorted=move || ctx.sort.get().0 == col
                on:click=move |_| ctx.sort.update(|s| *s = (col, if s.0 == col { !s.1 } else { true }))>
                {move || t(lang.get(), text)}
                {move || match ctx.sort.get() { (c, true) if c == col => " ▲", (c, false) if c == col => " ▼", _ => "" }}
            </th>
        }
    };
    view! {
        <div class="list-tools">
            <input class="search" type="search" placeholder=move || t(lang.get(), Text::Search)
                prop:value=move || ctx.search.get()
                on:input=move |ev| ctx.search.set(event_target_value(&ev))/>
            <select class="status-filter" on:change=move |ev| ctx.status_filter.set(event_target_value(&ev))>
                <option value="">{move || t(lang.get(), Text::AllStatuses)}</option>
                {[RunStatus::Running, RunStatus::Stale, RunStatus::Finished, RunStatus::Failed, RunStatus::Killed, RunStatus::Stopped]
                    .into_iter().map(|s| view! { <option value=s.as_str()>{move || i18n::status(lang.get(), s)}</option> }).collect_view()}
            </select>
            <label class="by-project"><input type="checkbox" prop:checked=move || ctx.by_project.get()
                on:change=move |ev| ctx.by_project.set(event_target_checked(&ev))/>
                {move || t(lang.get(), Text::GroupByProject)}</label>
            <input class="columns" type="text" placeholder="+ columns: val_loss, optim.lr"
                title="metrics (their last value) or config keys, comma separated; filter with val_loss<2.1 in the search"
                prop:value=move || ctx.columns.get()
                on:change=move |ev| ctx.columns.set(event_target_value(&ev))/>
            <button class="csv" title="the listed runs as CSV" on:click=move |_| download_csv(&ctx)>"CSV"</button>
        </div>
        <Show when=move || ctx.runs.with(|r| !r.is_empty())
            fallback=move || view! { <p class="hint">{move || t(lang.get(), Text::NoRuns)}</p> }>
            <div class="run-scroll" node_ref=scroller on:scroll=move |ev| {
                let el: web_sys::Element = event_target(&ev);
                scroll_top.set(el.scroll_top() as f64);
            }>
            <table class="run-list">
                <thead><tr>
                    <th></th>
                    {header(Column::Project, Text::Project)}
                    {header(Column::Name, Text::Name)}
                    {header(Column::Status, Text::Status)}
                    {header(Column::LastStep, Text::LastStep)}
                    {header(Column::LastLoss, Text::LastLoss)}
                    {header(Column::Age, Text::Age)}
                    {move || table::columns(&ctx.columns.get()).into_iter().enumerate().map(|(i, name)| {
                        let col = Column::Extra(i as u8);
                        view! {
                            <th class="extra" data-sort=format!("extra-{i}") data-column=name.clone()
                                class:sorted=move || ctx.sort.get().0 == col
                                on:click=move |_| ctx.sort.update(|s| *s = (col, if s.0 == col { !s.1 } else { true }))>
                                {name.clone()}
                                {move || match ctx.sort.get() { (c, true) if c == col => " ▲", (c, false) if c == col => " ▼", _ => "" }}
                            </th>
                        }
                    }).collect_view()}
                </tr></thead>
                <tbody>
                    {move || {
                        let now = ctx.now.get() / 1000.0 + ctx.hub_offset.get();
                        let selected = ctx.selected.get();
                        let extra = table::columns(&ctx.columns.get());
                        let configs = ctx.configs.get();
                        let cells = Cells { extra: &extra, configs: configs.as_ref() };
                        let all = rows(&ctx);
                        // Windowed past a few hundred rows: the rows in view (and a screen
                        // either side), spacers of the same height for the rest.
                        let (from, to) = if all.len() > WINDOWED_ABOVE {
                            let top = scroll_top.get();
                            let height = scroller.get().map_or(800.0, |e| e.client_height() as f64).max(200.0);
                            let from = ((top - height) / ROW_PX).max(0.0) as usize;
                            (from.min(all.len()), ((top + 2.0 * height) / ROW_PX).ceil() as usize)
                        } else {
                            (0, all.len())
                        };
                        let to = to.min(all.len());
                        let n = all.len();
                        let spacer = move |rows: usize| (rows > 0).then(|| view! {
                            <tr class="spacer" style=format!("height:{}px", rows as f64 * ROW_PX)><td colspan="7"></td></tr>
                        });
                        let drawn = all.into_iter().skip(from).take(to - from).map(|row| match row {
                            Row::Project(p) => view! {
                                <tr class="project-row" data-project=p.clone()><td colspan="7">{p.clone()}</td></tr>
                            }.into_any(),
                            Row::Run(r, nested) => run_row(ctx, r, nested, &selected, now, &cells).into_any(),
                            Row::Job(job, ranks) => job_row(ctx, job, ranks, &selected, (stopping, stop_said), &cells).into_any(),
                        }).collect_view();
                        view! { {spacer(from)} {drawn} {spacer(n - to)} }
                    }}
                </tbody>
            </table>
            </div>
        </Show>
    }
}

/// What the added columns of a row read from.
struct Cells<'a> {
    extra: &'a [String],
    configs: Option<&'a HashMap<RunId, Config>>,
}

impl Cells<'_> {
    fn of(&self, r: &RunSummary) -> impl IntoView {
        let config = self.configs.and_then(|c| c.get(&r.run_id));
        self.extra
            .iter()
            .map(|key| {
                let v = table::cell(r, config, key).unwrap_or_default();
                view! { <td class="num extra">{v}</td> }
            })
            .collect_view()
    }
}

/// The listed runs (as filtered and sorted) with the added columns, saved as `runs.csv`.
fn download_csv(ctx: &Ctx) {
    let extra = table::columns(&ctx.columns.get_untracked());
    let configs = ctx.configs.get_untracked();
    let listed: Vec<RunSummary> = untrack(|| rows(ctx))
        .into_iter()
        .flat_map(|row| match row {
            Row::Run(r, _) => vec![r],
            Row::Job(_, ranks) => ranks,
            Row::Project(_) => Vec::new(),
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    let pairs: Vec<(&RunSummary, Option<&Config>)> = listed
        .iter()
        .filter(|r| seen.insert(r.run_id.clone()))
        .map(|r| (r, configs.as_ref().and_then(|c| c.get(&r.run_id))))
        .collect();
    let text = table::csv(&pairs, &extra);
    let url = format!(
        "data:text/csv;charset=utf-8,{}",
        String::from(js_sys::encode_uri_component(&text))
    );
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    if let Ok(a) = doc.create_element("a") {
        use wasm_bindgen::JsCast;
        let a: web_sys::HtmlAnchorElement = a.unchecked_into();
        a.set_href(&url);
        a.set_download("runs.csv");
        a.click();
    }
}

fn run_row(
    ctx: Ctx,
    r: RunSummary,
    nested: bool,
    selected: &[RunId],
    now: f64,
    cells: &Cells<'_>,
) -> impl IntoView {
    let lang = ctx.lang;
    let id = r.run_id.clone();
    let on = selected.contains(&id);
    let color = css(color_of(id.as_str()));
    let loss = loss(&r).map(value);
    let age = r
        .last_point_at
        .map(|t| i18n::age(lang.get_untracked(), now - t));
    let status = r.status;
    let name = if nested {
        format!("rank {}", r.rank)
    } else {
        r.name.clone()
    };
    view! {
        <tr class="run" class:selected=on class:nested=nested data-run-id=id.to_string()
            data-status=status.as_str() data-color=color.clone() data-job=r.job.clone()
            on:click=move |_| ctx.toggle(id.clone())>
            <td><span class="swatch" style=format!("background:{color}")></span>
                <input type="checkbox" prop:checked=on/></td>
            <td>{r.project.clone()}</td>
            <td title=r.run_id.to_string()>{name}</td>
            <td class=format!("status {}", status.as_str())
                title=r.status_message.clone().unwrap_or_default()>
                {i18n::status(lang.get_untracked(), status)}
            </td>
            <td class="num">{r.last_step.map(|s| s.to_string()).unwrap_or_default()}</td>
            <td class="num">{loss.unwrap_or_default()}</td>
            <td class="num">{age.unwrap_or_default()}</td>
            {cells.of(&r)}
        </tr>
    }
}

/// A job's stop, asked from its row: which job awaits confirmation, and what was said.
type JobStop = (RwSignal<Option<String>>, RwSignal<(String, String)>);

/// Stops every live rank of `job` through one of them (the hub finds the others).
fn stop_job(job: String, project: String, rank: RunId, said: RwSignal<(String, String)>) {
    let path = format!(
        "/api/runs/{}/commands",
        String::from(js_sys::encode_uri_component(rank.as_str()))
    );
    let body = serde_json::json!({"action": "stop", "job": true, "by": crate::write::my_name(),
        "reason": format!("job {job} stopped from the run list")});
    said.set((job.clone(), "sending…".into()));
    wasm_bindgen_futures::spawn_local(async move {
        let answer = crate::write::send("POST", &path, &project, Some(body.to_string())).await;
        let text = match answer {
            Ok(v) => format!(
                "stop sent to {} ranks",
                v["commands"].as_array().map_or(0, Vec::len)
            ),
            Err(e) => e,
        };
        said.set((job, text));
    });
}

fn job_row(
    ctx: Ctx,
    job: String,
    ranks: Vec<RunSummary>,
    selected: &[RunId],
    (stopping, said): JobStop,
    cells: &Cells<'_>,
) -> impl IntoView {
    let lang = ctx.lang;
    let ids: Vec<RunId> = ranks.iter().map(|r| r.run_id.clone()).collect();
    let on = ids.iter().all(|id| selected.contains(id));
    let open = ctx.expanded.with_untracked(|e| e.contains(&job));
    let first = ranks[0].clone();
    let worst = ranks.iter().map(|r| r.status).max_by_key(|s| match s {
        RunStatus::Failed | RunStatus::Killed => 3,
        RunStatus::Stale => 2,
        RunStatus::Running => 1,
        RunStatus::Finished | RunStatus::Stopped => 0,
    });
    let status = worst.unwrap_or(first.status);
    let last = ranks.iter().filter_map(|r| r.last_step).max();
    // A live rank to send the job's stop through, and how many are live.
    let live_n = ranks.iter().filter(|r| !r.status.is_terminal()).count();
    let live = ranks
        .iter()
        .find(|r| !r.status.is_terminal())
        .map(|r| r.run_id.clone());
    let n = ranks.len();
    let j = job.clone();
    let toggle_open = move |ev: leptos::ev::MouseEvent| {
        ev.stop_propagation();
        let j = j.clone();
        ctx.expanded.update(|e| {
            if e.contains(&j) {
                e.retain(|x| x != &j);
            } else {
                e.push(j);
            }
        });
    };
    view! {
        <tr class="job" class:selected=on data-job=job.clone() data-ranks=n.to_string()
            data-status=status.as_str() on:click=move |_| ctx.toggle_job(ids.clone())>
            <td><button class="expand" on:click=toggle_open>{if open { "▾" } else { "▸" }}</button>
                <input type="checkbox" prop:checked=on/></td>
            <td>{first.project.clone()}</td>
            <td title=job.clone()>{first.name.clone()}" · "{n}" "{move || t(lang.get(), Text::Ranks)}</td>
            <td class=format!("status {}", status.as_str())>{i18n::status(lang.get_untracked(), status)}</td>
            <td class="num">{last.map(|s| s.to_string()).unwrap_or_default()}</td>
            <td class="num">{loss(&first).map(value).unwrap_or_default()}</td>
            <td class="job-stop">{live.map(|rank| {
                let (j1, j2, j3) = (job.clone(), job.clone(), job.clone());
                let project = first.project.clone();
                view! {
                    <Show when=move || stopping.get().as_deref() != Some(j1.as_str())
                        fallback=move || {
                            let (job, project, rank) = (j2.clone(), project.clone(), rank.clone());
                            view! { <span class="confirm">{format!("stop {live_n} ranks? ")}
                                <button class="confirm-job-stop" on:click=move |ev| {
                                    ev.stop_propagation();
                                    stopping.set(None);
                                    stop_job(job.clone(), project.clone(), rank.clone(), said);
                                }>"yes"</button>" "
                                <button on:click=move |ev| { ev.stop_propagation(); stopping.set(None); }>"no"</button></span> }
                        }>
                        <button class="job-stop" title="stop every rank (a checkpoint first)" on:click={
                            let j = j3.clone();
                            move |ev: leptos::ev::MouseEvent| { ev.stop_propagation(); stopping.set(Some(j.clone())); }
                        }>"stop…"</button>
                    </Show>
                }
            })}<span class="job-stop-said">{
                let j = job.clone();
                move || said.with(|(which, text)| if *which == j { text.clone() } else { String::new() })
            }</span></td>
            {cells.of(&first)}
        </tr>
    }
}
