//! A pack: the records of many consecutive batches of one run, stored as one row of columns
//! (steps, wall times, and one column per metric), each compressed with `pco`, a numeric
//! codec that finds what training metrics are made of (deltas for steps and wall times,
//! near-constant and slowly changing series such as the learning rate or the loss scale,
//! float32 values widened to float64). A column whose every value is exactly an `f32` is
//! stored as `f32`. Lossless to the bit: NaN payloads, `-0.0`, subnormals and infinities come
//! back as they went in.
//!
//! Batches arrive a few records at a time (a collector seals one every 40 ms), too few for
//! any codec to find a pattern in; so the writer stores each batch as it comes (`blob.rs`'s
//! row format, the acknowledgement waits for nothing else) and, once a run has enough of
//! them, packs them in the same transaction as the batch that tipped it over
//! (`PACK_VALUES`, `PACK_RECORDS`, `PACK_SEQS`). A pack remembers where each batch began, so
//! a read by sequence number (a viewer's seam, a resend's comparison, a peer's catch-up)
//! still sees exactly the batches it asks for.
//!
//! Layout: `version u8 (2) | first seq | batches | records per batch...`, then the steps
//! column, the wall-times column, the number of metric columns, and per column: `metric id |
//! flags (1: every record has it, 2: f32) | [count | record-index gaps]` and its values. All
//! integers are LEB128 varints; each compressed column is its length, then pco's bytes. A
//! record's values come back in metric id order.

use pco::standalone::{simple_compress, simple_decompress};
use pco::ChunkConfig;
use std::collections::BTreeMap;
use stepstream_protocol::{MetricId, StepRecord};

pub(super) const PACK_VERSION: u8 = 2;

/// A run's unpacked values that make a pack: enough for the codec to find each column's
/// pattern (its per-column header is tens of bytes), few enough that a zoom window decodes
/// little beyond what it shows (a pack of 32,768 values decodes in about 0.1 ms).
pub const PACK_VALUES: u64 = 32_768;
/// Records that make a pack whatever their width (a run with one metric).
pub const PACK_RECORDS: u64 = 4_096;
/// Batches that make a pack whatever they hold (console lines alone, say).
pub const PACK_SEQS: u64 = 4_096;

/// Packs one `Command::Pack` makes at most, so that packing the batches of a run stored
/// before packs existed never holds the writer for long (the store sends it again).
pub const PACKS_PER_COMMAND: usize = 16;

/// What a run holds after its last pack.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct Unpacked {
    pub batches: u64,
    pub values: u64,
    pub records: u64,
}

impl Unpacked {
    pub fn add(&mut self, records: &[StepRecord]) {
        self.batches += 1;
        self.records += records.len() as u64;
        self.values += records.iter().map(|r| r.values.len() as u64).sum::<u64>();
    }

    /// Whether these batches make a pack.
    pub fn make_a_pack(&self) -> bool {
        PACKING.load(std::sync::atomic::Ordering::Relaxed)
            && (self.values >= PACK_VALUES
                || self.records >= PACK_RECORDS
                || self.batches >= PACK_SEQS)
    }
}

/// Off only in the storage benchmark, whose reference is the store without packs (each
/// batch its own row, as before them).
static PACKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether the writer packs from now on (the storage benchmark's reference turns it off).
#[cfg(test)]
pub fn set_packing(on: bool) {
    PACKING.store(on, std::sync::atomic::Ordering::Relaxed);
}

const DENSE: u8 = 1;
const F32: u8 = 2;

fn config() -> ChunkConfig {
    ChunkConfig::default().with_compression_level(4)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first()?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn len(&mut self, most: usize) -> Option<usize> {
        usize::try_from(self.varint()?).ok().filter(|&n| n <= most)
    }
}

/// Appends one compressed column: its length, then pco's bytes (nothing for no values).
fn put_column<T: pco::data_types::Number>(out: &mut Vec<u8>, values: &[T]) {
    if values.is_empty() {
        put_varint(out, 0);
        return;
    }
    // pco refuses only what no column here can be (8-bit types, a bad configuration).
    let bytes = simple_compress(values, &config()).expect("pco compresses a column of numbers");
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(&bytes);
}

fn column<T: pco::data_types::Number>(r: &mut Reader<'_>, n: usize) -> Option<Vec<T>> {
    let len = r.len(r.0.len())?;
    if len == 0 {
        return (n == 0).then(Vec::new);
    }
    let values: Vec<T> = simple_decompress(r.bytes(len)?).ok()?;
    (values.len() == n).then_some(values)
}

/// `v` as an `f32`, if that holds it exactly, NaN payload included (by hand for NaN: a
/// float conversion may change a NaN's payload).
fn narrow(v: f64) -> Option<f32> {
    if v.is_nan() {
        let bits = v.to_bits();
        let payload = bits & ((1 << 52) - 1);
        if payload & ((1 << 29) - 1) != 0 {
            return None;
        }
        let sign = ((bits >> 63) as u32) << 31;
        return Some(f32::from_bits(sign | (0xff << 23) | (payload >> 29) as u32));
    }
    let n = v as f32;
    (f64::from(n).to_bits() == v.to_bits()).then_some(n)
}

/// The inverse of [`narrow`].
fn widen(v: f32) -> f64 {
    if v.is_nan() {
        let bits = v.to_bits();
        let sign = u64::from(bits >> 31) << 63;
        let payload = u64::from(bits & ((1 << 23) - 1)) << 29;
        return f64::from_bits(sign | (0x7ff << 52) | payload);
    }
    f64::from(v)
}

/// Encodes consecutive batches, starting at sequence number `first_seq`, into one pack.
pub(super) fn encode_pack(first_seq: u64, batches: &[Vec<StepRecord>]) -> Vec<u8> {
    let records: Vec<&StepRecord> = batches.iter().flatten().collect();
    let mut out = Vec::with_capacity(64 + records.len() * 8);
    out.push(PACK_VERSION);
    put_varint(&mut out, first_seq);
    put_varint(&mut out, batches.len() as u64);
    for b in batches {
        put_varint(&mut out, b.len() as u64);
    }
    let steps: Vec<i64> = records.iter().map(|r| r.step).collect();
    put_column(&mut out, &steps);
    let walls: Vec<f64> = records.iter().map(|r| r.wall_time).collect();
    put_column(&mut out, &walls);
    // Columns in metric id order; each holds the indices of the records that carry it.
    let mut columns: BTreeMap<MetricId, (Vec<u32>, Vec<f64>)> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        for &(id, v) in &r.values {
            let (at, values) = columns.entry(id).or_default();
            at.push(i as u32);
            values.push(v);
        }
    }
    put_varint(&mut out, columns.len() as u64);
    for (id, (at, values)) in &columns {
        put_varint(&mut out, u64::from(id.0));
        let dense = at.len() == records.len();
        let narrowed: Option<Vec<f32>> = values.iter().map(|&v| narrow(v)).collect();
        out.push(if dense { DENSE } else { 0 } | if narrowed.is_some() { F32 } else { 0 });
        if !dense {
            put_varint(&mut out, at.len() as u64);
            let mut next = 0u32;
            for &i in at {
                put_varint(&mut out, u64::from(i - next));
                next = i + 1;
            }
        }
        if let Some(v32) = narrowed {
            put_column(&mut out, &v32);
        } else {
            put_column(&mut out, values);
        }
    }
    out
}

/// A pack decoded: its records, and where each batch's records start.
pub(super) struct Decoded {
    pub first_seq: u64,
    pub records: Vec<StepRecord>,
    /// `starts[i]..starts[i + 1]` are the records of batch `first_seq + i`.
    pub starts: Vec<usize>,
}

impl Decoded {
    /// The batches, each with its sequence number.
    pub fn batches(&self) -> impl Iterator<Item = (u64, &[StepRecord])> {
        self.starts
            .windows(2)
            .enumerate()
            .map(|(i, w)| (self.first_seq + i as u64, &self.records[w[0]..w[1]]))
    }
}

/// Whether a blob is a pack (else it is one batch's row, `blob.rs`).
pub(super) fn is_pack(blob: &[u8]) -> bool {
    blob.first() == Some(&PACK_VERSION)
}

/// A pack's head and its step and wall-time columns, the reader left at its metric columns.
struct Head<'a> {
    first_seq: u64,
    starts: Vec<usize>,
    steps: Vec<i64>,
    walls: Vec<f64>,
    rest: Reader<'a>,
}

fn head(blob: &[u8]) -> Option<Head<'_>> {
    let mut r = Reader(blob);
    if r.byte()? != PACK_VERSION {
        return None;
    }
    let first_seq = r.varint()?;
    let n_batches = r.len(r.0.len())?;
    let mut starts = Vec::with_capacity(n_batches + 1);
    let mut n = 0usize;
    starts.push(0);
    for _ in 0..n_batches {
        n = n.checked_add(r.len(u32::MAX as usize)?)?;
        starts.push(n);
    }
    if n > (u32::MAX as usize) {
        return None;
    }
    let steps: Vec<i64> = column(&mut r, n)?;
    let walls: Vec<f64> = column(&mut r, n)?;
    Some(Head {
        first_seq,
        starts,
        steps,
        walls,
        rest: r,
    })
}

/// Walks a pack's metric columns: `f(metric, record indices or None for every record,
/// values)`; `None` if the pack is damaged.
fn columns(
    r: &mut Reader<'_>,
    n: usize,
    mut f: impl FnMut(MetricId, Option<&[usize]>, Vec<f64>),
) -> Option<()> {
    let n_columns = r.len(r.0.len())?;
    let mut at = Vec::new();
    for _ in 0..n_columns {
        let id = MetricId(u32::try_from(r.varint()?).ok()?);
        let flags = r.byte()?;
        let dense = flags & DENSE != 0;
        if !dense {
            let k = r.len(n)?;
            at.clear();
            let mut next = 0usize;
            for _ in 0..k {
                let i = next.checked_add(r.len(n)?)?;
                if i >= n {
                    return None;
                }
                at.push(i);
                next = i + 1;
            }
        }
        let k = if dense { n } else { at.len() };
        let values: Vec<f64> = if flags & F32 != 0 {
            column::<f32>(r, k)?.into_iter().map(widen).collect()
        } else {
            column::<f64>(r, k)?
        };
        f(id, (!dense).then_some(&at[..]), values);
    }
    r.0.is_empty().then_some(())
}

/// Decodes a pack; `None` if it is damaged (no count in it is believed beyond what its
/// bytes could describe, so a damaged one cannot make this allocate without bound).
pub(super) fn decode_pack(blob: &[u8]) -> Option<Decoded> {
    let Head {
        first_seq,
        starts,
        steps,
        walls,
        mut rest,
    } = head(blob)?;
    let n = steps.len();
    let mut records: Vec<StepRecord> = steps
        .into_iter()
        .zip(walls)
        .map(|(step, wall_time)| StepRecord {
            step,
            wall_time,
            values: Vec::new(),
        })
        .collect();
    columns(&mut rest, n, |id, at, values| match at {
        None => {
            for (rec, v) in records.iter_mut().zip(values) {
                rec.values.push((id, v));
            }
        }
        Some(at) => {
            for (&i, v) in at.iter().zip(values) {
                records[i].values.push((id, v));
            }
        }
    })?;
    Some(Decoded {
        first_seq,
        records,
        starts,
    })
}

/// Calls `f(step, wall_time, metric, value)` for every value of the pack's batches with
/// `after < seq <= through`, metric by metric (each metric's values in record order),
/// without building records: what a whole-run read wants. `None` if the pack is damaged.
pub(super) fn visit_pack_values(
    blob: &[u8],
    (after, through): (u64, u64),
    mut f: impl FnMut(i64, f64, MetricId, f64),
) -> Option<()> {
    let Head {
        first_seq,
        starts,
        steps,
        walls,
        mut rest,
    } = head(blob)?;
    // The records of the wanted batches: one range, as sequence numbers are consecutive.
    let seq_index = |seq: u64| seq.saturating_sub(first_seq).min(starts.len() as u64 - 1) as usize;
    let lo = starts[seq_index(after.saturating_add(1))];
    let hi = starts[seq_index(through.saturating_add(1))];
    let wanted = lo..hi;
    let n = steps.len();
    columns(&mut rest, n, |id, at, values| match at {
        None => {
            for (i, v) in values.into_iter().enumerate().take(hi).skip(lo) {
                f(steps[i], walls[i], id, v);
            }
        }
        Some(at) => {
            for (&i, v) in at.iter().zip(values) {
                if wanted.contains(&i) {
                    f(steps[i], walls[i], id, v);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests;
