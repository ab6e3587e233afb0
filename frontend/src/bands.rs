//! Runs drawn as groups: the selected runs grouped by a config key (`seed`, `optim.lr`), by
//! job, or by what is left of their names once a pattern is taken out (`-seed\d+`); each
//! group drawn as its members' mean (or median) with a band (min to max, or +/- one standard
//! deviation), the members themselves faintly on demand, in shades of the group's colour.
//!
//! The aggregate is taken over x bins (about one per pixel column) of the lines as they are
//! drawn, zoom windows' raw points included: each member's points in a bin are averaged
//! first (a member counts once per bin however many points it has there), the group's line
//! is the mean or median of those, the min-max band spans every member point in the bin (so
//! it contains each member at every step). Where the bins are narrower than a step (a
//! window of fewer steps than pixel columns) a bin is one step: the mean is exactly the
//! members' mean at that step. Recomputed each frame its lines change, so bands move live.

use crate::lines::{self, LineData, Scene};
use crate::view::{Center, GroupBy, Grouping, Spread};
use plotters::style::RGBColor;
use std::borrow::Cow;
use stepstream_chart::data::smooth;
use stepstream_chart::theme::color_of;
use stepstream_protocol::RunId;

/// Bins over the x window: about one per pixel column of a wide chart.
pub const BINS: usize = 1200;

/// The lines of `spec` as the chart draws them: grouped, with bands, when the page groups
/// runs.
pub fn drawn<'a>(
    scene: &Scene,
    store: &'a stepstream_chart::client::Client,
    spec: &crate::groups::ChartSpec,
) -> Vec<LineData<'a>> {
    let lines = lines::gather(scene, store, spec);
    if !scene.grouping.is_on() {
        return lines;
    }
    group(
        lines,
        &scene.group_keys,
        &scene.grouping,
        scene.smoothing,
        scene.window,
    )
}

/// A run's group under `by` (`None`: it stands alone): from its job, its config, its name.
pub fn key_of(
    by: &GroupBy,
    job: &str,
    config: Option<&[(String, String)]>,
    name: &str,
) -> Option<String> {
    match by {
        GroupBy::None => None,
        GroupBy::Job => (!job.is_empty()).then(|| format!("job {job}")),
        GroupBy::Config(k) => config?
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| format!("{k}={v}")),
        GroupBy::Name(pattern) => {
            // Compiled once per pattern, not per run and frame (the scene asks every frame).
            thread_local! {
                static COMPILED: std::cell::RefCell<Option<(String, Option<regex_lite::Regex>)>> =
                    const { std::cell::RefCell::new(None) };
            }
            COMPILED.with(|c| {
                let mut c = c.borrow_mut();
                if c.as_ref().is_none_or(|(p, _)| p != pattern) {
                    *c = Some((pattern.clone(), regex_lite::Regex::new(pattern).ok()));
                }
                let re = c.as_ref()?.1.as_ref()?;
                re.is_match(name)
                    .then(|| re.replace_all(name, "").into_owned())
            })
        }
    }
}

/// One group's aggregate over the bins that hold any member point.
#[derive(Debug, Default, PartialEq)]
pub struct Aggregate {
    pub xs: Vec<f64>,
    pub steps: Vec<i64>,
    pub times: Vec<f64>,
    pub center: Vec<f64>,
    pub lo: Vec<f64>,
    pub hi: Vec<f64>,
    /// Members with a point in each bin.
    pub counted: Vec<u32>,
}

/// A member's points in one bin.
#[derive(Clone, Copy)]
struct Cell {
    n: u32,
    sum: f64,
    min: f64,
    max: f64,
    sum_x: f64,
    step: i64,
    time: f64,
}

/// A member's line: `(xs, steps, times, values)`, parallel, in any x order.
pub type Member<'a> = (&'a [f64], &'a [i64], &'a [f64], &'a [f64]);

/// Aggregates members' lines over `bins` bins of `[x0, x1]`. Non-finite values are left out.
pub fn aggregate(
    members: &[Member<'_>],
    (x0, x1): (f64, f64),
    bins: usize,
    center: Center,
    spread: Spread,
) -> Aggregate {
    let bins = bins.max(1);
    let width = (x1 - x0).max(f64::MIN_POSITIVE);
    // Per bin: each member's mean there, the bin's extremes, its x sum and first step.
    let mut means: Vec<Vec<f64>> = vec![Vec::new(); bins];
    let mut whole: Vec<Option<Cell>> = vec![None; bins];
    let mut cells: Vec<Option<Cell>> = vec![None; bins];
    for (xs, steps, times, values) in members {
        cells.iter_mut().for_each(|c| *c = None);
        for i in 0..xs.len().min(values.len()) {
            let (x, v) = (xs[i], values[i]);
            if !(x0..=x1).contains(&x) || !v.is_finite() {
                continue;
            }
            let b = (((x - x0) / width * bins as f64) as usize).min(bins - 1);
            let c = cells[b].get_or_insert(Cell {
                n: 0,
                sum: 0.0,
                min: v,
                max: v,
                sum_x: 0.0,
                step: steps[i],
                time: times[i],
            });
            c.n += 1;
            c.sum += v;
            c.sum_x += x;
            c.min = c.min.min(v);
            c.max = c.max.max(v);
        }
        for (b, c) in cells.iter().enumerate() {
            let Some(c) = c else {
                continue;
            };
            means[b].push(c.sum / c.n as f64);
            match &mut whole[b] {
                None => whole[b] = Some(*c),
                Some(w) => {
                    w.n += c.n;
                    w.sum_x += c.sum_x;
                    w.min = w.min.min(c.min);
                    w.max = w.max.max(c.max);
                    w.step = w.step.min(c.step);
                    w.time = w.time.min(c.time);
                }
            }
        }
    }
    let mut out = Aggregate::default();
    for (b, m) in means.iter_mut().enumerate() {
        let Some(w) = whole[b] else {
            continue;
        };
        let n = m.len() as f64;
        let mean = m.iter().sum::<f64>() / n;
        let line = match center {
            Center::Mean => mean,
            Center::Median => {
                m.sort_unstable_by(f64::total_cmp);
                let k = m.len() / 2;
                if m.len() % 2 == 1 {
                    m[k]
                } else {
                    (m[k - 1] + m[k]) / 2.0
                }
            }
        };
        let (lo, hi) = match spread {
            Spread::MinMax => (w.min, w.max),
            Spread::Std => {
                let std = (m.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
                (line - std, line + std)
            }
        };
        out.xs.push(w.sum_x / w.n as f64);
        out.steps.push(w.step);
        out.times.push(w.time);
        out.center.push(line);
        out.lo.push(lo);
        out.hi.push(hi);
        out.counted.push(m.len() as u32);
    }
    out
}

/// A group's colour (its runs are drawn in shades of it).
pub fn group_color(name: &str) -> RGBColor {
    color_of(&format!("group {name}"))
}

/// Shade `k` of `n` of a group's colour for its members: lighter towards the last.
fn shade(c: RGBColor, k: usize, n: usize) -> RGBColor {
    let t = 0.15 + 0.45 * k as f64 / n.max(1) as f64;
    let mix = |a: u8| (a as f64 + (255.0 - a as f64) * t).round() as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

/// The lines as a chart draws them grouped: one line with its band per group of two or more
/// runs (its members too, faintly, when asked), the runs that stand alone as they are.
/// `keys` gives each selected run's group.
pub fn group<'a>(
    lines: Vec<LineData<'a>>,
    keys: &[(RunId, Option<String>)],
    g: &Grouping,
    smoothing: f64,
    window: Option<(f64, f64)>,
) -> Vec<LineData<'a>> {
    let key = |l: &LineData<'_>| {
        keys.iter()
            .find(|(run, _)| *run == l.run)
            .and_then(|(_, k)| k.clone())
    };
    // Groups in the order of their first member; a key held by one run is no group.
    let mut order: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(k) = key(l).map(|k| format!("{k}\u{1}{}", l.metric)) else {
            continue;
        };
        match order.iter_mut().find(|(o, _)| *o == k) {
            Some((_, m)) => m.push(i),
            None => order.push((k, vec![i])),
        }
    }
    order.retain(|(_, m)| m.len() >= 2);
    if order.is_empty() {
        return lines;
    }
    let extent = window.or_else(|| {
        let xs = lines
            .iter()
            .flat_map(|l| l.xs.iter().copied())
            .filter(|x| x.is_finite());
        let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        (lo <= hi).then_some((lo, hi))
    });
    let Some(extent) = extent else {
        return lines;
    };
    let mut grouped: Vec<bool> = vec![false; lines.len()];
    let mut out = Vec::new();
    let mut members_out = Vec::new();
    for (k, members) in &order {
        let name = k.split('\u{1}').next().unwrap_or_default();
        let parts: Vec<_> = members
            .iter()
            .map(|&i| {
                let l = &lines[i];
                (&l.xs[..], &l.steps[..], &l.times[..], &l.values[..])
            })
            .collect();
        let a = aggregate(&parts, extent, BINS, g.center, g.spread);
        let first = &lines[members[0]];
        let color = group_color(name);
        let smoothed = smooth(&a.center, smoothing, None);
        let ordered = a.xs.windows(2).all(|w| w[0] <= w[1]);
        out.push(LineData {
            run: first.run.clone(),
            metric: first.metric.clone(),
            label: format!("{name} ({} runs)", members.len()),
            color,
            steps: Cow::Owned(a.steps),
            xs: Cow::Owned(a.xs),
            ordered,
            values: Cow::Owned(a.center),
            times: Cow::Owned(a.times),
            smoothed: Cow::Owned(smoothed),
            band: Some((a.lo, a.hi)),
            counted: Some((members.len() as u32, a.counted)),
            markers: Vec::new(),
            notes: Vec::new(),
            detail_points: members.iter().map(|&i| lines[i].detail_points).sum(),
            received: members.iter().map(|&i| lines[i].received).sum(),
            out_of_order: members.iter().map(|&i| lines[i].out_of_order).sum(),
        });
        for (n, &i) in members.iter().enumerate() {
            grouped[i] = true;
            if g.members {
                members_out.push((i, shade(color, n, members.len())));
            }
        }
    }
    let mut lines: Vec<Option<LineData<'a>>> = lines.into_iter().map(Some).collect();
    // Members under their groups' lines; runs alone as they were.
    let mut result = Vec::new();
    for (i, color) in members_out {
        if let Some(mut l) = lines[i].take() {
            l.color = color;
            result.push(l);
        }
    }
    result.extend(out);
    for (i, l) in lines.into_iter().enumerate() {
        if let Some(l) = l.filter(|_| !grouped[i]) {
            result.push(l);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bin_per_step_gives_the_members_mean_and_extremes_at_each_step() {
        let xs: Vec<f64> = (0..10).map(f64::from).collect();
        let steps: Vec<i64> = (0..10).collect();
        let t = [0.0; 10];
        let a: Vec<f64> = xs.iter().map(|x| x * 2.0).collect();
        let b: Vec<f64> = xs.iter().map(|x| x * 3.0).collect();
        let mut c: Vec<f64> = xs.iter().map(|x| x * 4.0).collect();
        c[5] = f64::NAN; // left out: two members at step 5
        let members = [
            (&xs[..], &steps[..], &t[..], &a[..]),
            (&xs[..], &steps[..], &t[..], &b[..]),
            (&xs[..], &steps[..], &t[..], &c[..]),
        ];
        let g = aggregate(&members, (0.0, 9.0), 100, Center::Mean, Spread::MinMax);
        assert_eq!(g.steps, steps);
        assert_eq!(g.center[4], 12.0);
        assert_eq!((g.lo[4], g.hi[4]), (8.0, 16.0));
        assert_eq!(g.center[5], 12.5);
        assert_eq!(g.counted[5], 2);
        let m = aggregate(&members, (0.0, 9.0), 100, Center::Median, Spread::Std);
        assert_eq!(m.center[4], 12.0);
        let std = ((16.0f64 + 0.0 + 16.0) / 3.0).sqrt();
        assert!((m.hi[4] - 12.0 - std).abs() < 1e-12);
    }

    #[test]
    fn a_bin_of_several_steps_counts_each_member_once_and_spans_all_its_points() {
        let xs = [0.0, 1.0, 2.0, 3.0];
        let steps = [0, 1, 2, 3];
        let t = [0.0; 4];
        let dense = [1.0, 9.0, 1.0, 9.0];
        let sparse_xs = [0.5];
        let sparse = [3.0];
        let members = [
            (&xs[..], &steps[..], &t[..], &dense[..]),
            (&sparse_xs[..], &[0][..], &t[..1], &sparse[..]),
        ];
        let g = aggregate(&members, (0.0, 3.0), 1, Center::Mean, Spread::MinMax);
        // The dense member's mean (5) and the sparse one's (3), each once.
        assert_eq!(g.center, vec![4.0]);
        assert_eq!((g.lo[0], g.hi[0]), (1.0, 9.0));
    }

    #[test]
    fn keys_come_from_job_config_or_what_a_pattern_leaves_of_the_name() {
        let cfg = vec![("optim.lr".to_string(), "0.1".to_string())];
        assert_eq!(
            key_of(&GroupBy::Config("optim.lr".into()), "", Some(&cfg), "a"),
            Some("optim.lr=0.1".into())
        );
        assert_eq!(
            key_of(&GroupBy::Config("seed".into()), "", Some(&cfg), "a"),
            None
        );
        assert_eq!(
            key_of(&GroupBy::Job, "j1", None, "a"),
            Some("job j1".into())
        );
        assert_eq!(key_of(&GroupBy::Job, "", None, "a"), None);
        let by = GroupBy::Name(r"-seed\d+".into());
        assert_eq!(key_of(&by, "", None, "wide-seed3"), Some("wide".into()));
        assert_eq!(key_of(&by, "", None, "narrow"), None);
        assert_eq!(key_of(&GroupBy::Name("(".into()), "", None, "x"), None);
    }
}
