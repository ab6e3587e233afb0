//! A run's console lines and samples as the store keeps them: one row per item in `items`,
//! apart from the records' blobs (so a run with many samples reads its charts as fast as
//! one without), written in the transaction of the batch that carried them. Console lines
//! are kept up to a per-run cap: the oldest go first, and the run's row counts every line
//! received, so a reader knows how many were dropped.

use serde::Serialize;
use stepstream_protocol::{Cell, Histogram, Image, ImageFormat, Item, ItemBody, ItemKind, Stream};

/// An item as stored and read back.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredItem {
    /// The batch that carried it, and its place there: `(seq, idx)` orders a run's items.
    pub seq: u64,
    pub idx: u32,
    #[serde(serialize_with = "kind_name")]
    pub kind: ItemKind,
    pub step: i64,
    pub wall_time: f64,
    /// A sample's key; empty for a console line.
    pub key: String,
    /// A console line's stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<&'static str>,
    /// A line's or a text's text; a table as JSON (`{"columns": [...], "rows": [[...]]}`).
    pub body: String,
}

fn kind_name<S: serde::Serializer>(kind: &ItemKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.as_str())
}

/// A stored stream code: 0 none, 1 stdout, 2 stderr.
pub(super) fn stream_code(stream: Option<Stream>) -> i64 {
    match stream {
        None => 0,
        Some(Stream::Stdout) => 1,
        Some(Stream::Stderr) => 2,
    }
}

pub(super) fn stream_of(code: i64) -> Option<&'static str> {
    match code {
        1 => Some("stdout"),
        2 => Some("stderr"),
        _ => None,
    }
}

/// What a row holds of an item: its kind, stream and body text.
pub(super) fn row_of(item: &Item) -> (i64, i64, String) {
    match &item.body {
        ItemBody::Line { stream, text } => (
            ItemKind::Line.code(),
            stream_code(Some(*stream)),
            text.clone(),
        ),
        ItemBody::Text(text) => (ItemKind::Text.code(), 0, text.clone()),
        ItemBody::Table { columns, rows } => {
            // Non-finite numbers have no JSON form: they are kept as their names.
            let cell = |c: &Cell| match c {
                Cell::Text(t) => serde_json::Value::from(t.as_str()),
                Cell::Number(n) if n.is_finite() => serde_json::Value::from(*n),
                Cell::Number(n) => serde_json::Value::from(n.to_string()),
            };
            let rows: Vec<Vec<serde_json::Value>> =
                rows.iter().map(|r| r.iter().map(cell).collect()).collect();
            let body = serde_json::json!({ "columns": columns, "rows": rows });
            (ItemKind::Table.code(), 0, body.to_string())
        }
        ItemBody::Histogram(h) => {
            let finite = |v: f64| v.is_finite().then_some(v);
            let body = serde_json::json!({
                "lo": finite(h.lo),
                "hi": finite(h.hi),
                "counts": h.counts,
                "nan": h.nan,
                "pos_inf": h.pos_inf,
                "neg_inf": h.neg_inf,
            });
            (ItemKind::Histogram.code(), 0, body.to_string())
        }
        ItemBody::Image(i) => {
            use base64::Engine;
            let body = serde_json::json!({
                "format": match i.format {
                    ImageFormat::Png => "png",
                    ImageFormat::Jpeg => "jpeg",
                },
                "width": i.width,
                "height": i.height,
                "caption": i.caption,
                "data": base64::engine::general_purpose::STANDARD.encode(&i.data),
            });
            (ItemKind::Image.code(), 0, body.to_string())
        }
    }
}

/// A stored image's JSON read back (its bytes decoded).
pub fn image_of(body: &str) -> Option<Image> {
    use base64::Engine;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(Image {
        format: ImageFormat::parse(v["format"].as_str()?)?,
        width: v["width"].as_u64()? as u32,
        height: v["height"].as_u64()? as u32,
        caption: v["caption"].as_str().unwrap_or("").to_string(),
        data: base64::engine::general_purpose::STANDARD
            .decode(v["data"].as_str()?)
            .ok()?,
    })
}

/// The bytes of the samples among `items` (all but console lines): what the sample quotas
/// count.
pub fn sample_bytes(items: &[Item]) -> u64 {
    items
        .iter()
        .filter(|i| !matches!(i.body, ItemBody::Line { .. }))
        .map(|i| i.content_bytes() as u64)
        .sum()
}

/// Console lines among `items`.
pub(super) fn lines_in(items: &[Item]) -> i64 {
    items
        .iter()
        .filter(|i| matches!(i.body, ItemBody::Line { .. }))
        .count() as i64
}

/// A stored kind code as a kind; a code this build does not know is a damaged row.
pub(super) fn kind_of(code: i64) -> super::Result<ItemKind> {
    ItemKind::from_code(code)
        .ok_or_else(|| super::StoreError::Schema(format!("an item of unknown kind {code}")))
}

/// Which of a run's items a read wants.
#[derive(Clone, Debug)]
pub struct ItemQuery {
    /// Only this kind; any when `None`.
    pub kind: Option<ItemKind>,
    /// Only this key (samples); any when `None`.
    pub key: Option<String>,
    /// Steps `lo..=hi`.
    pub steps: (i64, i64),
    /// Batches `after < seq <= through`.
    pub seqs: (u64, u64),
    /// Newest first (a console's tail); else oldest first.
    pub newest_first: bool,
}

impl ItemQuery {
    /// Every item of the batches `after < seq <= through`, in order.
    pub fn batches(after: u64, through: u64) -> ItemQuery {
        ItemQuery {
            kind: None,
            key: None,
            steps: (i64::MIN, i64::MAX),
            seqs: (after, through),
            newest_first: false,
        }
    }

    /// The console lines at steps `lo..=hi`.
    pub fn console(steps: (i64, i64), newest_first: bool) -> ItemQuery {
        ItemQuery {
            kind: Some(ItemKind::Line),
            key: None,
            steps,
            seqs: (0, u64::MAX),
            newest_first,
        }
    }

    /// The samples of `key`, or of every key (all kinds but console lines are keyed).
    pub fn samples(key: Option<String>, steps: (i64, i64), newest_first: bool) -> ItemQuery {
        ItemQuery {
            kind: None,
            key,
            steps,
            seqs: (0, u64::MAX),
            newest_first,
        }
    }
}

impl StoredItem {
    /// The item as the wire carries it (a table's JSON read back into cells).
    pub fn to_item(&self) -> Item {
        let body = match self.kind {
            ItemKind::Histogram => ItemBody::Histogram(histogram_of(&self.body)),
            ItemKind::Image => ItemBody::Image(image_of(&self.body).unwrap_or(Image {
                format: ImageFormat::Png,
                width: 0,
                height: 0,
                caption: String::new(),
                data: Vec::new(),
            })),
            ItemKind::Line => ItemBody::Line {
                stream: self
                    .stream
                    .and_then(Stream::parse)
                    .unwrap_or(Stream::Stdout),
                text: self.body.clone(),
            },
            ItemKind::Text => ItemBody::Text(self.body.clone()),
            ItemKind::Table => {
                let v: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_default();
                let strings = |v: &serde_json::Value| -> Vec<String> {
                    v.as_array()
                        .map(|a| {
                            a.iter()
                                .map(|c| c.as_str().unwrap_or("").to_string())
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let cell = |c: &serde_json::Value| match c {
                    serde_json::Value::Number(n) => Cell::Number(n.as_f64().unwrap_or(f64::NAN)),
                    serde_json::Value::String(s) => Cell::Text(s.clone()),
                    other => Cell::Text(other.to_string()),
                };
                ItemBody::Table {
                    columns: strings(&v["columns"]),
                    rows: v["rows"]
                        .as_array()
                        .map(|rows| {
                            rows.iter()
                                .map(|r| {
                                    r.as_array()
                                        .map(|r| r.iter().map(cell).collect())
                                        .unwrap_or_default()
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                }
            }
        };
        Item {
            step: self.step,
            wall_time: self.wall_time,
            key: self.key.clone(),
            body,
        }
    }
}

fn histogram_of(body: &str) -> Histogram {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let num = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let count = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Histogram {
        lo: num("lo"),
        hi: num("hi"),
        counts: v["counts"]
            .as_array()
            .map(|a| a.iter().map(|c| c.as_f64().unwrap_or(0.0)).collect())
            .unwrap_or_default(),
        nan: count("nan"),
        pos_inf: count("pos_inf"),
        neg_inf: count("neg_inf"),
    }
}
