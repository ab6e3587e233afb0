//! System metrics sampled on their own thread: host CPU and memory through `sysinfo`,
//! NVIDIA GPUs through NVML (`nvidia`), Ascend NPUs through `npu-smi` (`ascend`). A source
//! that is absent (no library, no device, no tool) is skipped silently: no metrics, no error.

mod ascend;
mod nvidia;

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

/// Samples every `every` into `collector` until the returned guard is dropped.
pub fn start(collector: Arc<Collector>, every: Duration) -> Sampler {
    let (stop, stopped) = mpsc::channel::<()>();
    let _ = std::thread::Builder::new()
        .name("stepstream-system".into())
        .spawn(move || {
            let mut host = Host::new();
            // Probed once, on this thread: NVML is used from the thread that opened it.
            let gpus = nvidia::Gpus::open();
            let npus = ascend::present();
            // Each wait ends at the next sample, or at once when the guard is dropped.
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let mut values: Vec<(String, f64)> = Vec::new();
                host.sample(&mut values);
                if let Some(g) = &gpus {
                    g.sample(&mut values);
                }
                if npus {
                    values.extend(ascend::sample());
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
    fn gpus_without_nvml_are_none_and_with_it_are_read() {
        let gpus = nvidia::Gpus::open();
        let lib = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so"))
            .unwrap_or(false);
        match gpus {
            None => assert!(!lib || !std::path::Path::new("/dev/nvidiactl").exists()),
            Some(g) => {
                let mut values = Vec::new();
                g.sample(&mut values);
                let total = values.iter().find(|(k, _)| k == "gpu0/mem_total_gb");
                assert!(total.is_some_and(|(_, v)| *v > 0.0), "{values:?}");
            }
        }
    }
}
