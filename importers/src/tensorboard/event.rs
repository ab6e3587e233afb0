//! The parts of TensorFlow's `Event` protobuf that carry scalars, decoded with `prost`
//! (field numbers from `event.proto`, `summary.proto` and `tensor.proto`).
//!
//! A scalar is either a `simple_value` (tensorboardX, PyTorch's `SummaryWriter`, MindFormers,
//! TF1) or a one-element `tensor` (TF2's `tf.summary.scalar`, plugin `scalars`): float,
//! double, int32, int64 or half, in its typed field or its `tensor_content` bytes.

use prost::Message;
use stepstream_protocol::{Histogram, Image, ImageFormat, ItemBody};

/// Equal bins a TensorBoard histogram is re-binned into.
pub const HISTOGRAM_BINS: usize = 30;

/// A TensorBoard histogram (buckets of unequal widths, right edges `bucket_limit`, the first
/// starting at `min`) as `bins` equal bins over `min..=max`: each bucket's count is shared by
/// the bins its (clipped) range overlaps, in proportion.
pub fn rebin(h: &TbHistogram, bins: usize) -> Histogram {
    let (lo, hi) = (h.min, h.max);
    let mut counts = vec![0.0; bins];
    let width = (hi - lo) / bins as f64;
    let mut left = lo;
    for (&right, &count) in h.bucket_limit.iter().zip(&h.bucket) {
        let (a, b) = (left.max(lo), right.min(hi));
        left = right;
        if count <= 0.0 || !(count.is_finite()) {
            continue;
        }
        if width <= 0.0 || width.is_nan() || b <= a {
            // All values equal (or a bucket reduced to a point): its count at its place.
            let at = if width > 0.0 {
                ((a - lo) / width) as usize
            } else {
                0
            };
            counts[at.min(bins - 1)] += count;
            continue;
        }
        let first = (((a - lo) / width) as usize).min(bins - 1);
        let last = (((b - lo) / width) as usize).min(bins - 1);
        for (i, slot) in counts.iter_mut().enumerate().take(last + 1).skip(first) {
            let (x0, x1) = (lo + width * i as f64, lo + width * (i + 1) as f64);
            let overlap = (b.min(x1) - a.max(x0)).max(0.0);
            *slot += count * overlap / (b - a);
        }
    }
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    };
    Histogram {
        lo,
        hi,
        counts,
        nan: 0.0,
        pos_inf: 0.0,
        neg_inf: 0.0,
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    #[prost(message, optional, tag = "4")]
    pub image: Option<TbImage>,
    #[prost(message, optional, tag = "5")]
    pub histo: Option<TbHistogram>,
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<Tensor>,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<Metadata>,
}

impl Value {
    /// The plugin that wrote the value (`scalars`, `text`...), when its metadata says.
    fn plugin(&self) -> Option<&str> {
        self.metadata
            .as_ref()
            .and_then(|m| m.plugin_data.as_ref())
            .map(|p| p.plugin_name.as_str())
    }
}

/// `Summary.Image`: an encoded picture (PNG or JPEG) and its size.
#[derive(Clone, PartialEq, Message)]
pub struct TbImage {
    #[prost(int32, tag = "1")]
    pub height: i32,
    #[prost(int32, tag = "2")]
    pub width: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub encoded: Vec<u8>,
}

/// `HistogramProto`: buckets with right edges `bucket_limit` (the first from `min`).
#[derive(Clone, PartialEq, Message)]
pub struct TbHistogram {
    #[prost(double, tag = "1")]
    pub min: f64,
    #[prost(double, tag = "2")]
    pub max: f64,
    #[prost(double, repeated, tag = "6")]
    pub bucket_limit: Vec<f64>,
    #[prost(double, repeated, tag = "7")]
    pub bucket: Vec<f64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Metadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Tensor {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<Shape>,
    #[prost(bytes = "vec", tag = "4")]
    pub content: Vec<u8>,
    #[prost(float, repeated, tag = "5")]
    pub float_val: Vec<f32>,
    #[prost(double, repeated, tag = "6")]
    pub double_val: Vec<f64>,
    #[prost(int32, repeated, tag = "7")]
    pub int_val: Vec<i32>,
    #[prost(int64, repeated, tag = "10")]
    pub int64_val: Vec<i64>,
    #[prost(int32, repeated, tag = "13")]
    pub half_val: Vec<i32>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Shape {
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<Dim>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Dim {
    #[prost(int64, tag = "1")]
    pub size: i64,
}

const DT_FLOAT: i32 = 1;
const DT_DOUBLE: i32 = 2;
const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;
const DT_HALF: i32 = 19;

fn half(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

impl Tensor {
    /// The value of a one-element tensor.
    pub fn scalar(&self) -> Option<f64> {
        // Checked: a damaged (or hostile) shape's product overflows i64, which would panic
        // (debug) or wrap around to 1 (release).
        let elements = self.shape.as_ref().map_or(Some(1i64), |s| {
            s.dim.iter().try_fold(1i64, |n, d| n.checked_mul(d.size))
        });
        if elements != Some(1) {
            return None;
        }
        let c = &self.content;
        match self.dtype {
            DT_FLOAT => self
                .float_val
                .first()
                .map(|&v| f64::from(v))
                .or_else(|| Some(f64::from(f32::from_le_bytes(c.get(..4)?.try_into().ok()?)))),
            DT_DOUBLE => self
                .double_val
                .first()
                .copied()
                .or_else(|| Some(f64::from_le_bytes(c.get(..8)?.try_into().ok()?))),
            DT_INT32 => self
                .int_val
                .first()
                .map(|&v| f64::from(v))
                .or_else(|| Some(f64::from(i32::from_le_bytes(c.get(..4)?.try_into().ok()?)))),
            DT_INT64 => self
                .int64_val
                .first()
                .map(|&v| v as f64)
                .or_else(|| Some(i64::from_le_bytes(c.get(..8)?.try_into().ok()?) as f64)),
            DT_HALF => self
                .half_val
                .first()
                .map(|&v| half(v as u16))
                .or_else(|| Some(half(u16::from_le_bytes(c.get(..2)?.try_into().ok()?)))),
            _ => None,
        }
    }
}

impl Event {
    /// The event's scalars, `(tag, value)`.
    pub fn scalars(&self) -> Vec<(&str, f64)> {
        let Some(summary) = &self.summary else {
            return Vec::new();
        };
        summary
            .value
            .iter()
            .filter_map(|v| {
                let value = match (&v.simple_value, &v.tensor) {
                    (Some(s), _) => f64::from(*s),
                    (None, Some(t)) => {
                        // TF2 scalars say so; other one-element tensors (text, say) are not.
                        if !matches!(v.plugin(), Some("scalars") | None) {
                            return None;
                        }
                        t.scalar()?
                    }
                    _ => return None,
                };
                Some((v.tag.as_str(), value))
            })
            .collect()
    }

    /// The event's samples, `(tag, body)`: text summaries (plugin `text`: the strings of
    /// the tensor, one per line), images, and histograms (re-binned into equal bins over
    /// `min..=max`, each bucket's count shared by the bins it overlaps).
    pub fn samples(&self) -> Vec<(&str, ItemBody)> {
        let Some(summary) = &self.summary else {
            return Vec::new();
        };
        summary
            .value
            .iter()
            .filter_map(|v| {
                let body = if let Some(img) = &v.image {
                    let format = if img.encoded.starts_with(&[0xff, 0xd8]) {
                        ImageFormat::Jpeg
                    } else {
                        ImageFormat::Png
                    };
                    ItemBody::Image(Image {
                        format,
                        width: img.width.max(0) as u32,
                        height: img.height.max(0) as u32,
                        caption: String::new(),
                        data: img.encoded.clone(),
                    })
                } else if let Some(h) = &v.histo {
                    ItemBody::Histogram(rebin(h, HISTOGRAM_BINS))
                } else if let (Some("text"), Some(t)) = (v.plugin(), &v.tensor) {
                    let lines: Vec<String> = t
                        .string_val
                        .iter()
                        .map(|s| String::from_utf8_lossy(s).replace('\0', "\u{fffd}"))
                        .collect();
                    // tensorboardX names a text summary `<tag>/text_summary`.
                    let key = v.tag.strip_suffix("/text_summary").unwrap_or(&v.tag);
                    return Some((key, ItemBody::Text(lines.join("\n"))));
                } else {
                    return None;
                };
                Some((v.tag.as_str(), body))
            })
            .collect()
    }

    pub fn decode_bytes(bytes: &[u8]) -> Result<Event, prost::DecodeError> {
        Event::decode(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by review: 2^32 x 2^32 x 1 overflowed the product.
    #[test]
    fn a_shape_whose_product_overflows_is_no_scalar() {
        let t = Tensor {
            dtype: DT_FLOAT,
            float_val: vec![1.0],
            shape: Some(Shape {
                dim: [1i64 << 32, 1 << 32, 1]
                    .into_iter()
                    .map(|size| Dim { size })
                    .collect(),
            }),
            ..Default::default()
        };
        assert_eq!(t.scalar(), None);
    }

    #[test]
    fn simple_and_tensor_scalars() {
        let e = Event {
            wall_time: 1.5,
            step: 7,
            summary: Some(Summary {
                value: vec![
                    Value {
                        tag: "loss".into(),
                        simple_value: Some(0.25),
                        ..Default::default()
                    },
                    Value {
                        tag: "tf2/acc".into(),
                        tensor: Some(Tensor {
                            dtype: DT_FLOAT,
                            content: 0.75f32.to_le_bytes().to_vec(),
                            ..Default::default()
                        }),
                        metadata: Some(Metadata {
                            plugin_data: Some(PluginData {
                                plugin_name: "scalars".into(),
                            }),
                        }),
                        ..Default::default()
                    },
                    Value {
                        tag: "text".into(),
                        tensor: Some(Tensor {
                            dtype: DT_FLOAT,
                            float_val: vec![1.0],
                            ..Default::default()
                        }),
                        metadata: Some(Metadata {
                            plugin_data: Some(PluginData {
                                plugin_name: "text".into(),
                            }),
                        }),
                        ..Default::default()
                    },
                    Value {
                        tag: "tf2/double".into(),
                        tensor: Some(Tensor {
                            dtype: DT_DOUBLE,
                            double_val: vec![0.125],
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
            }),
        };
        let back = Event::decode_bytes(&e.encode_to_vec()).unwrap();
        assert_eq!(back.step, 7);
        assert_eq!(
            back.scalars(),
            vec![("loss", 0.25), ("tf2/acc", 0.75), ("tf2/double", 0.125)]
        );
    }

    #[test]
    fn tensorboard_buckets_are_shared_by_the_equal_bins_they_overlap() {
        let h = TbHistogram {
            min: 0.0,
            max: 4.0,
            bucket_limit: vec![1.0, 4.0, f64::MAX],
            bucket: vec![2.0, 6.0, 0.0],
        };
        let r = rebin(&h, 4);
        assert_eq!((r.lo, r.hi), (0.0, 4.0));
        assert_eq!(r.counts, [2.0, 2.0, 2.0, 2.0]);
        // All values equal: one bin holds them, around the value.
        let same = TbHistogram {
            min: 3.0,
            max: 3.0,
            bucket_limit: vec![3.0],
            bucket: vec![5.0],
        };
        let r = rebin(&same, 4);
        assert_eq!(r.counts.iter().sum::<f64>(), 5.0);
        assert_eq!((r.lo, r.hi), (2.5, 3.5));
    }

    #[test]
    fn half_floats() {
        assert_eq!(half(0x3c00), 1.0);
        assert_eq!(half(0xc000), -2.0);
        assert!(half(0x7e00).is_nan());
        assert_eq!(half(0x7c00), f64::INFINITY);
    }
}
