//! The metrics CSV shape both sides write (the collector's archive, the hub's export):
//! `step,timestamp,` then one column per metric; non-finite values as `nan`, `inf`, `-inf`;
//! an empty cell for a metric the step did not log. Kept here so the two cannot drift.

/// Appends one value cell: the shortest text that reads back as the same `f64` (`ryu`, a
/// few times faster than `{}`; this runs for every value of every step), `3` rather than
/// `3.0`, and `nan`, `inf`, `-inf`.
pub fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("nan");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
    } else {
        let mut buf = ryu::Buffer::new();
        let text = buf.format_finite(v);
        out.push_str(text.strip_suffix(".0").unwrap_or(text));
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
        // Every finite value reads back exactly.
        for v in [
            1e-7,
            -2.5e300,
            123456789.125,
            5e-324,
            f64::MAX,
            -0.0,
            0.30000000000000004,
        ] {
            let mut s = String::new();
            push_value(&mut s, v);
            assert_eq!(s.parse::<f64>().unwrap().to_bits(), v.to_bits(), "{s}");
        }
        assert_eq!(header(["loss", "a,b"]), "step,timestamp,loss,\"a,b\"\n");
    }
}
