//! A widget's options, from an element's `data-*` attributes or a JS object: both arrive
//! as name → text pairs and are parsed here, in one place, with a clear error for a bad
//! value rather than a silently blank chart.

use stepstream_chart::scale::Axis;
use stepstream_protocol::RunId;

/// Most runs and metrics one widget overlays: more lines than this are unreadable, and a
/// page must not be able to ask the hub for a whole project through one box.
pub const MOST_LINES: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThemeChoice {
    Light,
    Dark,
    /// The page's `prefers-color-scheme`.
    Auto,
}

/// What the widget shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    /// The curves of its metrics.
    Chart,
    /// The runs' console, live.
    Console,
    /// The newest text sample of `key`.
    Text,
    /// The newest image of `key`.
    Image,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub panel: Panel,
    /// The sample key a text or image panel shows.
    pub key: Option<String>,
    /// The hub's http(s) base URL.
    pub hub: String,
    pub runs: Vec<RunId>,
    pub metrics: Vec<String>,
    /// TensorBoard's smoothing weight, 0 (off) to 0.999.
    pub smoothing: f64,
    pub log: bool,
    pub axis: Axis,
    /// CSS pixels of the chart.
    pub height: u32,
    pub theme: ThemeChoice,
    /// Follow new points; `false` draws the history once and closes.
    pub live: bool,
    pub token: Option<String>,
    pub title: Option<String>,
}

/// The option names, as attributes (`data-` + name; the run is `data-stepstream-run`) and
/// as keys of the JS object.
pub const NAMES: [&str; 13] = [
    "panel",
    "key",
    "hub",
    "run",
    "metric",
    "smoothing",
    "log",
    "x",
    "height",
    "theme",
    "live",
    "token",
    "title",
];

fn list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn flag(name: &str, text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(format!("{name}={other:?}: use true or false")),
    }
}

fn number(name: &str, text: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{name}={text:?} is not a number"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{name}={v} is outside {lo}..={hi}"));
    }
    Ok(v)
}

impl Options {
    /// Parses `get(name)` for each of [`NAMES`]; `default_hub` is where the script came from.
    pub fn parse(
        get: impl Fn(&str) -> Option<String>,
        default_hub: &str,
    ) -> Result<Options, String> {
        let runs = list(&get("run").unwrap_or_default());
        if runs.is_empty() {
            return Err("no run: set data-stepstream-run (or `run`) to one or more run ids".into());
        }
        let runs = runs
            .iter()
            .map(|r| RunId::new(r).map_err(|e| format!("run {r:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let mut metrics = list(&get("metric").unwrap_or_default());
        if metrics.is_empty() {
            metrics.push("loss".into());
        }
        if runs.len() * metrics.len() > MOST_LINES {
            return Err(format!(
                "{} runs x {} metrics is more than {MOST_LINES} lines in one chart",
                runs.len(),
                metrics.len()
            ));
        }
        let hub = get("hub")
            .filter(|h| !h.trim().is_empty())
            .unwrap_or_else(|| default_hub.to_string());
        let hub = hub.trim().trim_end_matches('/').to_string();
        if !["http://", "https://", "ws://", "wss://"]
            .iter()
            .any(|s| hub.starts_with(s))
        {
            return Err(format!("hub={hub:?}: give the hub's http(s) address"));
        }
        let axis = match get("x") {
            // A metric as x is the web app's (it joins each line to the metric).
            Some(x) => Axis::parse(x.trim())
                .filter(|a| *a != Axis::Metric)
                .ok_or_else(|| format!("x={x:?}: use step, wall or relative"))?,
            None => Axis::Step,
        };
        let theme = match get("theme").as_deref().map(str::trim) {
            None | Some("auto") | Some("") => ThemeChoice::Auto,
            Some("light") => ThemeChoice::Light,
            Some("dark") => ThemeChoice::Dark,
            Some(t) => return Err(format!("theme={t:?}: use light, dark or auto")),
        };
        let panel = match get("panel").as_deref().map(str::trim) {
            None | Some("") | Some("chart") => Panel::Chart,
            Some("console") => Panel::Console,
            Some("text") => Panel::Text,
            Some("image") => Panel::Image,
            Some(p) => return Err(format!("panel={p:?}: use chart, console, text or image")),
        };
        let key = get("key")
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty());
        if matches!(panel, Panel::Text | Panel::Image) && key.is_none() {
            return Err("a text or image panel needs data-key: the sample's key".into());
        }
        Ok(Options {
            panel,
            key,
            hub,
            runs,
            metrics,
            smoothing: match get("smoothing") {
                Some(s) => number("smoothing", &s, 0.0, 0.999)?,
                None => 0.0,
            },
            log: get("log")
                .map(|s| flag("log", &s))
                .transpose()?
                .unwrap_or(false),
            axis,
            height: match get("height") {
                Some(h) => number("height", h.trim_end_matches("px"), 80.0, 4000.0)? as u32,
                None => 240,
            },
            theme,
            live: get("live")
                .map(|s| flag("live", &s))
                .transpose()?
                .unwrap_or(true),
            token: get("token").filter(|t| !t.trim().is_empty()),
            title: get("title").filter(|t| !t.is_empty()),
        })
    }

    /// The hub's http(s) address (a ws(s) one given is turned back).
    pub fn http_base(&self) -> String {
        match self.hub.strip_prefix("ws") {
            Some(rest) => format!("http{rest}"),
            None => self.hub.clone(),
        }
    }

    /// Widgets with the same key share one socket.
    pub fn connection_key(&self) -> String {
        format!(
            "{}|{}|{}",
            self.http_base(),
            self.token.as_deref().unwrap_or(""),
            self.live
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Options, String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Options::parse(|k| m.get(k).cloned(), "http://127.0.0.1:7070")
    }

    #[test]
    fn defaults_and_lists() {
        let o = parse(&[("run", " a , b "), ("metric", "loss,lr")]).unwrap();
        assert_eq!(o.runs.len(), 2);
        assert_eq!(o.metrics, ["loss", "lr"]);
        assert_eq!(o.hub, "http://127.0.0.1:7070");
        assert!(o.live && !o.log && o.smoothing == 0.0 && o.height == 240);
        assert_eq!(parse(&[("run", "a")]).unwrap().metrics, ["loss"]);
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        assert!(parse(&[]).unwrap_err().contains("no run"));
        assert!(parse(&[("run", "a"), ("smoothing", "2")])
            .unwrap_err()
            .contains("smoothing"));
        assert!(parse(&[("run", "a"), ("x", "epoch")])
            .unwrap_err()
            .contains("x="));
        assert!(parse(&[("run", "a"), ("log", "maybe")])
            .unwrap_err()
            .contains("log"));
        assert!(parse(&[("run", "a"), ("hub", "ftp://x")])
            .unwrap_err()
            .contains("hub"));
        let many = (0..30)
            .map(|i| format!("m{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(parse(&[("run", "a"), ("metric", &many)])
            .unwrap_err()
            .contains("lines"));
    }

    #[test]
    fn sockets_are_shared_by_hub_token_and_liveness() {
        let a = parse(&[("run", "a"), ("hub", "ws://h:1/")]).unwrap();
        let b = parse(&[("run", "b"), ("hub", "http://h:1"), ("metric", "lr")]).unwrap();
        assert_eq!(a.connection_key(), b.connection_key());
        let c = parse(&[("run", "b"), ("hub", "http://h:1"), ("token", "t")]).unwrap();
        assert_ne!(a.connection_key(), c.connection_key());
        let d = parse(&[("run", "b"), ("hub", "http://h:1"), ("live", "false")]).unwrap();
        assert_ne!(a.connection_key(), d.connection_key());
    }
}
