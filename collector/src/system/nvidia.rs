//! NVIDIA GPUs through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so` at run time): a
//! machine without the library or a GPU has no GPU metrics, and no error. One NVML handle for
//! the sampler's life, read from its one thread; no process is spawned per sample.

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;

pub struct Gpus {
    nvml: Nvml,
    count: u32,
}

impl Gpus {
    /// NVML and its devices, or `None` when there is none.
    pub fn open() -> Option<Gpus> {
        let nvml = Nvml::init().ok()?;
        let count = nvml.device_count().ok().filter(|&n| n > 0)?;
        Some(Gpus { nvml, count })
    }

    /// Per device: memory used and total (GB), utilisation (%), temperature (°C), power (W).
    pub fn sample(&self, out: &mut Vec<(String, f64)>) {
        for i in 0..self.count {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            if let Ok(m) = d.memory_info() {
                out.push((format!("gpu{i}/mem_used_gb"), m.used as f64 / 1e9));
                out.push((format!("gpu{i}/mem_total_gb"), m.total as f64 / 1e9));
            }
            if let Ok(u) = d.utilization_rates() {
                out.push((format!("gpu{i}/util_percent"), f64::from(u.gpu)));
            }
            if let Ok(t) = d.temperature(TemperatureSensor::Gpu) {
                out.push((format!("gpu{i}/temp_c"), f64::from(t)));
            }
            if let Ok(p) = d.power_usage() {
                out.push((format!("gpu{i}/power_w"), f64::from(p) / 1000.0));
            }
        }
    }
}
