//! `stepstream tail`: stream a metrics CSV that a training job already writes, following the
//! file as it grows.
//!
//! The reference shape is `step,timestamp,loss,lr,grad_norm,samples_per_sec`; any other
//! numeric column becomes a metric too. Only complete lines (ending in a newline) are read
//! while following, so a half-written last line is waited for, never misread. Cells `nan`,
//! `inf` and `-inf` are values; an empty cell is a missing value; a row that does not parse
//! is reported and skipped. `timestamp` may be unix seconds or `YYYY-MM-DD HH:MM:SS[.f]`
//! (read as UTC).
//!
//! `Format::MindFormers` reads MindFormers' training log instead (`mindformers`): each loss
//! monitor line is a row, every other line is skipped.

pub mod mindformers;

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use stepstream_collector::Collector;

#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Header(String),
}

/// What a tail did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TailReport {
    pub rows: u64,
    pub bad_rows: u64,
    /// Rows at or below the step the hub already had (a resumed tail).
    pub skipped: u64,
    /// Values handed to the collector, per metric: what the hub must acknowledge.
    pub logged: std::collections::BTreeMap<String, u64>,
    /// Lines of a log forwarded as the run's console (every line a MindFormers log holds).
    pub console_lines: u64,
}

/// One parsed data row.
#[derive(Debug, PartialEq)]
pub struct Row {
    pub step: i64,
    pub wall_time: Option<f64>,
    pub values: Vec<(usize, f64)>,
}

/// Turns CSV lines into rows, given the header.
#[derive(Debug)]
pub struct Parser {
    pub columns: Vec<String>,
    step: usize,
    timestamp: Option<usize>,
}

fn split(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// `YYYY-MM-DD[ T]HH:MM:SS[.fff]` as unix seconds (UTC).
fn parse_datetime(s: &str) -> Option<f64> {
    let s = s.trim().trim_end_matches('Z');
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let h: i64 = t.next()?.parse().ok()?;
    let min: i64 = t.next()?.parse().ok()?;
    let sec: f64 = t.next().unwrap_or("0").parse().ok()?;
    // `f64` parses "nan" and "inf" too: a time of day is finite and in range.
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || !(0..24).contains(&h)
        || !(0..60).contains(&min)
        || !(0.0..61.0).contains(&sec)
        || !(-9999..=9999).contains(&y)
    {
        return None;
    }
    // Days from civil (H. Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60) as f64 + sec)
}

fn parse_value(cell: &str) -> Option<f64> {
    // Rust's parser takes nan, inf, infinity in any case, with a sign.
    cell.trim().parse::<f64>().ok()
}

impl Parser {
    pub fn new(header: &str) -> Result<Parser, TailError> {
        let columns: Vec<String> = split(header.trim_end_matches(['\r', '\n']))
            .into_iter()
            .map(|c| c.trim().to_string())
            .collect();
        let step = columns
            .iter()
            .position(|c| c.eq_ignore_ascii_case("step"))
            .ok_or_else(|| {
                TailError::Header(format!(
                    "the header {header:?} has no `step` column (expected \
                     step,timestamp,loss,lr,...)"
                ))
            })?;
        let timestamp = columns
            .iter()
            .position(|c| c.eq_ignore_ascii_case("timestamp") || c.eq_ignore_ascii_case("time"));
        Ok(Parser {
            columns,
            step,
            timestamp,
        })
    }

    /// The metric columns: every column but `step` and `timestamp`.
    pub fn is_metric(&self, column: usize) -> bool {
        column != self.step && Some(column) != self.timestamp
    }

    pub fn row(&self, line: &str) -> Result<Row, String> {
        let cells = split(line.trim_end_matches(['\r', '\n']));
        if cells.len() != self.columns.len() {
            return Err(format!(
                "{} cells where the header has {}",
                cells.len(),
                self.columns.len()
            ));
        }
        let step_cell = cells[self.step].trim();
        let step = step_cell
            .parse::<i64>()
            .ok()
            .or_else(|| {
                let f = step_cell.parse::<f64>().ok()?;
                (f.fract() == 0.0 && f.abs() < 9e15).then_some(f as i64)
            })
            .ok_or_else(|| format!("step {step_cell:?} is not an integer"))?;
        let wall_time = match self.timestamp {
            Some(i) if !cells[i].trim().is_empty() => {
                let c = cells[i].trim();
                Some(
                    c.parse::<f64>()
                        .ok()
                        .filter(|t| t.is_finite())
                        .or_else(|| parse_datetime(c))
                        .ok_or_else(|| {
                            format!("timestamp {c:?} is neither unix seconds nor a date")
                        })?,
                )
            }
            _ => None,
        };
        let mut values = Vec::with_capacity(cells.len());
        for (i, cell) in cells.iter().enumerate() {
            if !self.is_metric(i) || cell.trim().is_empty() {
                continue;
            }
            let v = parse_value(cell)
                .ok_or_else(|| format!("{} = {cell:?} is not a number", self.columns[i]))?;
            values.push((i, v));
        }
        Ok(Row {
            step,
            wall_time,
            values,
        })
    }
}

/// What the followed file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// A metrics CSV with a header.
    #[default]
    Csv,
    /// MindFormers' training log (its loss monitor's lines).
    MindFormers,
}

/// Streams `path` into `collector`: the rows after `after_step` (the hub's last step, for a
/// resumed tail), then, when `follow`, every row appended later until `stop` is set. Bad rows
/// are reported on stderr and skipped.
///
/// Consecutive rows of one step (an evaluation row beside the training row) become one
/// record. Steps may go down (a training resumed from a checkpoint): only the rows a resumed
/// tail already sent are skipped, while it catches up. Like `tail -F`, a file truncated in
/// place is read again from its start, and a file replaced under the same path (rotated)
/// is followed to the new one once the old one is read to its end.
pub fn tail(
    path: &Path,
    format: Format,
    collector: &Collector,
    after_step: Option<i64>,
    follow: bool,
    poll: Duration,
    stop: &AtomicBool,
) -> Result<TailReport, TailError> {
    let io = |source| TailError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut identity = file_identity(&file.metadata().map_err(io)?);
    let mut rows = Rows {
        collector,
        format,
        names: Vec::new(),
        parser: None,
        line_no: 0,
        catching_up: after_step,
        open: None,
        last_step: None,
        report: TailReport::default(),
    };
    let mut pending = Vec::<u8>::new();
    let mut offset: u64 = 0;
    let mut chunk = vec![0u8; 64 * 1024];
    // Inside a line past `MAX_LINE`: its bytes are dropped up to its end.
    let mut discarding = false;
    loop {
        let n = file.read(&mut chunk).map_err(io)?;
        if n > 0 {
            offset += n as u64;
            let mut new = &chunk[..n];
            if discarding {
                match new.iter().position(|&b| b == b'\n') {
                    Some(end) => {
                        discarding = false;
                        new = &new[end + 1..];
                    }
                    None => continue,
                }
            }
            pending.extend_from_slice(new);
            let mut start = 0;
            while let Some(end) = pending[start..].iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&pending[start..start + end]).into_owned();
                start += end + 1;
                rows.line(&line)?;
            }
            pending.drain(..start);
            if pending.len() > MAX_LINE {
                rows.too_long();
                pending.clear();
                discarding = true;
            }
            continue;
        }
        // At the end of what is written so far.
        if !follow || stop.load(Ordering::Relaxed) {
            if !follow && !pending.is_empty() {
                // The file is complete: its last line just lacks a newline.
                let line = String::from_utf8_lossy(&pending).into_owned();
                rows.line(&line)?;
            }
            rows.emit();
            return Ok(rows.report);
        }
        // Nothing more for now: what is held goes out (a later row of the same step becomes
        // its own record rather than waiting here).
        rows.emit();
        collector.flush();
        std::thread::sleep(poll);
        let now = match std::fs::metadata(path) {
            Ok(m) => m,
            // Between a rotation's rename and the new file's creation.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        if file_identity(&now) != identity {
            // Rotated: the old file was read to its end above; follow the new one.
            eprintln!(
                "stepstream tail: {} was replaced; following the new file from its start",
                path.display()
            );
            file = std::fs::File::open(path).map_err(io)?;
            identity = file_identity(&file.metadata().map_err(io)?);
            rows.restart();
            offset = 0;
            pending.clear();
        } else if now.len() < offset {
            eprintln!(
                "stepstream tail: {} shrank from {offset} to {} bytes; reading it again from \
                 the start",
                path.display(),
                now.len()
            );
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            rows.restart();
            offset = 0;
            pending.clear();
        }
    }
}

/// The longest line read: a file that is no log (or a line without an end) must not grow
/// the tail's memory without bound. A longer line is skipped, and reported.
pub const MAX_LINE: usize = 1 << 20;

/// Which file a path names: its device and inode (a rotation changes them).
fn file_identity(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// Lines to records: the header, then rows, merged per step.
struct Rows<'a> {
    collector: &'a Collector,
    format: Format,
    /// A log's metric names, by first appearance (a CSV's are its header's).
    names: Vec<String>,
    parser: Option<Parser>,
    line_no: u64,
    /// While set, a resumed tail skips rows up to this step (the hub has them).
    catching_up: Option<i64>,
    /// The record being gathered (rows of one step merged).
    open: Option<Row>,
    /// The step of the last record sent.
    last_step: Option<i64>,
    report: TailReport,
}

impl Rows<'_> {
    /// A new file (truncated or rotated): a new header, and every row is new.
    fn restart(&mut self) {
        self.emit();
        self.parser = None;
        self.line_no = 0;
        self.catching_up = None;
    }

    /// Reads one line; a log's every line also goes on as the run's console, at the step of
    /// the record it belongs to (a resumed tail skips those the hub had).
    fn line(&mut self, line: &str) -> Result<(), TailError> {
        self.parse(line)?;
        if self.format == Format::MindFormers && self.catching_up.is_none() {
            let step = self
                .open
                .as_ref()
                .map(|o| o.step)
                .or(self.last_step)
                .unwrap_or(0);
            let body = stepstream_protocol::ItemBody::Line {
                stream: stepstream_protocol::Stream::Stdout,
                text: line.replace('\0', "\u{fffd}"),
            };
            self.collector
                .log_item_at(step, stepstream_protocol::unix_now(), "", body);
            self.report.console_lines += 1;
        }
        Ok(())
    }

    fn parse(&mut self, line: &str) -> Result<(), TailError> {
        self.line_no += 1;
        if line.trim().is_empty() {
            return Ok(());
        }
        let parsed = match self.format {
            Format::Csv => {
                let Some(p) = self.parser.as_ref() else {
                    self.parser = Some(Parser::new(line)?);
                    return Ok(());
                };
                p.row(line)
            }
            Format::MindFormers => match mindformers::parse(line) {
                Some(row) => row.map(|l| self.row_of(l)),
                None => {
                    // The progress line after a monitor line: its throughput, same step. Any
                    // other line leaves the record being gathered alone (taking it here lost
                    // the last step of every real log: "Training Over!" follows it).
                    if let Some(v) = mindformers::progress(line) {
                        if self.open.is_some() {
                            let i = self.index("samples_per_sec_per_device");
                            if let Some(open) = self.open.as_mut() {
                                open.values.push((i, v));
                            }
                        }
                    }
                    return Ok(());
                }
            },
        };
        let row = match parsed {
            Ok(row) => row,
            Err(why) => {
                eprintln!(
                    "stepstream tail: line {} skipped: {why}: {line:?}",
                    self.line_no
                );
                self.report.bad_rows += 1;
                return Ok(());
            }
        };
        match self.catching_up {
            Some(last) if row.step <= last => {
                self.report.skipped += 1;
                return Ok(());
            }
            Some(_) => self.catching_up = None,
            None => {}
        }
        self.report.rows += 1;
        if let Some(open) = self.open.as_mut().filter(|o| o.step == row.step) {
            // The same step again: its cells join the record, a later cell winning.
            for (i, v) in row.values {
                match open.values.iter_mut().find(|(j, _)| *j == i) {
                    Some(slot) => slot.1 = v,
                    None => open.values.push((i, v)),
                }
            }
            open.wall_time = open.wall_time.or(row.wall_time);
            return Ok(());
        }
        self.emit();
        self.open = Some(row);
        Ok(())
    }

    /// A line longer than [`MAX_LINE`]: skipped, counted as a bad row.
    fn too_long(&mut self) {
        self.line_no += 1;
        eprintln!(
            "stepstream tail: line {} skipped: longer than {MAX_LINE} bytes",
            self.line_no
        );
        self.report.bad_rows += 1;
    }

    /// The index of a log's metric name.
    fn index(&mut self, name: &str) -> usize {
        match self.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_string());
                self.names.len() - 1
            }
        }
    }

    fn row_of(&mut self, line: mindformers::Line) -> Row {
        let values = line
            .values
            .iter()
            .map(|(name, v)| (self.index(name), *v))
            .collect();
        Row {
            step: line.step,
            wall_time: None,
            values,
        }
    }

    /// Sends the record being gathered.
    fn emit(&mut self) {
        let Some(row) = self.open.take() else {
            return;
        };
        self.last_step = Some(row.step);
        let names: &[String] = match (self.format, self.parser.as_ref()) {
            (Format::Csv, Some(p)) => &p.columns,
            (Format::Csv, None) => return,
            (Format::MindFormers, _) => &self.names,
        };
        let metrics: Vec<(&str, f64)> = row
            .values
            .iter()
            .map(|&(i, v)| (names[i].as_str(), v))
            .collect();
        for (name, _) in &metrics {
            match self.report.logged.get_mut(*name) {
                Some(n) => *n += 1,
                None => {
                    self.report.logged.insert(name.to_string(), 1);
                }
            }
        }
        match row.wall_time {
            Some(t) => self.collector.log_at(row.step, t, &metrics),
            None => self.collector.log(row.step, &metrics),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_rows() {
        let p = Parser::new("step,timestamp,loss,lr,grad_norm,samples_per_sec\n").unwrap();
        let row = p.row("10,1764700000.5,2.25,0.001,nan,inf").unwrap();
        assert_eq!(row.step, 10);
        assert_eq!(row.wall_time, Some(1_764_700_000.5));
        assert_eq!(row.values.len(), 4);
        assert!(row.values[2].1.is_nan());
        assert_eq!(row.values[3].1, f64::INFINITY);
        let row = p.row("11,2024-01-02 03:04:05.5,-inf,,1,2").unwrap();
        assert_eq!(row.wall_time, Some(1_704_164_645.5));
        assert_eq!(row.values[0].1, f64::NEG_INFINITY);
        assert_eq!(row.values.len(), 3, "empty lr cell is missing, not zero");
    }

    #[test]
    fn bad_rows_say_why() {
        let p = Parser::new("step,loss").unwrap();
        assert!(p.row("1,abc").unwrap_err().contains("loss"));
        assert!(p.row("1").unwrap_err().contains("cells"));
        assert!(p.row("x,1").unwrap_err().contains("step"));
        assert!(Parser::new("epoch,loss").is_err());
    }

    #[test]
    fn a_time_of_day_is_finite_and_in_range() {
        // Found by fuzzing: "nan" parsed as seconds gave a NaN wall time.
        for bad in [
            "2026-12-03T10:00:nan",
            "2026-12-03 10:00:inf",
            "2026-12-03 25:00:00",
            "2026-12-03 10:61:00",
        ] {
            assert_eq!(parse_datetime(bad), None, "{bad}");
        }
        assert!(
            parse_datetime("2026-12-03 23:59:60.5").is_some(),
            "a leap second"
        );
    }

    /// What the hub's export and the collector's archive write (`protocol::csv`) reads back
    /// here exactly: every value (to the bit), every missing cell missing, every column name.
    #[test]
    fn what_the_csv_writer_writes_reads_back_exactly() {
        use stepstream_protocol::csv::{header, push_row};
        let names = ["loss", "a,b", "say \"hi\"", "lr"];
        let rows: Vec<(i64, f64, Vec<Option<f64>>)> = vec![
            (
                0,
                1_764_700_000.25,
                vec![Some(0.1), Some(-0.0), None, Some(5e-324)],
            ),
            (-7, 0.0, vec![None, None, None, None]),
            (
                i64::MAX,
                12.5,
                vec![
                    Some(f64::NAN),
                    Some(f64::INFINITY),
                    Some(f64::NEG_INFINITY),
                    Some(f64::MAX),
                ],
            ),
            (
                3,
                1_764_700_001.0,
                vec![Some(0.30000000000000004), None, Some(1e300), None],
            ),
        ];
        let mut text = header(names);
        for (step, t, cells) in &rows {
            push_row(&mut text, *step, *t, cells.iter().copied());
        }
        let mut lines = text.lines();
        let p = Parser::new(lines.next().unwrap()).unwrap();
        assert_eq!(p.columns[2..], names.map(String::from));
        for ((step, t, cells), line) in rows.iter().zip(lines) {
            let row = p.row(line).unwrap();
            assert_eq!(row.step, *step);
            assert_eq!(row.wall_time, Some(*t));
            let expected: Vec<(usize, u64)> = cells
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.map(|v| (i + 2, v.to_bits())))
                .collect();
            let got: Vec<(usize, u64)> = row
                .values
                .iter()
                .map(|&(c, v)| {
                    (
                        c,
                        if v.is_nan() {
                            f64::NAN.to_bits()
                        } else {
                            v.to_bits()
                        },
                    )
                })
                .collect();
            assert_eq!(got, expected, "{line}");
        }
    }

    #[test]
    fn quoted_cells() {
        assert_eq!(split("a,\"b,c\",\"d\"\"e\""), vec!["a", "b,c", "d\"e"]);
    }
}
