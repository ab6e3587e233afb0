//! Ascend NPUs through `npu-smi info`: one invocation per sample, its table read by the
//! column names its header gives (the 24.x layout and the wider 25.x/26.x one differ in
//! widths and in what follows, not in names), so a layout with other columns still yields
//! the ones it has. Per chip: HBM used and total, AI Core utilisation, temperature, power.

/// `npu-smi info` now, parsed; empty when there is no `npu-smi` or it fails.
pub fn sample() -> Vec<(String, f64)> {
    let Ok(out) = std::process::Command::new("npu-smi")
        .arg("info")
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    if !out.status.success() {
        return Vec::new();
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Whether `npu-smi` answers here.
pub fn present() -> bool {
    std::process::Command::new("npu-smi")
        .arg("info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The cells of a table row: its `|`-separated segments, each split into values, with
/// `a / b` pairs kept together as one `a/b` value.
fn cells(line: &str) -> Option<Vec<Vec<String>>> {
    let line = line.trim();
    let inner = line.strip_prefix('|')?.strip_suffix('|')?;
    Some(
        inner
            .split('|')
            .map(|seg| {
                let joined = seg.replace(" /", "/").replace("/ ", "/");
                let mut joined = joined;
                while joined.contains(" /") || joined.contains("/ ") {
                    joined = joined.replace(" /", "/").replace("/ ", "/");
                }
                joined.split_whitespace().map(String::from).collect()
            })
            .collect(),
    )
}

fn number(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// `used/total` as numbers.
fn pair(s: &str) -> Option<(f64, f64)> {
    let (a, b) = s.split_once('/')?;
    Some((number(a)?, number(b)?))
}

pub fn parse(text: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    // The two header rows' third segment: the names of the values under them.
    let mut first_names: Vec<String> = Vec::new();
    let mut second_names: Vec<String> = Vec::new();
    let mut pending: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let Some(segs) = cells(line) else { continue };
        if segs.len() < 3 {
            continue;
        }
        let head = segs[0].first().map(String::as_str).unwrap_or("");
        if head == "NPU" && segs[1].first().map(String::as_str) == Some("Health") {
            first_names = segs[2].clone();
            continue;
        }
        if head == "NPU" || segs.iter().flatten().any(|c| c == "Process") {
            // The process table: the chips are done.
            if !first_names.is_empty() && segs.iter().flatten().any(|c| c.starts_with("Process")) {
                break;
            }
            continue;
        }
        if head == "Chip" {
            second_names = segs[2].clone();
            continue;
        }
        match pending.take() {
            None => {
                // A card's first row: its id, name, health; power, temperature, ...
                if number(head).is_some() && segs[0].len() >= 2 {
                    pending = Some((head.to_string(), segs[2].clone()));
                }
            }
            Some((npu, first_values)) => {
                let chip = head.to_string();
                let prefix = if chip == "0" {
                    format!("npu{npu}")
                } else {
                    format!("npu{npu}_{chip}")
                };
                let rows = [(&first_names, &first_values), (&second_names, &segs[2])];
                for (names, values) in rows {
                    for (name, value) in names.iter().zip(values.iter()) {
                        let key = name.split('(').next().unwrap_or("").to_ascii_lowercase();
                        match key.as_str() {
                            "power" => {
                                number(value).map(|v| out.push((format!("{prefix}/power_w"), v)))
                            }
                            "temp" => {
                                number(value).map(|v| out.push((format!("{prefix}/temp_c"), v)))
                            }
                            "aicore" => number(value)
                                .map(|v| out.push((format!("{prefix}/aicore_percent"), v))),
                            "hbm-usage" => pair(value).map(|(u, t)| {
                                out.push((format!("{prefix}/hbm_used_gb"), u / 1024.0));
                                out.push((format!("{prefix}/hbm_total_gb"), t / 1024.0));
                            }),
                            "memory-usage" => {
                                pair(value).filter(|&(_, t)| t > 0.0).map(|(u, t)| {
                                    out.push((format!("{prefix}/mem_used_gb"), u / 1024.0));
                                    out.push((format!("{prefix}/mem_total_gb"), t / 1024.0));
                                })
                            }
                            _ => None,
                        };
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // `npu-smi info` as the 24.x driver prints it on an Atlas 800T A2 (910B3).
    const V24: &str = "\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc2                 Version: 24.1.rc2                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 121.6       40                0    / 0             |
| 0                         | 0000:C1:00.0  | 10          0    / 0          57895/ 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 92.0        39                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3314 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 1712733       | python3                  | 54573                   |
+===========================+===============+====================================================+
";

    // The wider layout of later drivers (26.x): wider value columns, a process table with
    // a container column.
    const V26: &str = "\
+--------------------------------------------------------------------------------------------------------+
| npu-smi 26.0.rc1                     Version: 26.0.rc1                                                 |
+---------------------------+---------------+------------------------------------------------------------+
| NPU   Name                | Health        | Power(W)             Temp(C)                 Hugepages-Usage(page)   |
| Chip                      | Bus-Id        | AICore(%)            Memory-Usage(MB)        HBM-Usage(MB)           |
+===========================+===============+============================================================+
| 4     910B3               | OK            | 90.7                 37                      0    / 0                |
| 0                         | 0000:C1:00.0  | 7                    0    / 0                53984/ 65536            |
+===========================+===============+============================================================+
| NPU     Chip              | Process id    | Process name       | Process memory(MB)    | Process id in container |
| 4       0                 | 1712733       | python3            | 51200                 | 88                      |
";

    fn get(v: &[(String, f64)], k: &str) -> f64 {
        v.iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("{k} in {v:?}"))
            .1
    }

    #[test]
    fn the_24_layout() {
        let v = parse(V24);
        assert_eq!(get(&v, "npu0/power_w"), 121.6);
        assert_eq!(get(&v, "npu0/temp_c"), 40.0);
        assert_eq!(get(&v, "npu0/aicore_percent"), 10.0);
        assert_eq!(get(&v, "npu0/hbm_used_gb"), 57895.0 / 1024.0);
        assert_eq!(get(&v, "npu0/hbm_total_gb"), 64.0);
        assert_eq!(get(&v, "npu1/hbm_used_gb"), 3314.0 / 1024.0);
        assert!(
            !v.iter().any(|(k, _)| k.contains("mem_")),
            "0 / 0 DDR is not a metric"
        );
        assert_eq!(v.len(), 10, "two chips, five values each: {v:?}");
    }

    #[test]
    fn the_26_layout() {
        let v = parse(V26);
        assert_eq!(get(&v, "npu4/power_w"), 90.7);
        assert_eq!(get(&v, "npu4/aicore_percent"), 7.0);
        assert_eq!(get(&v, "npu4/hbm_used_gb"), 53984.0 / 1024.0);
        assert_eq!(v.len(), 5, "the process table is not a chip: {v:?}");
    }

    #[test]
    fn no_table_no_values() {
        assert!(parse("").is_empty());
        assert!(parse("dcmi module initialize failed. ret is -8005\n").is_empty());
    }
}
