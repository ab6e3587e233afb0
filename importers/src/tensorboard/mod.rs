//! `stepstream import DIR`: the scalars of TensorBoard event files become runs on a hub,
//! one run per directory holding `events.out.tfevents.*` files, with their steps and wall
//! times. Written by tensorboardX, PyTorch's `SummaryWriter`, MindFormers or TF2.
//!
//! * `records` — the TFRecord framing, both checksums verified.
//! * `event` — the `Event` protobuf's scalar parts.
//!
//! Incremental: each file is read from where the last look stopped (a record cut short at
//! the end waits for its writer), and a new import of a directory the hub already has skips
//! the steps the hub holds. Consecutive events of one step become one record. MindFormers'
//! `... vs samples` tags (`..._vs_samples` once a writer sanitised them) count samples, not
//! steps, on their x axis: they are skipped.

pub mod event;
pub mod records;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use stepstream_collector::Collector;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Record {
        path: PathBuf,
        source: records::RecordError,
    },
}

/// Bytes of an event file read at a time.
const READ_CHUNK: usize = 4 << 20;

/// What an import did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub events: u64,
    pub points: u64,
    /// Events the hub already had (a repeated import).
    pub skipped: u64,
    /// Records that were not an `Event` (checksums right, contents not).
    pub undecodable: u64,
    /// Values handed to the collector, per metric: what the hub must acknowledge.
    pub logged: std::collections::BTreeMap<String, u64>,
    /// Text, image and histogram summaries handed to the collector as samples.
    pub samples: u64,
}

/// Whether a file name is an event file's.
pub fn is_event_file(name: &str) -> bool {
    name.contains("tfevents")
}

/// The directories under `root` (itself included) holding event files, each with its files
/// in name order (their names carry their creation time).
pub fn discover(root: &Path) -> Result<BTreeMap<PathBuf, Vec<PathBuf>>, ImportError> {
    let mut found: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ImportError::Io {
            path: dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && is_event_file(&entry.file_name().to_string_lossy()) {
                found.entry(dir.clone()).or_default().push(path);
            }
        }
    }
    for files in found.values_mut() {
        files.sort();
    }
    Ok(found)
}

/// A record being gathered: step, wall time, values by tag.
type Gathered = (i64, f64, Vec<(String, f64)>);

/// One run's directory, read incrementally.
pub struct RunDir {
    pub dir: PathBuf,
    /// Bytes of each file already read.
    offsets: BTreeMap<PathBuf, u64>,
    /// While set, events up to this step are skipped (the hub has them).
    catching_up: Option<i64>,
    /// The record being gathered: consecutive events of one step.
    open: Option<Gathered>,
    pub report: ImportReport,
    /// Why this directory is no longer read (a damaged file); the others go on.
    pub broken: Option<String>,
}

impl RunDir {
    /// `after_step`: the hub's last step for this run (`Welcome`), if any.
    pub fn new(dir: PathBuf, after_step: Option<i64>) -> RunDir {
        RunDir {
            dir,
            offsets: BTreeMap::new(),
            catching_up: after_step,
            open: None,
            report: ImportReport::default(),
            broken: None,
        }
    }

    /// Reads what was added to the directory's event files since the last call and sends
    /// it; returns the events read.
    pub fn poll(&mut self, collector: &Collector) -> Result<u64, ImportError> {
        if self.broken.is_some() {
            return Ok(0);
        }
        let result = self.poll_files(collector);
        if let Err(e) = &result {
            // What was read before the damage is sent; nothing after it is guessed at.
            self.emit(collector);
            self.broken = Some(e.to_string());
        }
        result
    }

    fn poll_files(&mut self, collector: &Collector) -> Result<u64, ImportError> {
        let files = match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                let mut f: Vec<PathBuf> = entries
                    .flatten()
                    .filter(|e| is_event_file(&e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect();
                f.sort();
                f
            }
            Err(source) => {
                return Err(ImportError::Io {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        let mut read = 0;
        for path in files {
            read += self.read_file(&path, collector)?;
        }
        self.emit(collector);
        Ok(read)
    }

    fn read_file(&mut self, path: &Path, collector: &Collector) -> Result<u64, ImportError> {
        let io = |source| ImportError::Io {
            path: path.to_path_buf(),
            source,
        };
        let offset = self.offsets.get(path).copied().unwrap_or(0);
        let mut file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len <= offset {
            return Ok(0);
        }
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        // In bounded chunks: event files that hold images reach gigabytes, and only what a
        // record needs is held (one record is at most `records::MAX_RECORD`).
        let mut pos = offset;
        let mut buf: Vec<u8> = Vec::new();
        let mut n = 0;
        let mut want = READ_CHUNK;
        loop {
            let got = (&mut file)
                .take(want.saturating_sub(buf.len()) as u64)
                .read_to_end(&mut buf)
                .map_err(io)?;
            let (recs, used, damage) = records::split(&buf, pos);
            for data in recs {
                match event::Event::decode_bytes(data) {
                    Ok(e) => {
                        n += 1;
                        self.event(&e, collector);
                    }
                    Err(_) => self.report.undecodable += 1,
                }
            }
            pos += used as u64;
            buf.drain(..used);
            self.offsets.insert(path.to_path_buf(), pos);
            if let Some(source) = damage {
                return Err(ImportError::Record {
                    path: path.to_path_buf(),
                    source,
                });
            }
            if got == 0 {
                // The end of what is written: a record cut short waits for the next poll.
                return Ok(n);
            }
            // A record longer than the chunk: read on until it is whole (split checked its
            // length against the limit when its header was there).
            want = match buf.get(..8) {
                Some(len) if used == 0 => {
                    let length = u64::from_le_bytes(len.try_into().expect("8 bytes"));
                    READ_CHUNK.max(12 + length.min(records::MAX_RECORD) as usize + 4)
                }
                _ => READ_CHUNK,
            };
        }
    }

    fn event(&mut self, e: &event::Event, collector: &Collector) {
        let samples = e.samples();
        if !samples.is_empty() && self.catching_up.is_none_or(|last| e.step > last) {
            // Text, images and histograms go as the run's samples, at their step (those a
            // repeated import's hub already has are skipped with its scalars).
            let at = if e.wall_time.is_finite() && e.wall_time > 0.0 {
                e.wall_time
            } else {
                stepstream_protocol::unix_now()
            };
            for (tag, body) in samples {
                collector.log_item_at(e.step, at, tag, body);
                self.report.samples += 1;
            }
        }
        let scalars: Vec<(String, f64)> = e
            .scalars()
            .into_iter()
            .filter(|(tag, _)| !(tag.ends_with(" vs samples") || tag.ends_with("_vs_samples")))
            .map(|(t, v)| (t.to_string(), v))
            .collect();
        if scalars.is_empty() {
            return;
        }
        self.report.events += 1;
        match self.catching_up {
            Some(last) if e.step <= last => {
                self.report.skipped += 1;
                return;
            }
            Some(_) => self.catching_up = None,
            None => {}
        }
        self.report.points += scalars.len() as u64;
        if let Some((_, _, values)) = self.open.as_mut().filter(|o| o.0 == e.step) {
            for (tag, v) in scalars {
                match values.iter_mut().find(|(t, _)| *t == tag) {
                    Some(slot) => slot.1 = v,
                    None => values.push((tag, v)),
                }
            }
            return;
        }
        self.emit(collector);
        self.open = Some((e.step, e.wall_time, scalars));
    }

    fn emit(&mut self, collector: &Collector) {
        if let Some((step, wall_time, values)) = self.open.take() {
            for (t, _) in &values {
                *self.report.logged.entry(t.clone()).or_default() += 1;
            }
            let pairs: Vec<(&str, f64)> = values.iter().map(|(t, v)| (t.as_str(), *v)).collect();
            if wall_time.is_finite() && wall_time > 0.0 {
                collector.log_at(step, wall_time, &pairs);
            } else {
                collector.log(step, &pairs);
            }
        }
    }
}
