//! The run list as a table: columns the user adds (a metric's last value, or a config key),
//! numeric filters in the search (`val_loss<2.1`, `optim.lr>=1e-3`: a metric's last value,
//! else the config key's value), and the list as CSV. Pure: the run list (`components::runs`)
//! draws it.

use crate::config::Config;
use std::cmp::Ordering;
use stepstream_protocol::RunSummary;

/// A comparison a search word asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    pub key: String,
    pub op: Op,
    pub value: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
}

/// The search with the spaces around `<`, `<=`, `>`, `>=` taken out, so `loss < 2` is one
/// word.
pub fn normalize(search: &str) -> String {
    let mut out = String::with_capacity(search.len());
    let mut chars = search.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '<' || c == '>' {
            while out.ends_with(' ') {
                out.pop();
            }
            out.push(c);
            if chars.peek() == Some(&'=') {
                out.push('=');
                chars.next();
            }
            while chars.peek() == Some(&' ') {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A word as a numeric filter (`key<2.1`), if it is one.
pub fn filter(word: &str) -> Option<Filter> {
    for (token, op) in [("<=", Op::Le), (">=", Op::Ge), ("<", Op::Lt), (">", Op::Gt)] {
        if let Some((key, value)) = word.split_once(token) {
            let value: f64 = value.parse().ok()?;
            return (!key.is_empty()).then(|| Filter {
                key: key.to_string(),
                op,
                value,
            });
        }
    }
    None
}

/// A run's value for a column or filter key: the last value of that metric, else the config
/// key's value.
pub fn cell(run: &RunSummary, config: Option<&Config>, key: &str) -> Option<String> {
    if let Some((_, v)) = run
        .last_values
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
    {
        return Some(stepstream_chart::scale::value(*v));
    }
    config?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.clone())
}

/// The same as a number, where it is one.
pub fn number(run: &RunSummary, config: Option<&Config>, key: &str) -> Option<f64> {
    if let Some((_, v)) = run
        .last_values
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
    {
        return Some(*v);
    }
    cell(run, config, key)?.parse().ok()
}

impl Filter {
    /// Whether the run passes; a run without the key does not.
    pub fn passes(&self, run: &RunSummary, config: Option<&Config>) -> bool {
        number(run, config, &self.key).is_some_and(|v| match self.op {
            Op::Lt => v < self.value,
            Op::Le => v <= self.value,
            Op::Gt => v > self.value,
            Op::Ge => v >= self.value,
        })
    }
}

/// Orders two runs by a column's value: numbers as numbers, then text; a run without one
/// last.
pub fn compare(
    a: &RunSummary,
    b: &RunSummary,
    ca: Option<&Config>,
    cb: Option<&Config>,
    key: &str,
) -> Ordering {
    match (number(a, ca, key), number(b, cb, key)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => cell(a, ca, key).cmp(&cell(b, cb, key)),
    }
}

/// The columns a `cols` list names (comma separated, trimmed, no repeats).
pub fn columns(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        if !out.iter().any(|x| x == c) {
            out.push(c.to_string());
        }
    }
    out
}

/// One CSV field, quoted where it must be (RFC 4180); a leading `=`, `+`, `-` or `@` is
/// prefixed with `'` so a spreadsheet does not run it as a formula.
fn field(s: &str) -> String {
    let s = match s.chars().next() {
        Some('=' | '+' | '@') => format!("'{s}"),
        Some('-') if s.parse::<f64>().is_err() => format!("'{s}"),
        _ => s.to_string(),
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// The listed runs as CSV: run id, project, name, status, last step, start (unix seconds),
/// then each extra column.
pub fn csv(runs: &[(&RunSummary, Option<&Config>)], extra: &[String]) -> String {
    let mut out = String::from("run_id,project,name,status,last_step,started_at");
    for c in extra {
        out.push(',');
        out.push_str(&field(c));
    }
    out.push('\n');
    for (r, config) in runs {
        let mut row = vec![
            field(r.run_id.as_str()),
            field(&r.project),
            field(&r.name),
            r.status.as_str().to_string(),
            r.last_step.map(|s| s.to_string()).unwrap_or_default(),
            format!("{}", r.started_at),
        ];
        for c in extra {
            row.push(field(&cell(r, *config, c).unwrap_or_default()));
        }
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepstream_protocol::{RunId, RunStatus};

    fn run(name: &str, values: &[(&str, f64)]) -> RunSummary {
        RunSummary {
            run_id: RunId::new(format!("id-{}", name.len())).unwrap(),
            project: "p".into(),
            name: name.into(),
            host: "h".into(),
            rank: 0,
            world_size: 1,
            job: String::new(),
            framework: String::new(),
            started_at: 1.5,
            status: RunStatus::Finished,
            status_message: None,
            last_step: Some(9),
            last_point_at: None,
            last_values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            records: 10,
        }
    }

    #[test]
    fn filters_compare_a_metrics_last_value_or_a_config_number() {
        assert_eq!(
            normalize("wide  val_loss < 2.1 lr>= 0.01"),
            "wide  val_loss<2.1 lr>=0.01"
        );
        let f = filter("val_loss<2.1").unwrap();
        assert_eq!((f.key.as_str(), f.op, f.value), ("val_loss", Op::Lt, 2.1));
        assert_eq!(filter("lr>=1e-3").unwrap().op, Op::Ge);
        assert_eq!(filter("name"), None);
        assert_eq!(filter("<3"), None);
        assert_eq!(filter("a<b"), None);
        let a = run("a", &[("val_loss", 2.0)]);
        let b = run("b", &[("val_loss", 2.5)]);
        assert!(f.passes(&a, None) && !f.passes(&b, None));
        let cfg: Config = vec![("optim.lr".into(), "0.001".into())];
        assert!(filter("optim.lr<0.01").unwrap().passes(&b, Some(&cfg)));
        assert!(!filter("missing>0").unwrap().passes(&a, Some(&cfg)));
        assert_eq!(compare(&a, &b, None, None, "val_loss"), Ordering::Less);
        assert_eq!(
            compare(&a, &b, Some(&cfg), None, "optim.lr"),
            Ordering::Less
        );
    }

    #[test]
    fn the_csv_quotes_what_it_must_and_defuses_formulas() {
        let a = run("x,\"y\"", &[("loss", 0.5)]);
        let cfg: Config = vec![("note".into(), "=cmd()".into())];
        let text = csv(
            &[(&a, Some(&cfg))],
            &["loss".into(), "note".into(), "gone".into()],
        );
        assert_eq!(
            text,
            "run_id,project,name,status,last_step,started_at,loss,note,gone\n\
             id-5,p,\"x,\"\"y\"\"\",finished,9,1.5,0.5000,'=cmd(),\n"
        );
        assert_eq!(columns(" lr, val_loss ,lr,"), vec!["lr", "val_loss"]);
    }
}
