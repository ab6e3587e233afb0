//! What a run logs besides scalars: its console lines and its samples (text, tables). They
//! travel inside a [`crate::Batch`] beside its records, so they are sequenced, acknowledged,
//! spooled and resent exactly as records are; the hub stores them apart from the records'
//! blobs, so a run with many samples reads its charts as fast as one without.

use serde::{Deserialize, Serialize};

/// Which of the process's output streams a console line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    pub fn parse(s: &str) -> Option<Stream> {
        match s {
            "stdout" => Some(Stream::Stdout),
            "stderr" => Some(Stream::Stderr),
            _ => None,
        }
    }
}

/// One cell of a [`ItemBody::Table`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Cell {
    Text(String),
    Number(f64),
}

/// What an item holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ItemBody {
    /// One console line, without its line end (a `\r`-rewritten progress bar: its last state).
    Line { stream: Stream, text: String },
    /// A text sample (a model's generation).
    Text(String),
    /// Rows of cells under named columns (prompt, response, reward...); every row as wide as
    /// the columns.
    Table {
        columns: Vec<String>,
        rows: Vec<Vec<Cell>>,
    },
    /// A distribution (a layer's weights or gradients): `counts[i]` values fell in the i-th
    /// of `counts.len()` equal bins over `lo..=hi` (the finite values' range); non-finite
    /// values are counted apart.
    Histogram(Histogram),
    /// An image, encoded (PNG or JPEG).
    Image(Image),
}

/// How an [`Image`]'s bytes are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageFormat {
    Png,
    Jpeg,
}

impl ImageFormat {
    pub fn mime(self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg => "image/jpeg",
        }
    }

    pub fn parse(s: &str) -> Option<ImageFormat> {
        match s {
            "png" | "image/png" => Some(ImageFormat::Png),
            "jpeg" | "jpg" | "image/jpeg" => Some(ImageFormat::Jpeg),
            _ => None,
        }
    }
}

/// See [`ItemBody::Image`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    pub caption: String,
    /// The encoded file; empty where a frame carries the image's place only (a viewer's live
    /// frame: the page reads the bytes over HTTP).
    pub data: Vec<u8>,
}

/// See [`ItemBody::Histogram`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub lo: f64,
    pub hi: f64,
    pub counts: Vec<f64>,
    pub nan: f64,
    pub pos_inf: f64,
    pub neg_inf: f64,
}

/// Bins of one histogram, at most.
pub const MAX_BINS: usize = 4096;

/// The kinds of items, as the store and the API name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemKind {
    Line,
    Text,
    Table,
    Histogram,
    Image,
}

impl ItemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Line => "console",
            ItemKind::Text => "text",
            ItemKind::Table => "table",
            ItemKind::Histogram => "histogram",
            ItemKind::Image => "image",
        }
    }

    /// The store's number for the kind.
    pub fn code(self) -> i64 {
        match self {
            ItemKind::Line => 1,
            ItemKind::Text => 2,
            ItemKind::Table => 3,
            ItemKind::Histogram => 4,
            ItemKind::Image => 5,
        }
    }

    pub fn from_code(code: i64) -> Option<ItemKind> {
        Some(match code {
            1 => ItemKind::Line,
            2 => ItemKind::Text,
            3 => ItemKind::Table,
            4 => ItemKind::Histogram,
            5 => ItemKind::Image,
            _ => return None,
        })
    }
}

/// A console line or a sample, at the step current when it was made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub step: i64,
    /// Unix seconds.
    pub wall_time: f64,
    /// A sample's key (`generation`); empty for a console line.
    pub key: String,
    pub body: ItemBody,
}

impl Item {
    pub fn kind(&self) -> ItemKind {
        match self.body {
            ItemBody::Line { .. } => ItemKind::Line,
            ItemBody::Text(_) => ItemKind::Text,
            ItemBody::Table { .. } => ItemKind::Table,
            ItemBody::Histogram(_) => ItemKind::Histogram,
            ItemBody::Image(_) => ItemKind::Image,
        }
    }

    /// The bytes of the item's content (text, cells, key), about: what the `item_bytes`
    /// limit and the per-run quota count.
    pub fn content_bytes(&self) -> usize {
        self.key.len()
            + match &self.body {
                ItemBody::Line { text, .. } | ItemBody::Text(text) => text.len(),
                ItemBody::Table { columns, rows } => {
                    columns.iter().map(|c| c.len() + 1).sum::<usize>()
                        + rows
                            .iter()
                            .flatten()
                            .map(|c| match c {
                                Cell::Text(t) => t.len() + 1,
                                Cell::Number(_) => 9,
                            })
                            .sum::<usize>()
                }
                ItemBody::Histogram(h) => 8 * (h.counts.len() + 5),
                ItemBody::Image(i) => i.caption.len() + i.data.len(),
            }
    }

    /// Bytes the item adds to an encoded batch, at most.
    pub fn wire_bytes(&self) -> usize {
        32 + self.content_bytes()
            + match &self.body {
                ItemBody::Table { columns, rows } => {
                    10 * (columns.len() + rows.len() + rows.iter().map(Vec::len).sum::<usize>())
                }
                ItemBody::Histogram(h) => 10 + h.counts.len(),
                ItemBody::Image(_) => 30,
                _ => 10,
            }
    }

    /// What is wrong with the item, if anything: a ragged table, a NUL in text (PostgreSQL
    /// refuses it), a key with a control character, a non-finite time.
    pub fn check(&self, limits: &crate::Limits) -> Result<(), String> {
        let bytes = self.content_bytes();
        if bytes > limits.item_bytes as usize {
            return Err(format!(
                "a {} item of step {} is {bytes} bytes; the limit is {} (limit item_bytes)",
                self.kind().as_str(),
                self.step,
                limits.item_bytes
            ));
        }
        if !self.wall_time.is_finite() {
            return Err(format!(
                "a {} item of step {} has no finite time",
                self.kind().as_str(),
                self.step
            ));
        }
        let nul = |s: &str| s.contains('\0');
        match &self.body {
            ItemBody::Line { text, .. } => {
                if !self.key.is_empty() {
                    return Err("a console line has no key".into());
                }
                if nul(text) {
                    return Err(format!("a console line of step {} holds a NUL", self.step));
                }
            }
            ItemBody::Text(text) => {
                limits.check_name("a sample's key", &self.key)?;
                if self.key.is_empty() {
                    return Err("a text sample needs a key".into());
                }
                if nul(text) {
                    return Err(format!("text sample {:?} holds a NUL", self.key));
                }
            }
            ItemBody::Table { columns, rows } => {
                limits.check_name("a sample's key", &self.key)?;
                if self.key.is_empty() {
                    return Err("a table needs a key".into());
                }
                if columns.is_empty() {
                    return Err(format!("table {:?} has no columns", self.key));
                }
                if let Some((i, row)) = rows
                    .iter()
                    .enumerate()
                    .find(|(_, r)| r.len() != columns.len())
                {
                    return Err(format!(
                        "row {i} of table {:?} has {} cells; the table has {} columns",
                        self.key,
                        row.len(),
                        columns.len()
                    ));
                }
                let cells =
                    columns
                        .iter()
                        .map(String::as_str)
                        .chain(rows.iter().flatten().filter_map(|c| match c {
                            Cell::Text(t) => Some(t.as_str()),
                            Cell::Number(_) => None,
                        }));
                for c in cells {
                    if nul(c) {
                        return Err(format!("table {:?} holds a NUL", self.key));
                    }
                }
            }
            ItemBody::Histogram(h) => {
                limits.check_name("a sample's key", &self.key)?;
                if self.key.is_empty() {
                    return Err("a histogram needs a key".into());
                }
                if h.counts.is_empty() || h.counts.len() > MAX_BINS {
                    return Err(format!(
                        "histogram {:?} has {} bins; 1 to {MAX_BINS}",
                        self.key,
                        h.counts.len()
                    ));
                }
                let counts_ok = h
                    .counts
                    .iter()
                    .chain([&h.nan, &h.pos_inf, &h.neg_inf])
                    .all(|c| c.is_finite() && *c >= 0.0);
                if !counts_ok {
                    return Err(format!(
                        "histogram {:?} has a count that is negative or not finite",
                        self.key
                    ));
                }
                let total: f64 = h.counts.iter().sum();
                if total > 0.0 && !(h.lo.is_finite() && h.hi.is_finite() && h.lo <= h.hi) {
                    return Err(format!(
                        "histogram {:?} has no finite range ({} to {})",
                        self.key, h.lo, h.hi
                    ));
                }
            }
            ItemBody::Image(i) => {
                limits.check_name("a sample's key", &self.key)?;
                if self.key.is_empty() {
                    return Err("an image needs a key".into());
                }
                if nul(&i.caption) {
                    return Err(format!("image {:?}'s caption holds a NUL", self.key));
                }
                if i.width == 0 || i.height == 0 {
                    return Err(format!("image {:?} is empty", self.key));
                }
            }
        }
        Ok(())
    }
}

/// Bytes `items` add to an encoded batch, at most.
pub fn items_bytes(items: &[Item]) -> usize {
    items.iter().map(Item::wire_bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str, body: ItemBody) -> Item {
        Item {
            step: 3,
            wall_time: 1.0,
            key: key.into(),
            body,
        }
    }

    #[test]
    fn checks_name_what_is_wrong() {
        let limits = crate::Limits::default();
        let line = |t: &str| {
            item(
                "",
                ItemBody::Line {
                    stream: Stream::Stdout,
                    text: t.into(),
                },
            )
        };
        assert!(line("loss 1.2").check(&limits).is_ok());
        assert!(line("a\0b").check(&limits).unwrap_err().contains("NUL"));
        let huge = line(&"x".repeat(limits.item_bytes as usize + 1));
        assert!(huge.check(&limits).unwrap_err().contains("item_bytes"));
        let ragged = item(
            "gen",
            ItemBody::Table {
                columns: vec!["prompt".into(), "reward".into()],
                rows: vec![
                    vec![Cell::Text("hi".into()), Cell::Number(0.5)],
                    vec![Cell::Text("only one".into())],
                ],
            },
        );
        assert!(ragged.check(&limits).unwrap_err().contains("row 1"));
        assert!(item("", ItemBody::Text("t".into()))
            .check(&limits)
            .unwrap_err()
            .contains("key"));
        assert!(item("g\nen", ItemBody::Text("t".into()))
            .check(&limits)
            .is_err());
    }
}
