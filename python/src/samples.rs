//! Samples handed to `Run.log` beside scalars: `stepstream.Text` and `stepstream.Table`
//! (Python objects with a `__stepstream_sample__` method), turned into the protocol's items.
//! A bad one (too big, a ragged table, a NUL) is a `UserWarning` naming what is wrong, and the
//! rest of the record is logged: a sample never stops a training.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt, PyString};
use stepstream_collector::image::RawImage;
use stepstream_protocol::{Cell, ImageFormat, ItemBody, Limits};

/// Whether `v` is a sample rather than a number or a tensor.
pub fn is_sample(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    v.hasattr(intern!(v.py(), "__stepstream_sample__"))
}

/// The sample's item body, or why it is not one.
pub fn body(key: &str, v: &Bound<'_, PyAny>) -> Result<ItemBody, String> {
    let py = v.py();
    let described = v
        .call_method0(intern!(py, "__stepstream_sample__"))
        .map_err(|e| format!("sample {key:?}: {e}"))?;
    let kind: String = described
        .get_item(0)
        .and_then(|k| k.extract())
        .map_err(|e| format!("sample {key:?}: {e}"))?;
    match kind.as_str() {
        "text" => {
            let text = described.get_item(1).map_err(|e| e.to_string())?;
            let text = text
                .downcast::<PyString>()
                .map_err(|_| format!("text sample {key:?} is not a str"))?;
            // Refused before copying: a 1 GB string is not copied to be refused.
            let len = text.len().map_err(|e| e.to_string())?;
            let most = Limits::default().item_bytes as usize;
            if len > most {
                return Err(format!(
                    "text sample {key:?} is {len} characters; a sample holds at most {most} bytes \
                     (limit item_bytes)"
                ));
            }
            Ok(ItemBody::Text(
                text.to_cow().map_err(|e| e.to_string())?.into_owned(),
            ))
        }
        "table" => {
            let columns: Vec<String> = described
                .get_item(1)
                .and_then(|c| c.extract())
                .map_err(|_| format!("table {key:?}: columns must be a list of str"))?;
            let rows = described.get_item(2).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            for (i, row) in rows
                .try_iter()
                .map_err(|_| format!("table {key:?}: rows must be a list of lists"))?
                .enumerate()
            {
                let row = row.map_err(|e| e.to_string())?;
                let mut cells = Vec::new();
                for cell in row
                    .try_iter()
                    .map_err(|_| format!("table {key:?}: row {i} is not a list"))?
                {
                    cells.push(cell_of(&cell.map_err(|e| e.to_string())?));
                }
                out.push(cells);
            }
            Ok(ItemBody::Table { columns, rows: out })
        }
        other => Err(format!("sample {key:?} of unknown kind {other:?}")),
    }
}

/// A table cell: numbers stay numbers (NaN included), anything else is its `str`.
fn cell_of(v: &Bound<'_, PyAny>) -> Cell {
    if v.downcast::<PyFloat>().is_ok() || v.downcast::<PyInt>().is_ok() {
        if let Ok(f) = v.extract::<f64>() {
            return Cell::Number(f);
        }
    }
    if let Ok(s) = v.downcast::<PyString>() {
        return Cell::Text(s.to_cow().map(|c| c.into_owned()).unwrap_or_default());
    }
    Cell::Text(v.str().map(|s| s.to_string()).unwrap_or_default())
}

/// A sample whose content is computed where its tensor lives (a histogram's pack): read
/// with the held records, many at once, not when logged.
pub fn pack_of<'py>(v: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    v.getattr(intern!(v.py(), "__stepstream_pack__")).ok()
}

/// A histogram from its pack read to the host: `[lo, hi, nan, +inf, -inf, counts...]`.
pub fn histogram(pack: &[f64]) -> Option<ItemBody> {
    let (head, counts) = pack.split_at_checked(5)?;
    Some(ItemBody::Histogram(stepstream_protocol::Histogram {
        lo: head[0],
        hi: head[1],
        nan: head[2],
        pos_inf: head[3],
        neg_inf: head[4],
        counts: counts.to_vec(),
    }))
}

/// Reads held packs to the host through `stepstream._tensors.to_lists` (one copy per device).
pub fn read_packs(py: Python<'_>, packs: &[&Py<PyAny>]) -> Vec<Option<Vec<f64>>> {
    if packs.is_empty() {
        return Vec::new();
    }
    let read = (|| -> PyResult<Vec<Option<Vec<f64>>>> {
        let list = pyo3::types::PyList::new(py, packs.iter().map(|o| o.bind(py)))?;
        py.import(intern!(py, "stepstream._tensors"))?
            .call_method1(intern!(py, "to_lists"), (list,))?
            .extract()
    })();
    match read {
        Ok(v) if v.len() == packs.len() => v,
        _ => vec![None; packs.len()],
    }
}

/// An image sample's pixels, or why it is not one; `None` for another kind of sample.
pub fn raw_image(key: &str, v: &Bound<'_, PyAny>) -> Option<Result<RawImage, String>> {
    let py = v.py();
    // Only images carry pixels: others' descriptions are read by `body`.
    if !v.hasattr(intern!(py, "pixels")).unwrap_or(false) {
        return None;
    }
    let read = || -> Result<RawImage, String> {
        let d = v
            .call_method0(intern!(py, "__stepstream_sample__"))
            .map_err(|e| format!("image {key:?}: {}", e.value(py)))?;
        let (_, pixels, width, height, channels, format, quality, caption): (
            String,
            Vec<u8>,
            u32,
            u32,
            u8,
            String,
            u8,
            String,
        ) = d.extract().map_err(|e| format!("image {key:?}: {e}"))?;
        Ok(RawImage {
            width,
            height,
            channels,
            pixels,
            format: ImageFormat::parse(&format)
                .ok_or_else(|| format!("image {key:?}: format {format:?}"))?,
            quality,
            caption,
        })
    };
    Some(read().and_then(|raw| {
        raw.check()
            .map(|()| raw)
            .map_err(|e| format!("image {key:?}: {e}"))
    }))
}

/// Says what is wrong with a sample without raising: a `UserWarning`.
pub fn warn(py: Python<'_>, why: &str) {
    let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
    let message = std::ffi::CString::new(format!("stepstream: {why}; the sample is not sent"))
        .unwrap_or_default();
    let _ = PyErr::warn(py, &category, &message, 1);
}
