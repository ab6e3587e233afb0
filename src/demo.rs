//! `stepstream demo`: a hub on loopback and three real trainings streaming to it.
//!
//! Each run trains a small MLP (8 → 32 tanh → 1) by SGD with momentum on a synthetic
//! regression task, with linear warmup then cosine decay of the learning rate. One run's peak
//! learning rate is high enough to diverge, which is what the stepstream page is for.

use anyhow::{Context, Result};
use std::time::{Duration, Instant};
use stepstream_collector::{Collector, Options, Outcome};
use stepstream_protocol::Action;

const INPUT: usize = 8;
const HIDDEN: usize = 32;
const BATCH: usize = 256;

/// xorshift64*: deterministic, dependency-free noise.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next_f64().max(1e-12), self.next_f64());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// The learning rate at `step`: linear warmup to `peak`, then cosine decay to 10% of it.
pub fn schedule(step: usize, total: usize, warmup: usize, peak: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let t = (step - warmup) as f64 / (total - warmup).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t.min(1.0)).cos()))
}

/// Parameters and momentum, flat: `w1 (H*D) | b1 (H) | w2 (H) | b2 (1)`.
struct Mlp {
    params: Vec<f64>,
    velocity: Vec<f64>,
}

impl Mlp {
    fn new(rng: &mut Rng) -> Mlp {
        let n = HIDDEN * INPUT + HIDDEN + HIDDEN + 1;
        let scale = (1.0 / INPUT as f64).sqrt();
        let params = (0..n).map(|_| rng.normal() * scale).collect();
        Mlp {
            params,
            velocity: vec![0.0; n],
        }
    }

    /// Mean squared error of the batch and its gradient.
    fn loss_and_grad(&self, xs: &[[f64; INPUT]], ys: &[f64]) -> (f64, Vec<f64>) {
        let (w1, rest) = self.params.split_at(HIDDEN * INPUT);
        let (b1, rest) = rest.split_at(HIDDEN);
        let (w2, b2) = rest.split_at(HIDDEN);
        let mut grad = vec![0.0; self.params.len()];
        let mut loss = 0.0;
        let n = xs.len() as f64;
        let mut h = [0.0; HIDDEN];
        for (x, &y) in xs.iter().zip(ys) {
            for j in 0..HIDDEN {
                let z: f64 = b1[j] + (0..INPUT).map(|i| w1[j * INPUT + i] * x[i]).sum::<f64>();
                h[j] = z.tanh();
            }
            let out: f64 = b2[0] + (0..HIDDEN).map(|j| w2[j] * h[j]).sum::<f64>();
            let err = out - y;
            loss += err * err / n;
            let d_out = 2.0 * err / n;
            let (g1, g_rest) = grad.split_at_mut(HIDDEN * INPUT);
            let (gb1, g_rest) = g_rest.split_at_mut(HIDDEN);
            let (gw2, gb2) = g_rest.split_at_mut(HIDDEN);
            gb2[0] += d_out;
            for j in 0..HIDDEN {
                gw2[j] += d_out * h[j];
                let dz = d_out * w2[j] * (1.0 - h[j] * h[j]);
                gb1[j] += dz;
                for i in 0..INPUT {
                    g1[j * INPUT + i] += dz * x[i];
                }
            }
        }
        (loss, grad)
    }

    fn step(&mut self, grad: &[f64], lr: f64) {
        for ((p, v), g) in self.params.iter_mut().zip(&mut self.velocity).zip(grad) {
            *v = 0.9 * *v + g;
            *p -= lr * *v;
        }
    }
}

fn target(x: &[f64; INPUT]) -> f64 {
    // Bounded, so batch losses have no heavy tail: a healthy run's loss is only noisy.
    (x[0] * 1.5 + x[1]).sin() + 0.5 * (x[2] * x[3]).cos() - 0.3 * x[4].tanh()
        + 0.1 * (x[5] * x[6]).tanh()
}

/// One training run streaming to `hub`. Returns the run id and how it ended.
pub fn train(
    hub: &str,
    name: &str,
    peak_lr: f64,
    steps: usize,
    rate: f64,
    seed: u64,
    drift: bool,
) -> Result<(String, Outcome)> {
    let warmup = (steps / 10).max(1);
    let mut options = Options::new(hub, "demo", name);
    options.framework = "demo (Rust MLP)".into();
    options.config_json = serde_json::json!({
        "model": format!("mlp {INPUT}-{HIDDEN}-1 tanh"),
        "optimizer": "sgd momentum 0.9",
        "batch_size": BATCH,
        "peak_lr": peak_lr,
        "warmup_steps": warmup,
        "schedule": "linear warmup, cosine decay to 10%",
        "steps": steps,
        "seed": seed,
    })
    .to_string();
    let run = Collector::start(options)?;
    let id = run.run_id().to_string();
    let mut rng = Rng(seed.max(1));
    let mut model = Mlp::new(&mut rng);
    let period = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let started = Instant::now();
    let mut outcome = Outcome::Finished;
    let mut xs = vec![[0.0; INPUT]; BATCH];
    let mut ys = vec![0.0; BATCH];
    for step in 0..steps {
        let t = Instant::now();
        for (x, y) in xs.iter_mut().zip(ys.iter_mut()) {
            for v in x.iter_mut() {
                *v = rng.normal();
            }
            // A run whose labels go bad from 30% of its steps on (a data bug): its loss
            // trends up, slowly, without ever blowing up: the divergence rule's case.
            let noise = if drift && step > steps * 3 / 10 {
                0.05 + 3.0 * (step - steps * 3 / 10) as f64 / steps as f64
            } else {
                0.05
            };
            *y = target(x) + noise * rng.normal();
        }
        let data_wait = t.elapsed().as_secs_f64();
        let lr = schedule(step, steps, warmup, peak_lr);
        let (loss, grad) = model.loss_and_grad(&xs, &ys);
        let grad_norm = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
        model.step(&grad, lr);
        let step_time = t.elapsed().as_secs_f64().max(1e-9);
        run.log(
            step as i64,
            &[
                ("loss", loss),
                ("lr", lr),
                ("grad_norm", grad_norm),
                ("samples_per_sec", BATCH as f64 / step_time),
                ("step_time", step_time),
                ("data_wait", data_wait),
            ],
        );
        if !loss.is_finite() || loss > 1e6 {
            outcome = Outcome::Failed(format!("loss diverged to {loss} at step {step}"));
            break;
        }
        // Commands from the page, the CLI or a rule: a checkpoint is the model's parameters
        // as JSON; a stop ends the run `stopped`.
        if run.has_commands() {
            if let Some(stopped) = obey(&run, name, step, &model) {
                outcome = stopped;
                break;
            }
        }
        if let Some(period) = period {
            let due = started + period * (step as u32 + 1);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    let report = run.finish(outcome.clone());
    if !report.delivered {
        anyhow::bail!("run {name}: the hub did not acknowledge everything ({report:?})");
    }
    Ok((id, outcome))
}

/// Acts on the commands delivered: saves a checkpoint (the parameters as JSON, in the temp
/// folder), shows a note, and for a stop returns how the run ends.
fn obey(run: &Collector, name: &str, step: usize, model: &Mlp) -> Option<Outcome> {
    let mut stop = None;
    for cmd in run.take_commands() {
        let wants_checkpoint = matches!(
            cmd.action,
            Action::Checkpoint | Action::Stop { checkpoint: true }
        );
        let mut saved = String::new();
        if wants_checkpoint {
            let dir = std::env::temp_dir().join("stepstream-demo-checkpoints");
            let path = dir.join(format!("{name}-step{step}.json"));
            let written = std::fs::create_dir_all(&dir).and_then(|()| {
                std::fs::write(&path, serde_json::to_vec(&model.params).unwrap_or_default())
            });
            match written {
                Ok(()) => saved = format!("saved {}", path.display()),
                Err(e) => saved = format!("no checkpoint: {e}"),
            }
        }
        match &cmd.action {
            Action::Stop { .. } => {
                run.command_done(cmd.id, true, &format!("stopped at step {step}; {saved}"));
                let why = if cmd.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", cmd.reason)
                };
                stop = Some(Outcome::Stopped(format!("stopped by {}{why}", cmd.by)));
            }
            Action::Checkpoint => run.command_done(cmd.id, saved.starts_with("saved"), &saved),
            Action::Note { .. } => run.command_done(cmd.id, true, ""),
        }
    }
    stop
}

/// The demo hub's alerts: a diverging run is stopped by rule 3 s after its divergence alert
/// unless someone acknowledges it in the page (the run whose labels drift), and a stopped
/// run's ending is noted with what the stop saved.
pub fn alerts() -> stepstream_server::notify::AlertsConfig {
    use stepstream_server::alerts::actions::{Act, Endings, RuleAction};
    let stop = RuleAction {
        act: Act::Stop,
        grace_s: 3.0,
        checkpoint: true,
    };
    stepstream_server::notify::AlertsConfig {
        actions: [("divergence", stop)]
            .into_iter()
            .map(|(rule, a)| (rule.to_string(), a))
            .collect(),
        endings: Endings {
            statuses: vec!["stopped".into()],
            ..Endings::default()
        },
        ..Default::default()
    }
}

/// Runs the demo: the three trainings at once, against the hub at `hub`.
pub fn run_all(hub: &str, steps: usize, rate: f64) -> Result<()> {
    let runs = [
        ("mlp-lr0.02", 0.02, 1, false),
        ("mlp-lr0.1", 0.1, 2, false),
        ("mlp-lr0.6-diverges", 0.6, 3, false),
        ("mlp-labels-drift", 0.1, 4, true),
    ];
    let threads: Vec<_> = runs
        .into_iter()
        .map(|(name, lr, seed, drift)| {
            let hub = hub.to_string();
            std::thread::spawn(move || {
                train(&hub, name, lr, steps, rate, seed, drift).map(|r| (name, r))
            })
        })
        .collect();
    for t in threads {
        let (name, (id, outcome)) = t.join().expect("training thread").context("training")?;
        eprintln!("stepstream demo: {name} ({id}) ended: {outcome:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays() {
        assert!((schedule(0, 1000, 100, 1.0) - 0.01).abs() < 1e-12);
        assert!((schedule(99, 1000, 100, 1.0) - 1.0).abs() < 1e-12);
        assert!((schedule(100, 1000, 100, 1.0) - 1.0).abs() < 1e-12);
        assert!((schedule(1000, 1000, 100, 1.0) - 0.1).abs() < 1e-12);
        assert!(schedule(500, 1000, 100, 1.0) < schedule(400, 1000, 100, 1.0));
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let mut rng = Rng(7);
        let model = Mlp::new(&mut rng);
        let xs: Vec<[f64; INPUT]> = (0..4)
            .map(|_| std::array::from_fn(|_| rng.normal()))
            .collect();
        let ys: Vec<f64> = xs.iter().map(target).collect();
        let (_, grad) = model.loss_and_grad(&xs, &ys);
        for &i in &[0, 17, HIDDEN * INPUT + 3, model.params.len() - 1] {
            let mut m = Mlp {
                params: model.params.clone(),
                velocity: model.velocity.clone(),
            };
            let eps = 1e-6;
            m.params[i] += eps;
            let (up, _) = m.loss_and_grad(&xs, &ys);
            m.params[i] -= 2.0 * eps;
            let (down, _) = m.loss_and_grad(&xs, &ys);
            let numeric = (up - down) / (2.0 * eps);
            assert!(
                (numeric - grad[i]).abs() < 1e-5,
                "param {i}: {numeric} vs {}",
                grad[i]
            );
        }
    }
}
