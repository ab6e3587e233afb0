//! Which charts the page draws for a set of metric names, and in which group: training
//! (loss, perplexity, lr, grad norm, loss scale), speed (step time, samples/s, tokens/s,
//! data wait), system (one chart per quantity, one line per accelerator: `gpu0/mem_used_gb`
//! and `gpu1/mem_used_gb` share the chart `gpu*/mem_used_gb`), and the rest.

/// A group of charts, collapsible on the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    Training,
    Speed,
    System,
    Other,
    /// Per-layer families (`grad_norm/<layer>`...): drawn as heatmaps, their charts folded.
    Layers,
}

/// The prefixes of per-layer metric families (as `stepstream.torch.watch` logs them).
pub const LAYER_FAMILIES: [&str; 4] = [
    "grad_norm/",
    "weight_norm/",
    "update_ratio/",
    "activation_norm/",
];

impl Group {
    pub const ALL: [Group; 5] = [
        Group::Training,
        Group::Speed,
        Group::System,
        Group::Other,
        Group::Layers,
    ];

    pub fn code(self) -> &'static str {
        match self {
            Group::Training => "training",
            Group::Speed => "speed",
            Group::System => "system",
            Group::Other => "other",
            Group::Layers => "layers",
        }
    }
}

/// One chart: its key (a metric name, or `gpu*/QUANTITY` for per-device metrics) and the
/// metrics drawn on it, each with the device it stands for (empty for a plain metric).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartSpec {
    pub key: String,
    pub group: Group,
    pub metrics: Vec<(String, String)>,
}

/// Whether a metric counts what training consumed (tokens, samples, epochs, FLOPs): the x
/// a run is compared at across batch sizes, offered first on the x axis. Rates are not.
pub fn is_count(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let rate = ["per_sec", "per_second", "/s", "throughput", "_rate"]
        .iter()
        .any(|r| n.contains(r));
    let count = [
        "token", "sample", "epoch", "consumed", "flop", "seen", "images",
    ]
    .iter()
    .any(|c| n.contains(c));
    count && !rate
}

/// The metrics the x axis offers: counts first, then the others (per-layer ones aside,
/// being hundreds), each sorted.
pub fn x_candidates(charts: &[ChartSpec]) -> (Vec<String>, Vec<String>) {
    let mut names: Vec<String> = charts
        .iter()
        .filter(|s| s.group != Group::Layers)
        .flat_map(|s| s.metrics.iter().map(|(m, _)| m.clone()))
        .collect();
    names.sort();
    names.dedup();
    names.into_iter().partition(|n| is_count(n))
}

const TRAINING: [&str; 9] = [
    "loss",
    "ppl",
    "perplexity",
    "lr",
    "learning_rate",
    "grad_norm",
    "loss_scale",
    "epoch",
    "overflow",
];
const SPEED: [&str; 8] = [
    "step_time",
    "samples_per_sec",
    "tokens_per_sec",
    "data_wait",
    "data_time",
    "throughput",
    "tokens_seen",
    "step_time_ms",
];

/// `("gpu", "0", "mem_used_gb")` for `gpu0/mem_used_gb`.
fn device_metric(name: &str) -> Option<(&str, &str, &str)> {
    let (dev, quantity) = name.split_once('/')?;
    let digits = dev.trim_start_matches(|c: char| c.is_ascii_alphabetic());
    let kind = &dev[..dev.len() - digits.len()];
    (!kind.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then_some((kind, digits, quantity))
}

fn group_of(name: &str) -> Group {
    let base = name.rsplit('/').next().unwrap_or(name);
    if LAYER_FAMILIES.iter().any(|f| name.starts_with(f)) {
        Group::Layers
    } else if device_metric(name).is_some() || name.starts_with("sys/") {
        Group::System
    } else if TRAINING.contains(&base) || base.contains("loss") || base.starts_with("eval_") {
        Group::Training
    } else if SPEED.contains(&base) || base.ends_with("_per_sec") || base.ends_with("_time") {
        Group::Speed
    } else {
        Group::Other
    }
}

/// The order within a group: the well-known metrics first, in the order above.
fn rank(key: &str) -> usize {
    TRAINING
        .iter()
        .chain(SPEED.iter())
        .position(|&m| m == key)
        .unwrap_or(usize::MAX)
}

/// The charts for `names`, in page order (group, then well-known first, then by name).
pub fn charts(names: &[String]) -> Vec<ChartSpec> {
    let mut specs: Vec<ChartSpec> = Vec::new();
    for name in names {
        let (key, device) = match device_metric(name) {
            Some((kind, n, quantity)) => (format!("{kind}*/{quantity}"), format!("{kind}{n}")),
            None => (name.clone(), String::new()),
        };
        match specs.iter_mut().find(|s| s.key == key) {
            Some(s) => s.metrics.push((name.clone(), device)),
            None => specs.push(ChartSpec {
                group: group_of(name),
                key,
                metrics: vec![(name.clone(), device)],
            }),
        }
    }
    for s in &mut specs {
        s.metrics.sort_by_key(|(_, d)| {
            let digits: String = d.chars().filter(char::is_ascii_digit).collect();
            digits.parse::<u32>().unwrap_or(0)
        });
    }
    specs.sort_by(|a, b| (a.group, rank(&a.key), &a.key).cmp(&(b.group, rank(&b.key), &b.key)));
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn devices_share_one_chart_per_quantity_and_groups_are_ordered() {
        let specs = charts(&names(&[
            "zeta",
            "gpu1/mem_used_gb",
            "samples_per_sec",
            "gpu0/mem_used_gb",
            "lr",
            "loss",
            "sys/cpu_percent",
            "gpu0/util",
            "gpu10/mem_used_gb",
        ]));
        let keys: Vec<&str> = specs.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "loss",
                "lr",
                "samples_per_sec",
                "gpu*/mem_used_gb",
                "gpu*/util",
                "sys/cpu_percent",
                "zeta"
            ]
        );
        let mem = &specs[3];
        assert_eq!(mem.group, Group::System);
        let devices: Vec<&str> = mem.metrics.iter().map(|(_, d)| d.as_str()).collect();
        assert_eq!(devices, ["gpu0", "gpu1", "gpu10"]);
        assert_eq!(specs[6].group, Group::Other);
        let layers = charts(&names(&["grad_norm/fc1", "loss", "weight_norm/fc1"]));
        assert_eq!(layers[0].key, "loss");
        assert!(layers[1..].iter().all(|s| s.group == Group::Layers));
    }
}
