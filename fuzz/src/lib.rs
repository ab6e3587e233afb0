//! Fuzz targets and a mutation runner that need only the stable toolchain.
//!
//! * [`frame`] — every direction's decoder on arbitrary bytes: never a panic, and whatever
//!   decodes re-encodes to bytes that decode to the same encoding.
//! * [`csv`] — the `stepstream tail` parser on an arbitrary header and lines.
//! * [`conversation`] — a collector's conversation with a real hub (a real SQLite store),
//!   built from arbitrary bytes with `arbitrary`: whatever the hub acknowledges stays
//!   readable, and its run summary agrees with what is stored.
//!
//! [`run`] mutates seeds (bit flips, byte edits, splices, interesting integers) with a fixed
//! seed per worker, calls a target under `catch_unwind`, and writes each input that panics to
//! `fuzz/regressions/<target>/`, which `fuzz/tests/regressions.rs` replays on every test run.

pub mod conversation;
mod mutate;

pub use mutate::run;

/// A fuzz target: an input, checked; a broken property panics.
pub type Target = fn(&[u8]);

/// The targets by name.
pub fn targets() -> [(&'static str, Target); 3] {
    [
        ("frame", frame),
        ("csv", csv),
        ("conversation", conversation::conversation),
    ]
}

/// Decodes `data` as each direction's message; what decodes must survive a round trip.
pub fn frame(data: &[u8]) {
    use stepstream_protocol::{FromHub, FromViewer, ToHub, ToViewer};
    macro_rules! round_trip {
        ($t:ty) => {
            if let Ok(m) = <$t>::decode(data) {
                let bytes = m.encode();
                let again = <$t>::decode(&bytes).expect("an encoded message decodes");
                assert_eq!(again.encode(), bytes, "a round trip changed the encoding");
            }
        };
    }
    round_trip!(ToHub);
    round_trip!(FromHub);
    round_trip!(FromViewer);
    round_trip!(ToViewer);
}

/// The first line is a header, the rest rows: the parser never panics, and a parsed row
/// names only columns of the header.
pub fn csv(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let Some(header) = lines.next() else { return };
    let Ok(parser) = stepstream_importers::tail::Parser::new(header) else {
        return;
    };
    for line in lines {
        if let Ok(row) = parser.row(line) {
            assert!(row
                .values
                .iter()
                .all(|&(i, _)| i < parser.columns.len() && parser.is_metric(i)));
            assert!(row.wall_time.is_none_or(f64::is_finite));
        }
    }
}

/// The seeds of a target, from the repository at `repo`: the golden frames (hex) for
/// `frame`, sample CSVs for `csv`, and fixed byte patterns for `conversation`, plus any
/// kept regressions.
pub fn seeds(repo: &std::path::Path, target: &str) -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    match target {
        "frame" => {
            if let Ok(dir) = std::fs::read_dir(repo.join("protocol/tests/golden")) {
                for entry in dir.flatten() {
                    let hex = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    let hex: String = hex.chars().filter(char::is_ascii_hexdigit).collect();
                    let bytes = (0..hex.len() / 2)
                        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                        .collect();
                    seeds.push(bytes);
                }
            }
        }
        "csv" => {
            seeds.push(
                b"step,timestamp,loss,lr,grad_norm,samples_per_sec\n1,1764700000.5,2.25,0.001,nan,inf\n\
                  2,2024-01-02 03:04:05.5,-inf,,1,2\n\"3\",\"1e9\",\"1,5\",x,,\n"
                    .to_vec(),
            );
            seeds.push(b"epoch,step,time,loss\n0,1,2026-12-03T10:00:00Z,1.0\n".to_vec());
        }
        _ => {
            seeds.push((0u8..=255).collect());
            seeds.push([0u8, 1, 2, 2, 0, 1, 2, 3].repeat(64));
            seeds.push(vec![0xff; 512]);
        }
    }
    if let Ok(dir) = std::fs::read_dir(repo.join("fuzz/regressions").join(target)) {
        for entry in dir.flatten() {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                seeds.push(bytes);
            }
        }
    }
    seeds
}
