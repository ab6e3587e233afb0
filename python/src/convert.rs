//! Held records to numbers, off the training thread.
//!
//! A record holding framework tensors waits in `Run` until `defer_every` records are held;
//! the batch is then handed to one converter thread, which takes the GIL, reads every
//! tensor of the batch in one call of `stepstream._tensors.to_floats` (one host copy per
//! framework and device) and logs the records in step order. The training thread never
//! waits for a device there: reading a tensor still being computed blocks the converter,
//! not the step. `Run` keeps the order across both paths: while a batch is with the
//! converter, a record of plain numbers is held behind it instead of overtaking it.

use pyo3::intern;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use stepstream_collector::Collector;

pub(crate) enum Value {
    Number(f64),
    Later(Py<PyAny>),
}

/// A record waiting for its tensors to be read.
pub(crate) struct Held {
    pub step: i64,
    pub wall_time: f64,
    pub values: Vec<(String, Value)>,
}

enum Job {
    Convert(Vec<Held>),
    /// Answered once every batch handed before it is logged.
    Barrier(mpsc::SyncSender<()>),
}

/// The converter thread of one run (started at its first batch).
pub(crate) struct Converter {
    collector: Arc<Collector>,
    jobs: Option<mpsc::Sender<Job>>,
    /// Batches handed and not yet logged.
    pending: Arc<AtomicUsize>,
    /// Values whose conversion failed; skipped rather than stopping training.
    unconvertible: Arc<AtomicU64>,
}

impl Converter {
    pub fn new(collector: Arc<Collector>) -> Self {
        Converter {
            collector,
            jobs: None,
            pending: Arc::new(AtomicUsize::new(0)),
            unconvertible: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether a batch is still with the converter: a record logged now must queue behind it.
    pub fn busy(&self) -> bool {
        self.pending.load(Ordering::Acquire) > 0
    }

    pub fn unconvertible(&self) -> u64 {
        self.unconvertible.load(Ordering::Relaxed)
    }

    /// Hands a batch to the converter thread (converted here if the thread cannot start).
    pub fn hand(&mut self, py: Python<'_>, batch: Vec<Held>) {
        if batch.is_empty() {
            return;
        }
        if self.jobs.is_none() {
            self.jobs = self.spawn();
        }
        let batch = match &self.jobs {
            Some(jobs) => {
                self.pending.fetch_add(1, Ordering::AcqRel);
                match jobs.send(Job::Convert(batch)) {
                    Ok(()) => return,
                    Err(mpsc::SendError(job)) => {
                        self.pending.fetch_sub(1, Ordering::AcqRel);
                        self.jobs = None;
                        match job {
                            Job::Convert(batch) => batch,
                            Job::Barrier(_) => return,
                        }
                    }
                }
            }
            None => batch,
        };
        log_converted(py, &self.collector, batch, &self.unconvertible);
    }

    /// Waits, without the GIL, until every batch handed so far is logged.
    pub fn drain(&self, py: Python<'_>) {
        let Some(jobs) = &self.jobs else { return };
        let (done, wait) = mpsc::sync_channel(1);
        if jobs.send(Job::Barrier(done)).is_ok() {
            // The converter needs the GIL to finish: release it while waiting.
            py.allow_threads(move || {
                let _ = wait.recv();
            });
        }
    }

    fn spawn(&self) -> Option<mpsc::Sender<Job>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let c = self.collector.clone();
        let pending = self.pending.clone();
        let unconvertible = self.unconvertible.clone();
        std::thread::Builder::new()
            .name("stepstream-convert".into())
            .spawn(move || {
                // Ends when the run drops its sender (at finish, or with the run).
                for job in rx {
                    match job {
                        Job::Convert(batch) => {
                            Python::with_gil(|py| log_converted(py, &c, batch, &unconvertible));
                            pending.fetch_sub(1, Ordering::AcqRel);
                        }
                        Job::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .ok()
            .map(|_| tx)
    }
}

/// Reads the batch's tensors at once and logs its records, in order.
fn log_converted(py: Python<'_>, c: &Collector, batch: Vec<Held>, unconvertible: &AtomicU64) {
    let objects: Vec<&Py<PyAny>> = batch
        .iter()
        .flat_map(|h| h.values.iter())
        .filter_map(|(_, v)| match v {
            Value::Later(obj) => Some(obj),
            Value::Number(_) => None,
        })
        .collect();
    let mut floats = many(py, &objects).into_iter();
    for h in &batch {
        let mut values: Vec<(&str, f64)> = Vec::with_capacity(h.values.len());
        for (name, v) in &h.values {
            match v {
                Value::Number(f) => values.push((name, *f)),
                Value::Later(_) => match floats.next().flatten() {
                    Some(f) => values.push((name, f)),
                    None => {
                        unconvertible.fetch_add(1, Ordering::Relaxed);
                    }
                },
            }
        }
        c.log_later(h.step, h.wall_time, &values);
    }
}

/// Converts held tensors, in order, through `stepstream._tensors.to_floats` (one device
/// sync per framework and device); one by one with [`convert`] if that helper fails.
fn many(py: Python<'_>, objects: &[&Py<PyAny>]) -> Vec<Option<f64>> {
    if objects.is_empty() {
        return Vec::new();
    }
    let batched = (|| -> PyResult<Vec<Option<f64>>> {
        let list = pyo3::types::PyList::new(py, objects.iter().map(|o| o.bind(py)))?;
        py.import(intern!(py, "stepstream._tensors"))?
            .call_method1(intern!(py, "to_floats"), (list,))?
            .extract()
    })();
    match batched {
        Ok(v) if v.len() == objects.len() => v,
        _ => objects.iter().map(|o| convert(py, o).ok()).collect(),
    }
}

/// Converts a held tensor (MindSpore, PyTorch, Paddle...) to its first element.
fn convert(py: Python<'_>, obj: &Py<PyAny>) -> PyResult<f64> {
    let t = obj.bind(py);
    let flat = if t.hasattr(intern!(py, "asnumpy"))? {
        t.call_method0(intern!(py, "asnumpy"))?
    } else if t.hasattr(intern!(py, "detach"))? {
        t.call_method0(intern!(py, "detach"))?
            .call_method0(intern!(py, "cpu"))?
            .call_method0(intern!(py, "numpy"))?
    } else {
        t.clone()
    };
    let first = match flat.call_method1(intern!(py, "reshape"), (-1,)) {
        Ok(f) => f.get_item(0)?,
        Err(_) => flat,
    };
    first.extract::<f64>()
}
