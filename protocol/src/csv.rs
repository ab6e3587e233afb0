//! The metrics CSV shape both sides write (the collector's archive, the hub's export):
//! `step,timestamp,` then one column per metric; non-finite values as `nan`, `inf`, `-inf`;
//! an empty cell for a metric the step did not log. Kept here so the two cannot drift.

use std::fmt::Write;

/// Appends one value cell.
pub fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("nan");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// A header field, quoted when it must be.
pub fn field(name: &str) -> String {
    if name.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", name.replace('"', "\"\""))
    } else {
        name.to_string()
    }
}

/// The header line for these metric names, with its newline.
pub fn header<'a>(metrics: impl IntoIterator<Item = &'a str>) -> String {
    let mut h = String::from("step,timestamp");
    for m in metrics {
        h.push(',');
        h.push_str(&field(m));
    }
    h.push('\n');
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_and_header() {
        let mut s = String::new();
        for v in [0.1, f64::NAN, f64::NEG_INFINITY, 3.0] {
            push_value(&mut s, v);
            s.push(',');
        }
        assert_eq!(s, "0.1,nan,-inf,3,");
        assert_eq!(header(["loss", "a,b"]), "step,timestamp,loss,\"a,b\"\n");
    }
}
