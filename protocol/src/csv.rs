//! The metrics CSV shape both sides write (the collector's archive, the hub's export):
//! `step,timestamp,` then one column per metric; non-finite values as `nan`, `inf`, `-inf`;
//! an empty cell for a metric the step did not log. One header writer ([`header`]) and one
//! row writer ([`push_row`]) here, so the two cannot drift; `stepstream tail` reads it back
//! (`importers`' round-trip test).

/// Appends one row and its newline: the step, the wall time in seconds with six decimals,
/// then a cell per metric column (empty for `None`).
pub fn push_row(
    out: &mut String,
    step: i64,
    wall_time: f64,
    cells: impl IntoIterator<Item = Option<f64>>,
) {
    push_int(out, step);
    out.push(',');
    push_timestamp(out, wall_time);
    for cell in cells {
        out.push(',');
        if let Some(v) = cell {
            push_value(out, v);
        }
    }
    out.push('\n');
}

/// `n` in decimal, through `itoa` rather than `fmt` (this runs for every step).
fn push_int(out: &mut String, n: i64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Seconds with six decimals (`{:.6}`), by integer arithmetic for any time a clock gives.
fn push_timestamp(out: &mut String, t: f64) {
    let micros = (t * 1e6).round();
    if !(0.0..9.0e15).contains(&micros) {
        use std::fmt::Write;
        let _ = write!(out, "{t:.6}");
        return;
    }
    let micros = micros as i64;
    push_int(out, micros / 1_000_000);
    out.push('.');
    let mut digits = itoa::Buffer::new();
    let frac = digits.format(micros % 1_000_000);
    out.extend(std::iter::repeat_n('0', 6 - frac.len()));
    out.push_str(frac);
}

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

    #[test]
    fn rows() {
        let mut s = String::new();
        push_row(
            &mut s,
            -3,
            1_764_700_000.5,
            [Some(0.25), None, Some(f64::INFINITY)],
        );
        push_row(&mut s, 7, 1.0e-7, []);
        push_row(&mut s, 8, -1.5, [None]);
        assert_eq!(
            s,
            "-3,1764700000.500000,0.25,,inf\n7,0.000000\n8,-1.500000,\n"
        );
    }

    #[test]
    fn steps_and_timestamps_are_written_as_fmt_would() {
        for n in [0, 7, -7, 10, 1_000_000, i64::MAX, i64::MIN] {
            let mut s = String::new();
            push_int(&mut s, n);
            assert_eq!(s, n.to_string());
        }
        for t in [
            0.0,
            1.5,
            1_796_234_667.25,
            1_796_234_667.000_001,
            1_796_234_667.999_999_7,
            12.0,
        ] {
            let mut s = String::new();
            push_timestamp(&mut s, t);
            assert_eq!(s, format!("{t:.6}"), "{t}");
        }
        for t in [-1.5, 1e300, f64::NAN] {
            let mut s = String::new();
            push_timestamp(&mut s, t);
            assert_eq!(s, format!("{t:.6}"));
        }
    }
}
