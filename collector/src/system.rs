//! System metrics sampled on their own thread: host CPU and memory from `/proc`, and NVIDIA
//! accelerators (memory, utilisation, temperature, power) through `nvidia-smi`, NVML's
//! command-line front end, when it is installed. Absent sources are skipped silently.

use crate::Collector;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Stops the sampler when dropped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `(busy, total)` jiffies of all CPUs.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0);
    let total: u64 = v.iter().take(8).sum();
    Some((total - idle, total))
}

/// `(used, total)` bytes of host memory.
fn memory() -> Option<(f64, f64)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? * 1024.0)
    };
    let total = field("MemTotal:")?;
    Some((total - field("MemAvailable:")?, total))
}

/// One line per GPU: index, memory used and total (MiB), utilisation %, temperature °C, power W.
fn nvidia() -> Vec<(String, f64)> {
    let Ok(out) = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw",
            "--format=csv,noheader,nounits",
        ])
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    if !out.status.success() {
        return Vec::new();
    }
    parse_nvidia(&String::from_utf8_lossy(&out.stdout))
}

fn parse_nvidia(text: &str) -> Vec<(String, f64)> {
    let mut values = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let Some(index) = cells.first() else { continue };
        let names = [
            "mem_used_gb",
            "mem_total_gb",
            "util_percent",
            "temp_c",
            "power_w",
        ];
        for (i, name) in names.iter().enumerate() {
            if let Some(v) = cells.get(i + 1).and_then(|c| c.parse::<f64>().ok()) {
                let v = if i < 2 { v / 1024.0 } else { v };
                values.push((format!("gpu{index}/{name}"), v));
            }
        }
    }
    values
}

/// Samples every `every` into `collector` until the returned guard is dropped.
pub fn start(collector: Arc<Collector>, every: Duration) -> Sampler {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let has_nvidia = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let _ = std::thread::Builder::new()
        .name("stepstream-system".into())
        .spawn(move || {
            let mut last_cpu = cpu_times();
            let tick = Duration::from_millis(100);
            'outer: loop {
                let mut waited = Duration::ZERO;
                while waited < every {
                    if flag.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    std::thread::sleep(tick);
                    waited += tick;
                }
                let mut values: Vec<(String, f64)> = Vec::new();
                if let (Some((b0, t0)), Some((b1, t1))) = (last_cpu, cpu_times()) {
                    if t1 > t0 {
                        values.push((
                            "sys/cpu_percent".into(),
                            100.0 * (b1 - b0) as f64 / (t1 - t0) as f64,
                        ));
                    }
                }
                last_cpu = cpu_times();
                if let Some((used, total)) = memory() {
                    values.push(("sys/mem_used_gb".into(), used / 1e9));
                    values.push(("sys/mem_percent".into(), 100.0 * used / total));
                }
                if has_nvidia {
                    values.extend(nvidia());
                }
                let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                if !refs.is_empty() {
                    collector.log_system(&refs);
                }
            }
        });
    Sampler { stop }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_metrics_read() {
        let (busy, total) = cpu_times().expect("/proc/stat");
        assert!(busy <= total && total > 0);
        let (used, total) = memory().expect("/proc/meminfo");
        assert!(used > 0.0 && used < total);
    }

    #[test]
    fn nvidia_smi_output_parses() {
        let v = parse_nvidia("0, 1024, 81920, 37, 45, 120.5\n1, 2048, 81920, [N/A], 50, 130\n");
        assert!(v.contains(&("gpu0/mem_used_gb".to_string(), 1.0)));
        assert!(v.contains(&("gpu0/power_w".to_string(), 120.5)));
        assert!(
            !v.iter().any(|(k, _)| k == "gpu1/util_percent"),
            "N/A is skipped"
        );
        assert!(v.contains(&("gpu1/temp_c".to_string(), 50.0)));
    }
}
