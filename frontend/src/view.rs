//! What the page shows, apart from the data: the selected runs, the zoom window, smoothing,
//! the x axis, the theme and the language. It lives in the URL, so a copied link opens the
//! same view and the back button steps through views.
//!
//! `?runs=A,B&x0=..&x1=..&smooth=0.6&axis=wall&theme=dark&lang=zh`; other parameters
//! (`hub`, `stale`, `run`) are kept as they are. `token` never: the page takes it out of the
//! address bar as it opens (`page_token`), so no link it writes carries it.

use crate::i18n::Lang;
use stepstream_chart::scale::Axis;
use stepstream_protocol::RunId;
use wasm_bindgen::JsValue;

/// The page's theme choice: follow the system, or fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ThemePref {
    #[default]
    Auto,
    Light,
    Dark,
}

impl ThemePref {
    pub fn code(self) -> &'static str {
        match self {
            ThemePref::Auto => "auto",
            ThemePref::Light => "light",
            ThemePref::Dark => "dark",
        }
    }

    pub fn parse(s: &str) -> Option<ThemePref> {
        Some(match s {
            "auto" => ThemePref::Auto,
            "light" => ThemePref::Light,
            "dark" => ThemePref::Dark,
            _ => return None,
        })
    }

    pub fn next(self) -> ThemePref {
        match self {
            ThemePref::Auto => ThemePref::Light,
            ThemePref::Light => ThemePref::Dark,
            ThemePref::Dark => ThemePref::Auto,
        }
    }

    /// Whether the page is dark now (the system's preference when `Auto`).
    pub fn is_dark(self) -> bool {
        match self {
            ThemePref::Dark => true,
            ThemePref::Light => false,
            ThemePref::Auto => web_sys::window()
                .and_then(|w| w.match_media("(prefers-color-scheme: dark)").ok().flatten())
                .is_some_and(|m| m.matches()),
        }
    }
}

/// The part of the view a link carries.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct View {
    pub runs: Vec<RunId>,
    /// The x window while zoomed; `None` follows the live edge over the whole run.
    pub window: Option<(f64, f64)>,
    /// Smoothing weight, 0 (none) to 0.99.
    pub smoothing: f64,
    pub axis: Axis,
    /// The metric on the x axis when `axis` is [`Axis::Metric`] (`axis=metric:tokens_seen`).
    pub x_metric: String,
    pub grouping: Grouping,
    /// `segments=all`: each segment of a resumed run drawn as its own line.
    pub all_segments: bool,
    /// The run list's added columns (`cols=val_loss,optim.lr`).
    pub columns: String,
    pub theme: ThemePref,
    pub lang: Option<Lang>,
}

const THEME_KEY: &str = "stepstream.theme";

fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok().flatten()
}

/// The theme remembered from an earlier visit.
pub fn remembered_theme() -> Option<ThemePref> {
    ThemePref::parse(&storage()?.get_item(THEME_KEY).ok().flatten()?)
}

pub fn remember_theme(t: ThemePref) {
    if let Some(s) = storage() {
        let _ = s.set_item(THEME_KEY, t.code());
    }
}

impl View {
    /// The view a query string describes (`?run=` from alert links counts as `runs`).
    pub fn from_query(search: &str) -> View {
        let q = web_sys::UrlSearchParams::new_with_str(search).ok();
        let get = |k: &str| q.as_ref().and_then(|q| q.get(k)).filter(|v| !v.is_empty());
        let runs = get("runs")
            .or_else(|| get("run"))
            .map(|s| s.split(',').filter_map(|id| RunId::new(id).ok()).collect())
            .unwrap_or_default();
        let num = |k: &str| {
            get(k)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite())
        };
        let window = match (num("x0"), num("x1")) {
            (Some(a), Some(b)) if b > a => Some((a, b)),
            _ => None,
        };
        let (axis, x_metric) = match get("axis") {
            Some(a) => match a.strip_prefix("metric:").filter(|m| !m.is_empty()) {
                Some(metric) => (Axis::Metric, metric.to_string()),
                None => (
                    Axis::parse(&a)
                        .filter(|a| *a != Axis::Metric)
                        .unwrap_or_default(),
                    String::new(),
                ),
            },
            None => (Axis::Step, String::new()),
        };
        View {
            runs,
            window,
            smoothing: num("smooth").unwrap_or(0.0).clamp(0.0, 0.99),
            axis,
            x_metric,
            grouping: Grouping::from_query(|k| get(k)),
            all_segments: get("segments").as_deref() == Some("all"),
            columns: get("cols").unwrap_or_default(),
            theme: get("theme")
                .and_then(|t| ThemePref::parse(&t))
                .or_else(remembered_theme)
                .unwrap_or_default(),
            lang: get("lang").map(|l| {
                if l.starts_with("zh") {
                    Lang::Zh
                } else {
                    Lang::En
                }
            }),
        }
    }

    /// `search` with this view's parameters set and the others kept.
    pub fn to_query(&self, search: &str) -> String {
        let Ok(q) = web_sys::UrlSearchParams::new_with_str(search) else {
            return String::new();
        };
        for k in [
            "runs", "run", "x0", "x1", "smooth", "axis", "theme", "lang", "token", "group",
            "center", "band", "members", "segments", "cols",
        ] {
            q.delete(k);
        }
        if !self.runs.is_empty() {
            let ids: Vec<&str> = self.runs.iter().map(RunId::as_str).collect();
            q.set("runs", &ids.join(","));
        }
        if let Some((a, b)) = self.window {
            q.set("x0", &short(a));
            q.set("x1", &short(b));
        }
        if self.smoothing > 0.0 {
            q.set(
                "smooth",
                &format!("{}", (self.smoothing * 100.0).round() / 100.0),
            );
        }
        for (k, v) in self.grouping.to_query() {
            q.set(k, &v);
        }
        if self.all_segments {
            q.set("segments", "all");
        }
        let cols = crate::table::columns(&self.columns);
        if !cols.is_empty() {
            q.set("cols", &cols.join(","));
        }
        match self.axis {
            Axis::Step => {}
            Axis::Metric => q.set("axis", &format!("metric:{}", self.x_metric)),
            a => q.set("axis", a.code()),
        }
        if self.theme != ThemePref::Auto {
            q.set("theme", self.theme.code());
        }
        if let Some(l) = self.lang {
            q.set("lang", l.code());
        }
        let s: String = q.to_string().into();
        if s.is_empty() {
            String::new()
        } else {
            format!("?{s}")
        }
    }

    /// Puts the view in the address bar: a new history entry, or (`replace`) the same one,
    /// for a stream of small changes such as wheel zooming.
    pub fn publish(&self, replace: bool) {
        let Some(w) = web_sys::window() else {
            return;
        };
        let loc = w.location();
        let search = loc.search().unwrap_or_default();
        let next = self.to_query(&search);
        if next == search {
            return;
        }
        let url = format!("{}{next}", loc.pathname().unwrap_or_default());
        if let Ok(h) = w.history() {
            let _ = if replace {
                h.replace_state_with_url(&JsValue::NULL, "", Some(&url))
            } else {
                h.push_state_with_url(&JsValue::NULL, "", Some(&url))
            };
        }
    }
}

/// A number without needless digits (window edges are steps or unix seconds).
fn short(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{:.3}", v)
    }
}

/// What the runs are grouped by.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum GroupBy {
    #[default]
    None,
    Job,
    /// A flattened config key (`optim.lr`).
    Config(String),
    /// A regular expression taken out of the run names: what is left names the group.
    Name(String),
}

/// The group's line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Center {
    #[default]
    Mean,
    Median,
}

/// The group's band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Spread {
    #[default]
    MinMax,
    Std,
}

/// How the page groups runs; it lives in the URL (`group=cfg:seed&center=median&band=std&members=1`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Grouping {
    pub by: GroupBy,
    pub center: Center,
    pub spread: Spread,
    /// Draw the members too, faintly.
    pub members: bool,
}

impl Grouping {
    pub fn from_query(get: impl Fn(&str) -> Option<String>) -> Grouping {
        let by = match get("group") {
            Some(g) if g == "job" => GroupBy::Job,
            Some(g) => match (g.strip_prefix("cfg:"), g.strip_prefix("name:")) {
                (Some(k), _) if !k.is_empty() => GroupBy::Config(k.to_string()),
                (_, Some(p)) if !p.is_empty() => GroupBy::Name(p.to_string()),
                _ => GroupBy::None,
            },
            None => GroupBy::None,
        };
        Grouping {
            by,
            center: match get("center").as_deref() {
                Some("median") => Center::Median,
                _ => Center::Mean,
            },
            spread: match get("band").as_deref() {
                Some("std") => Spread::Std,
                _ => Spread::MinMax,
            },
            members: get("members").as_deref() == Some("1"),
        }
    }

    /// The query parameters of this grouping (none when the runs are not grouped).
    pub fn to_query(&self) -> Vec<(&'static str, String)> {
        let by = match &self.by {
            GroupBy::None => return Vec::new(),
            GroupBy::Job => "job".to_string(),
            GroupBy::Config(k) => format!("cfg:{k}"),
            GroupBy::Name(p) => format!("name:{p}"),
        };
        let mut q = vec![("group", by)];
        if self.center == Center::Median {
            q.push(("center", "median".into()));
        }
        if self.spread == Spread::Std {
            q.push(("band", "std".into()));
        }
        if self.members {
            q.push(("members", "1".into()));
        }
        q
    }

    pub fn is_on(&self) -> bool {
        self.by != GroupBy::None
    }
}
