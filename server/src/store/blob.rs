//! The blob format of a batch's records, independent of the wire format.

use std::collections::BTreeMap;
use stepstream_protocol::{MetricId, StepRecord};

const BLOB_VERSION: u8 = 1;

/// A record with more values than the blob's 16-bit count can say: never stored, so that
/// nothing acknowledged is unreadable (the hub's `record_values` limit refuses it first).
#[derive(Debug, thiserror::Error)]
#[error("a record of step {step} holds {values} values; a stored record holds at most 65535")]
pub struct TooWide {
    pub step: i64,
    pub values: usize,
}

/// Blob layout: `version u8`, then per record `step i64 | wall_time f64 | n u16` and `n`
/// times `metric u32 | value f64`, all little endian.
pub fn encode_records(records: &[StepRecord]) -> Result<Vec<u8>, TooWide> {
    let values: usize = records.iter().map(|r| r.values.len()).sum();
    let mut out = Vec::with_capacity(1 + records.len() * 18 + values * 12);
    out.push(BLOB_VERSION);
    for r in records {
        out.extend_from_slice(&r.step.to_le_bytes());
        out.extend_from_slice(&r.wall_time.to_le_bytes());
        let n = u16::try_from(r.values.len()).map_err(|_| TooWide {
            step: r.step,
            values: r.values.len(),
        })?;
        out.extend_from_slice(&n.to_le_bytes());
        for &(id, v) in &r.values {
            out.extend_from_slice(&id.0.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(out)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
}

/// Walks a blob: `record(step, wall_time, n)` before each record's `n` values, then
/// `value(metric, value)` for each; `None` if the blob is damaged.
fn walk(
    blob: &[u8],
    mut record: impl FnMut(i64, f64, usize),
    mut value: impl FnMut(MetricId, f64),
) -> Option<()> {
    let mut r = Reader(blob);
    if r.take::<1>()? != [BLOB_VERSION] {
        return None;
    }
    while !r.0.is_empty() {
        let step = i64::from_le_bytes(r.take()?);
        let wall_time = f64::from_le_bytes(r.take()?);
        let n = u16::from_le_bytes(r.take()?) as usize;
        record(step, wall_time, n.min(r.0.len() / 12));
        for _ in 0..n {
            let id = MetricId(u32::from_le_bytes(r.take()?));
            value(id, f64::from_le_bytes(r.take()?));
        }
    }
    Some(())
}

/// Appends the records of a blob to `out`; `None` if the blob is damaged.
pub fn decode_records(blob: &[u8], out: &mut Vec<StepRecord>) -> Option<()> {
    let out = std::cell::RefCell::new(out);
    walk(
        blob,
        |step, wall_time, n| {
            out.borrow_mut().push(StepRecord {
                step,
                wall_time,
                values: Vec::with_capacity(n),
            })
        },
        |id, v| {
            if let Some(r) = out.borrow_mut().last_mut() {
                r.values.push((id, v));
            }
        },
    )
}

/// Calls `f(step, wall_time, metric, value)` for every value of a blob, in order, without
/// building records (the history of a long run is millions of them); `None` if the blob is
/// damaged (values before the damage were visited).
pub fn visit_values(blob: &[u8], mut f: impl FnMut(i64, f64, MetricId, f64)) -> Option<()> {
    let at = std::cell::Cell::new((0i64, 0f64));
    walk(
        blob,
        |step, wall_time, _| at.set((step, wall_time)),
        |id, v| {
            let (step, wall_time) = at.get();
            f(step, wall_time, id, v)
        },
    )
}

/// The lowest and highest step of some records.
pub(super) fn step_range(records: &[StepRecord]) -> Option<(i64, i64)> {
    let lo = records.iter().map(|r| r.step).min()?;
    let hi = records.iter().map(|r| r.step).max()?;
    Some((lo, hi))
}

/// A batch's span class: the smallest `c` with `hi - lo <= reach(c)`. Range reads look for
/// the batches of each class starting at most that class's reach before the range, so one
/// wide batch (a resume that rewinds far, an evaluation logged late at step 0) costs only
/// itself, not every later read of the run (one widest span per run once did).
pub(super) fn span_class(range: Option<(i64, i64)>) -> i64 {
    let span = range.map_or(0, |(lo, hi)| hi.saturating_sub(lo).max(0) as u64);
    i64::from(64 - span.leading_zeros())
}

/// Span classes there are: spans up to `i64::MAX` fall in `0..SPAN_CLASSES`.
pub(super) const SPAN_CLASSES: i64 = 64;

/// The widest span of a class: `2^c - 1`.
pub(super) fn class_reach(class: i64) -> i64 {
    if class >= 63 {
        i64::MAX
    } else {
        (1i64 << class) - 1
    }
}

/// For each span class, the lowest `lo_step` a batch of that class overlapping a range
/// starting at `lo` can have. The last class also holds spans past `i64::MAX` (from near
/// `i64::MIN` to near `i64::MAX`): it has no floor.
pub(super) fn class_floors(lo: i64) -> impl Iterator<Item = (i64, i64)> {
    (0..SPAN_CLASSES).map(move |c| {
        let floor = if c == SPAN_CLASSES - 1 {
            i64::MIN
        } else {
            lo.saturating_sub(class_reach(c))
        };
        (c, floor)
    })
}

#[cfg(test)]
pub(super) fn test_record(step: i64, v: f64) -> StepRecord {
    StepRecord {
        step,
        wall_time: step as f64,
        values: vec![(MetricId(0), v), (MetricId(1), f64::NAN)],
    }
}

pub(super) fn encode_values(values: &BTreeMap<MetricId, f64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 12);
    for (id, v) in values {
        out.extend_from_slice(&id.0.to_le_bytes());
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

pub(super) fn decode_values(blob: &[u8]) -> Option<BTreeMap<MetricId, f64>> {
    let mut r = Reader(blob);
    let mut out = BTreeMap::new();
    while !r.0.is_empty() {
        let id = MetricId(u32::from_le_bytes(r.take()?));
        out.insert(id, f64::from_le_bytes(r.take()?));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use test_record as rec;

    #[test]
    fn a_record_too_wide_for_the_blob_is_refused_not_wrapped() {
        let wide = StepRecord {
            step: 3,
            wall_time: 0.0,
            values: (0..70_000).map(|i| (MetricId(i), 1.0)).collect(),
        };
        let err = encode_records(&[wide]).unwrap_err();
        assert_eq!(err.values, 70_000);
    }

    #[test]
    fn blob_round_trip_and_damage() {
        let records = vec![rec(1, 0.5), rec(2, f64::INFINITY)];
        let blob = encode_records(&records).unwrap();
        let mut back = Vec::new();
        decode_records(&blob, &mut back).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].values[0].1, f64::INFINITY);
        assert!(back[0].values[1].1.is_nan());
        let mut seen = Vec::new();
        visit_values(&blob, |s, t, id, v| seen.push((s, t, id, v))).unwrap();
        assert_eq!(seen.len(), 4);
        assert_eq!(
            (seen[2].0, seen[2].2, seen[2].3),
            (2, MetricId(0), f64::INFINITY)
        );
        for cut in 1..blob.len() {
            let mut out = Vec::new();
            // A cut inside a record is an error; a cut between records is not detectable
            // from the blob alone, which is why the row also stores `n`.
            if decode_records(&blob[..cut], &mut out).is_some() {
                assert!(out.len() < 2);
            }
        }
    }
}

#[cfg(test)]
mod span_tests {
    use super::*;

    #[test]
    fn every_span_fits_its_class_and_not_the_one_below() {
        for span in [0i64, 1, 2, 3, 4, 7, 8, 1000, 4096, i64::MAX / 2, i64::MAX] {
            let c = span_class(Some((0, span)));
            assert!(span <= class_reach(c), "{span} in class {c}");
            if c > 0 {
                assert!(span > class_reach(c - 1), "{span} fits class {}", c - 1);
            }
            assert!(c < SPAN_CLASSES);
        }
        assert_eq!(span_class(None), 0);
        // Steps far apart in both directions do not overflow.
        assert_eq!(span_class(Some((i64::MIN, i64::MAX))), 63);
        assert_eq!(class_floors(i64::MIN).last(), Some((63, i64::MIN)));
    }
}
