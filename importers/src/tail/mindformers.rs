//! MindFormers' training log, as its loss monitor prints it, for `stepstream tail --format
//! mindformers`: the job streams without a line of its script changed.
//!
//! Two shapes are read. The older one:
//!
//! ```text
//! ... - INFO - { Epoch:[  1/  2], step:[    3/  100], loss: 10.503, per_step_time: 1234ms,
//!     lr: 1e-05, overflow cond: False, loss_scale: 1.0, global_norm: [1.234],
//!     train_throughput_per_npu: 12.345T
//! ... - INFO -   3.0% |█         | 2.59 samples/s/p  0:02:07 }
//! ```
//!
//! (`loss:[10.503/10.611]`, the step's and the epoch's mean, when not sinking), and the newer
//! `{ key: value, ... }` one, where `step` may be the global step and any other numeric value
//! (`5ms`, `[1.2]`, `True`, `12.3T`) becomes a metric. The step is the global one: the
//! epoch's step plus the steps of the epochs before. Lines that are not the loss monitor's
//! are not rows (a log has many); a monitor line that does not parse is a bad row.

/// One monitor line: its global step and its values, by name.
#[derive(Debug, PartialEq)]
pub struct Line {
    pub step: i64,
    pub values: Vec<(String, f64)>,
}

/// `[a/b]` as `(a, b)`.
fn pair(v: &str) -> Option<(f64, f64)> {
    let inner = v.trim().strip_prefix('[')?.strip_suffix(']')?;
    let (a, b) = inner.split_once('/')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// A number as MindFormers prints one: `1.5`, `nan`, `[1.5]`, `1234ms`, `12.3T`, `True`.
fn number(v: &str) -> Option<f64> {
    let v = v.trim().trim_matches(|c| c == '[' || c == ']').trim();
    match v {
        "True" | "true" => return Some(1.0),
        "False" | "false" => return Some(0.0),
        _ => {}
    }
    let v = v
        .strip_suffix("ms")
        .or_else(|| v.strip_suffix('T'))
        .or_else(|| v.strip_suffix('s'))
        .unwrap_or(v);
    match v.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        n => n.parse().ok(),
    }
}

/// Splits `a: 1, b:[2/3], c: [4, 5]` at the commas outside brackets.
fn fields(body: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in body.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&body[start..]);
    out
}

/// A metric name from a printed key: `overflow cond` -> `overflow`, `per_step_time` ->
/// `step_time` (seconds), spaces to underscores.
fn metric(key: &str) -> String {
    match key {
        "overflow cond" => "overflow".into(),
        "per_step_time" => "step_time".into(),
        "learning_rate" => "lr".into(),
        k => k.replace(' ', "_"),
    }
}

/// The loss monitor's progress line (`  3.0% |██  | 2.59 samples/s/p  0:02:07 }`): its
/// throughput per device, for the step the line before it printed.
pub fn progress(line: &str) -> Option<f64> {
    let at = line.find(" samples/s/p")?;
    let before = line[..at].trim_end();
    let start = before.rfind(' ').map_or(0, |i| i + 1);
    before[start..].parse().ok()
}

/// Parses a monitor line; `None` for a line that is not one.
pub fn parse(line: &str) -> Option<Result<Line, String>> {
    let open = line.find("{ ")?;
    let body = &line[open + 2..];
    let body = body.rsplit_once('}').map_or(body, |(b, _)| b);
    let body = body.trim();
    // A monitor line has a `step` field; any other `{ ... }` in a log is not one.
    let has_step = fields(body).iter().any(|f| {
        f.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("step"))
    });
    if !has_step {
        return None;
    }
    let mut epoch: Option<(f64, f64)> = None;
    let mut step: Option<(f64, Option<f64>)> = None;
    let mut values = Vec::new();
    for field in fields(body) {
        let Some((key, value)) = field.split_once(':') else {
            continue;
        };
        let key = key.trim();
        match key.to_ascii_lowercase().as_str() {
            "epoch" => match pair(value) {
                Some(p) => epoch = Some(p),
                None => {
                    if let Some(e) = number(value) {
                        values.push(("epoch".to_string(), e));
                    }
                }
            },
            "step" => {
                step = match pair(value) {
                    Some((a, b)) => Some((a, Some(b))),
                    None => number(value).map(|a| (a, None)),
                };
            }
            "loss" => match pair(value) {
                Some((now, mean)) => {
                    values.push(("loss".into(), now));
                    values.push(("loss_epoch_mean".into(), mean));
                }
                None => match number(value) {
                    Some(v) => values.push(("loss".into(), v)),
                    None => return Some(Err(format!("loss {value:?} is not a number"))),
                },
            },
            _ => {
                if let Some(mut v) = number(value) {
                    if key == "per_step_time" && value.trim().ends_with("ms") {
                        v /= 1000.0;
                    }
                    values.push((metric(key), v));
                }
            }
        }
    }
    let Some((step_in, per_epoch)) = step else {
        return Some(Err("a monitor line without a step".into()));
    };
    let global = match (epoch, per_epoch) {
        // The epoch's step plus the epochs before.
        (Some((e, _)), Some(n)) => step_in + (e - 1.0).max(0.0) * n,
        _ => step_in,
    };
    if let Some((e, _)) = epoch {
        values.push(("epoch".into(), e));
    }
    if !(global.is_finite() && global.fract() == 0.0 && global.abs() < 9e15) {
        return Some(Err(format!("step {global} is not an integer")));
    }
    Some(Ok(Line {
        step: global as i64,
        values,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(l: &Line, name: &str) -> f64 {
        l.values.iter().find(|(n, _)| n == name).unwrap().1
    }

    // Lines as MindFormers' loss monitor prints them (its format strings, filled as a run
    // on Ascend prints them), in both shapes.
    const OLD_SINK: &str = "2025-03-02 10:23:45,123 - mindformers[mindformers/core/callback/callback.py:360] - INFO - { Epoch:[  2/  3], step:[    5/  100], loss: 10.503, per_step_time: 1234ms, lr: 1e-05, overflow cond: False, loss_scale: 65536.0, global_norm: [1.2345678], train_throughput_per_npu: 12.345T";
    const OLD: &str = "2025-03-02 10:23:46,123 - mindformers[mindformers/core/callback/callback.py:366] - INFO - { Epoch:[  1/  3], step:[   12/  100], loss:[7.250/7.901], per_step_time: 880ms, lr: 0.0001, overflow cond: True, loss_scale: 32768.0, global_norm: [nan]";
    const PROGRESS: &str = "2025-03-02 10:23:46,124 - mindformers[mindformers/core/callback/callback.py:371] - INFO -   12.0% |██████    | 2.59134 samples/s/p  0:02:07 }";
    const NEW: &str = "2026-06-01 08:00:00,001 - mindformers[mindformers/core/callback/callback.py:512] - INFO - { epoch: 1, step: 250, loss: 3.125, per_step_time: 512ms, lr: 2.5e-05, overflow cond: False, loss_scale: 1.0, global_norm: 0.875, throughput: 1024.5 }";

    #[test]
    fn the_older_shape_sinking_and_not() {
        let l = parse(OLD_SINK).unwrap().unwrap();
        assert_eq!(l.step, 105, "epoch 2's step 5 of 100");
        assert_eq!(get(&l, "loss"), 10.503);
        assert_eq!(get(&l, "step_time"), 1.234);
        assert_eq!(get(&l, "lr"), 1e-5);
        assert_eq!(get(&l, "overflow"), 0.0);
        assert_eq!(get(&l, "loss_scale"), 65536.0);
        assert_eq!(get(&l, "global_norm"), 1.2345678);
        assert_eq!(get(&l, "train_throughput_per_npu"), 12.345);
        assert_eq!(get(&l, "epoch"), 2.0);
        let l = parse(OLD).unwrap().unwrap();
        assert_eq!(l.step, 12);
        assert_eq!((get(&l, "loss"), get(&l, "loss_epoch_mean")), (7.25, 7.901));
        assert_eq!(get(&l, "overflow"), 1.0);
        assert!(get(&l, "global_norm").is_nan());
        assert_eq!(progress(PROGRESS), Some(2.59134));
    }

    #[test]
    fn the_newer_shape() {
        let l = parse(NEW).unwrap().unwrap();
        assert_eq!(l.step, 250, "a global step as printed");
        assert_eq!(get(&l, "loss"), 3.125);
        assert_eq!(get(&l, "step_time"), 0.512);
        assert_eq!(get(&l, "lr"), 2.5e-5);
        assert_eq!(get(&l, "global_norm"), 0.875);
        assert_eq!(get(&l, "throughput"), 1024.5);
        assert_eq!(get(&l, "epoch"), 1.0);
    }

    #[test]
    fn other_lines_are_not_rows_and_broken_monitor_lines_are_bad_rows() {
        for other in [
            "2025-03-02 10:23:40,000 - mindformers - INFO - .........Build context.........",
            "",
            "{ \"json\": \"without a step\" }",
        ] {
            assert!(parse(other).is_none(), "{other}");
        }
        assert!(parse("INFO - { Epoch:[1/2], step:[x/3], loss: 1.0 }")
            .unwrap()
            .is_err());
        assert!(parse("INFO - { Epoch:[1/2], step:[1/3], loss: abc }")
            .unwrap()
            .is_err());
    }
}
