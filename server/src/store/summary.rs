//! A pack's summaries: per metric, the points M4 keeps over step buckets aligned to a few
//! widths ([`WIDTHS`]), written beside the pack when it is made. A whole-run (or wide)
//! answer at a bucket width that is a multiple of one of them reads the summaries of the
//! packs inside its range, not their values, and gets exactly the M4 of the raw data
//! (`decimate::StepM4`: summaries nest). A run of 10 M steps is ~2,400 packs: its whole
//! series is ~20,000 summary points per metric instead of 10 M values.
//!
//! Layout: varint metric count, then per metric `id | values in the pack | kept points |
//! flags (1: values as f32)`, the kept points' steps (zigzag varint deltas), wall times
//! (f64) and values (f32 when each is exactly one, else f64), little-endian, in the order
//! they were logged. Spikes, NaN and the infinities are kept as M4 keeps them, to the bit.

use std::collections::BTreeMap;
use stepstream_protocol::decimate::StepM4;
use stepstream_protocol::{MetricId, StepRecord};

/// The bucket widths (in steps) a pack is summarised at, finest first. A pack holds 4,096
/// records or fewer, so at 1,024 a metric logged every step keeps about 16 points per pack
/// (256 times fewer) and at 16,384 at most 8; both together add about 0.15 bytes per value.
pub const WIDTHS: [i64; 2] = [1_024, 16_384];

/// A pack's summaries, encoded, one per width of [`WIDTHS`].
pub type Widths = [Vec<u8>; 2];

/// Packs without summaries one `Command::Summarize` summarises at most (each is decoded
/// whole), so that a database from before summaries never holds the writer for long.
pub const SUMMARIZE_PER_COMMAND: usize = 16;

/// Where a walk over packs without summaries goes on from after a command that summarised
/// `done` of them, the last at `last`: `None` once a command found fewer than it may take.
pub(super) fn next_after(last: Option<(i64, u64)>, done: usize) -> Option<(i64, u64)> {
    last.filter(|_| done == SUMMARIZE_PER_COMMAND)
}

/// The summaries of a stored pack, from its blob: its step range and one blob per width.
/// `None` when the blob is not a pack, is damaged, or holds no step.
pub(super) fn of_pack(blob: &[u8]) -> Option<((i64, i64), Widths)> {
    let pack = super::pack::decode_pack(blob)?;
    let range = super::blob::step_range(&pack.records)?;
    Some((range, summarize(&pack.records)))
}

/// One metric's summary in one pack, decoded whole (the tests' view; reads go through
/// [`Summary`]).
#[cfg(test)]
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSummary {
    pub metric: MetricId,
    /// Values of the metric in the pack.
    pub total: u64,
    /// Kept points: step, wall time, value; in the order they were logged.
    pub points: Vec<(i64, f64, f64)>,
}

/// A metric's values counted and its M4 at a width, payloads (step, wall time).
type Counted = (u64, StepM4<(i64, f64)>);

/// A metric's id, values, and kept points ((step, wall time), value) in logged order.
type Kept = (MetricId, u64, Vec<((i64, f64), f64)>);

/// The summaries of `records` at each of [`WIDTHS`], encoded. Each coarser one is made
/// from the finer one's kept points (summaries nest): the records are walked once.
pub fn summarize(records: &[StepRecord]) -> Widths {
    // Metric ids are small and dense (the collector numbers them from 0): a vector, not a
    // map, per value.
    let mut per_metric: Vec<Option<Counted>> = Vec::new();
    let mut sparse: BTreeMap<MetricId, Counted> = BTreeMap::new();
    for r in records {
        for &(id, v) in &r.values {
            let slot = if id.0 < 4096 {
                let i = id.0 as usize;
                if i >= per_metric.len() {
                    per_metric.resize_with(i + 1, || None);
                }
                per_metric[i].get_or_insert_with(|| (0, StepM4::new(WIDTHS[0])))
            } else {
                sparse
                    .entry(id)
                    .or_insert_with(|| (0, StepM4::new(WIDTHS[0])))
            };
            slot.0 += 1;
            slot.1.push(r.step, v, (r.step, r.wall_time));
        }
    }
    let fine: Vec<Kept> = per_metric
        .into_iter()
        .enumerate()
        .filter_map(|(i, m)| m.map(|m| (MetricId(i as u32), m)))
        .chain(sparse)
        .map(|(id, (total, m4))| (id, total, m4.finish()))
        .collect();
    let coarse: Vec<Kept> = fine
        .iter()
        .map(|(id, total, kept)| {
            let mut m4 = StepM4::new(WIDTHS[1]);
            for &(p, v) in kept {
                m4.push(p.0, v, p);
            }
            (*id, *total, m4.finish())
        })
        .collect();
    [encode(&fine), encode(&coarse)]
}

/// The summary of `records` at `width` alone, encoded (what [`summarize`] must equal).
#[cfg(test)]
pub fn summarize_at(records: &[StepRecord], width: i64) -> Vec<u8> {
    let mut per_metric: BTreeMap<MetricId, Counted> = BTreeMap::new();
    for r in records {
        for &(id, v) in &r.values {
            let (total, m4) = per_metric
                .entry(id)
                .or_insert_with(|| (0, StepM4::new(width)));
            *total += 1;
            m4.push(r.step, v, (r.step, r.wall_time));
        }
    }
    let kept: Vec<_> = per_metric
        .into_iter()
        .map(|(id, (total, m4))| (id, total, m4.finish()))
        .collect();
    encode(&kept)
}

/// Whether `v` comes back to the bit from an `f32`.
fn is_f32(v: f64) -> bool {
    f64::from(v as f32).to_bits() == v.to_bits()
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn encode(metrics: &[Kept]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, metrics.len() as u64);
    for (id, total, kept) in metrics {
        put_varint(&mut out, u64::from(id.0));
        put_varint(&mut out, *total);
        put_varint(&mut out, kept.len() as u64);
        let narrow = kept.iter().all(|(_, v)| is_f32(*v));
        out.push(if narrow { F32 } else { 0 });
        let mut prev = 0i64;
        for ((step, _), _) in kept {
            put_varint(&mut out, zigzag(step.wrapping_sub(prev)));
            prev = *step;
        }
        for ((_, time), _) in kept {
            out.extend_from_slice(&time.to_le_bytes());
        }
        for (_, v) in kept {
            if narrow {
                out.extend_from_slice(&(*v as f32).to_le_bytes());
            } else {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// A metric's flag: its kept values are stored as `f32` (each is exactly one).
const F32: u8 = 1;

/// One metric's part of a summary, as [`Summary::parse`] found it.
struct Part<'a> {
    metric: MetricId,
    total: u64,
    n: usize,
    narrow: bool,
    steps: &'a [u8],
    times: &'a [u8],
    values: &'a [u8],
}

/// A summary checked whole and read lazily: a metric's points are decoded only for whoever
/// wants that metric (a whole-run series of one metric skips the others' bytes).
pub struct Summary<'a> {
    metrics: Vec<Part<'a>>,
}

impl<'a> Summary<'a> {
    /// `None` when the bytes are not a summary.
    pub fn parse(mut blob: &'a [u8]) -> Option<Summary<'a>> {
        let count = varint(&mut blob)?;
        let mut metrics = Vec::with_capacity(count.min(4096) as usize);
        for _ in 0..count {
            let metric = MetricId(u32::try_from(varint(&mut blob)?).ok()?);
            let total = varint(&mut blob)?;
            let n = usize::try_from(varint(&mut blob)?).ok()?;
            if n as u64 > total {
                return None;
            }
            let (&flags, rest) = blob.split_first()?;
            blob = rest;
            if flags & !F32 != 0 {
                return None;
            }
            let narrow = flags & F32 != 0;
            let start = blob;
            for _ in 0..n {
                varint(&mut blob)?;
            }
            let steps = &start[..start.len() - blob.len()];
            let times_len = n.checked_mul(8)?;
            let values_len = n.checked_mul(if narrow { 4 } else { 8 })?;
            if blob.len() < times_len + values_len {
                return None;
            }
            let (times, rest) = blob.split_at(times_len);
            let (values, rest) = rest.split_at(values_len);
            blob = rest;
            metrics.push(Part {
                metric,
                total,
                n,
                narrow,
                steps,
                times,
                values,
            });
        }
        blob.is_empty().then_some(Summary { metrics })
    }

    /// Each metric's id, values in the pack, and kept points (step, wall time, value) in
    /// the order they were logged.
    pub fn metrics(
        &self,
    ) -> impl Iterator<Item = (MetricId, u64, impl Iterator<Item = (i64, f64, f64)> + 'a)> + '_
    {
        self.metrics.iter().map(|p| {
            let (mut steps, times, values, narrow) = (p.steps, p.times, p.values, p.narrow);
            let mut prev = 0i64;
            let points = (0..p.n).map(move |i| {
                // Checked whole by `parse`.
                let delta = varint(&mut steps).map_or(0, unzigzag);
                prev = prev.wrapping_add(delta);
                let time = f64::from_le_bytes(times[i * 8..i * 8 + 8].try_into().expect("8"));
                let value = if narrow {
                    f64::from(f32::from_le_bytes(
                        values[i * 4..i * 4 + 4].try_into().expect("4"),
                    ))
                } else {
                    f64::from_le_bytes(values[i * 8..i * 8 + 8].try_into().expect("8"))
                };
                (prev, time, value)
            });
            (p.metric, p.total, points)
        })
    }
}

/// A summary's metrics; `None` when the bytes are not one.
#[cfg(test)]
pub fn decode(blob: &[u8]) -> Option<Vec<MetricSummary>> {
    Some(
        Summary::parse(blob)?
            .metrics()
            .map(|(metric, total, points)| MetricSummary {
                metric,
                total,
                points: points.collect(),
            })
            .collect(),
    )
}

/// Which width answers `range` in about `buckets` buckets: the coarsest of [`WIDTHS`] whose
/// aligned buckets, as few multiples of it as keep the count within `buckets`, still number
/// at least half of `buckets`; and that bucket width. `None` when the range is too short for
/// any (its raw points are read).
pub fn width_for((lo, hi): (i64, i64), buckets: usize) -> Option<(usize, i64)> {
    let buckets = buckets.max(1) as i128;
    let span = i128::from(hi) - i128::from(lo) + 1;
    WIDTHS.iter().enumerate().rev().find_map(|(level, &w)| {
        let w = i128::from(w);
        let k = ((span + buckets * w - 1) / (buckets * w)).max(1);
        // Alignment may cost one bucket more than the span needs: then one multiple more.
        [k, k + 1].into_iter().find_map(|k| {
            let width = k * w;
            let count = i128::from(hi).div_euclid(width) - i128::from(lo).div_euclid(width) + 1;
            (count * 2 >= buckets && count <= buckets)
                .then(|| Some((level, i64::try_from(width).ok()?)))
                .flatten()
        })
    })
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint(blob: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = blob.split_first()?;
        *blob = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_decodes_to_the_m4_of_its_records_and_garbage_does_not() {
        let records: Vec<StepRecord> = (0..4096i64)
            .map(|s| StepRecord {
                step: 10_000 + s,
                wall_time: 1.7e9 + s as f64,
                values: if s % 2 == 0 {
                    vec![(MetricId(0), (s as f64).sin()), (MetricId(9), f64::NAN)]
                } else {
                    vec![(MetricId(0), if s == 777 { 1e9 } else { 0.0 })]
                },
            })
            .collect();
        let [blob, coarse] = summarize(&records);
        // Each width as if made alone (the coarse one is made from the fine one's points).
        assert_eq!(blob, summarize_at(&records, WIDTHS[0]));
        assert_eq!(coarse, summarize_at(&records, WIDTHS[1]));
        let got = decode(&blob).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].metric, got[0].total), (MetricId(0), 4096));
        assert!(got[0].points.iter().any(|p| p.0 == 10_777 && p.2 == 1e9));
        assert!(got[0].points.len() <= 5 * 4, "{}", got[0].points.len());
        assert_eq!((got[1].total, got[1].points.len()), (2048, 5 * 2));
        assert!(got[1].points.iter().all(|p| p.2.is_nan()));
        for cut in 0..blob.len() {
            assert!(decode(&blob[..cut]).is_none(), "cut at {cut}");
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(decode(&longer).is_none());
    }

    #[test]
    fn the_width_is_the_coarsest_that_keeps_half_the_buckets() {
        // A 10 M-step run in 1,000 buckets: 16,384 (611 buckets).
        assert_eq!(width_for((0, 9_999_999), 1000), Some((1, 16_384)));
        // 1 M steps: 1,024 (977 buckets).
        assert_eq!(width_for((0, 999_999), 1000), Some((0, 1_024)));
        // 400 k steps: too short, read raw.
        assert_eq!(width_for((0, 399_999), 1000), None);
        // 100 M steps: a multiple of 16,384 that keeps within 1,000 buckets.
        let (level, w) = width_for((0, 99_999_999), 1000).unwrap();
        assert_eq!((level, w % 16_384), (1, 0));
        assert!(100_000_000 / w <= 1000 && 100_000_000 / w >= 500, "{w}");
        // Any range, even all of i64, is answered without overflow.
        assert!(width_for((i64::MIN, i64::MAX), 1000).is_some());
    }
}
