//! System metrics sampled on their own thread: host CPU and memory through `sysinfo`, and
//! NVIDIA accelerators (memory, utilisation, temperature, power) through `nvidia-smi`, NVML's
//! command-line front end, when it is installed. Absent sources are skipped silently.

use crate::Collector;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Stops the sampler when dropped (its thread wakes at once: it waits on this channel).
pub struct Sampler {
    _stop: mpsc::Sender<()>,
}

/// Host CPU and memory, read through `sysinfo`.
struct Host {
    system: sysinfo::System,
}

impl Host {
    fn new() -> Host {
        let mut system = sysinfo::System::new();
        // CPU usage is a difference between two readings: take the first now.
        system.refresh_cpu_usage();
        Host { system }
    }

    /// `sys/cpu_percent` since the last sample, `sys/mem_used_gb`, `sys/mem_percent`.
    fn sample(&mut self, values: &mut Vec<(String, f64)>) {
        self.system.refresh_cpu_usage();
        self.system.refresh_memory();
        let cpu = f64::from(self.system.global_cpu_usage());
        if cpu.is_finite() {
            values.push(("sys/cpu_percent".into(), cpu));
        }
        let (used, total) = (
            self.system.used_memory() as f64,
            self.system.total_memory() as f64,
        );
        if total > 0.0 {
            values.push(("sys/mem_used_gb".into(), used / 1e9));
            values.push(("sys/mem_percent".into(), 100.0 * used / total));
        }
    }
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
    let (stop, stopped) = mpsc::channel::<()>();
    let has_nvidia = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let _ = std::thread::Builder::new()
        .name("stepstream-system".into())
        .spawn(move || {
            let mut host = Host::new();
            // Each wait ends at the next sample, or at once when the guard is dropped.
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let mut values: Vec<(String, f64)> = Vec::new();
                host.sample(&mut values);
                if has_nvidia {
                    values.extend(nvidia());
                }
                let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                if !refs.is_empty() {
                    collector.log_system(&refs);
                }
            }
        });
    Sampler { _stop: stop }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_metrics_read() {
        let mut host = Host::new();
        std::thread::sleep(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL);
        let mut values = Vec::new();
        host.sample(&mut values);
        let get = |k: &str| values.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let cpu = get("sys/cpu_percent").expect("cpu");
        assert!((0.0..=100.0).contains(&cpu), "{cpu}");
        let mem = get("sys/mem_percent").expect("memory");
        assert!(mem > 0.0 && mem < 100.0, "{mem}");
        assert!(get("sys/mem_used_gb").unwrap() > 0.0);
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
