//! `stepstream._stepstream`: the Python face of the Rust collector, and nothing more.
//!
//! Conversion happens here; batching, sending, reconnecting and archiving stay in
//! `stepstream-collector`, on its own thread, off the GIL. `Run.log` takes plain numbers on a
//! fast path (a dict walk and a queue push). A framework tensor is not converted in `log`,
//! since that would force a device sync every step: its record is held and converted with
//! the others every `defer_every` records (and at `flush`/`finish`), in step order.

mod convert;
mod samples;

use convert::{Converter, Held, Value};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::Duration;
use stepstream_collector::{system, Collector, Options, Outcome};
use stepstream_protocol::{unix_now, MetricId, RunId};

/// A metric name as a `str` object the caller passes (held, so its address stays its own),
/// its text, and the collector's id for it once asked.
struct Name {
    _key: Py<PyString>,
    text: String,
    id: Option<MetricId>,
}

/// A sample whose content waits on its device (a histogram): read with the held records.
struct HeldItem {
    step: i64,
    wall_time: f64,
    key: String,
    pack: Py<PyAny>,
}

/// What a value handed to `log` is.
enum Kind {
    Number(f64),
    /// A tensor whose conversion must wait.
    Later,
    /// A `stepstream.Text` or `Table`.
    Sample,
}

/// A plain number, a tensor whose conversion must wait, or a sample.
fn classify(v: &Bound<'_, PyAny>) -> PyResult<Kind> {
    if let Ok(f) = v.downcast_exact::<PyFloat>() {
        return Ok(Kind::Number(f.value()));
    }
    if let Ok(b) = v.downcast_exact::<PyBool>() {
        return Ok(Kind::Number(if b.is_true() { 1.0 } else { 0.0 }));
    }
    if v.downcast_exact::<PyInt>().is_ok() {
        return Ok(Kind::Number(v.extract::<f64>()?));
    }
    let py = v.py();
    if v.hasattr(intern!(py, "asnumpy"))? || v.hasattr(intern!(py, "detach"))? {
        return Ok(Kind::Later);
    }
    if samples::is_sample(v)? {
        return Ok(Kind::Sample);
    }
    // numpy scalars and anything else with __float__
    v.extract::<f64>().map(Kind::Number).map_err(|_| {
        PyTypeError::new_err(format!(
            "metric values must be numbers or scalar tensors, not {}",
            v.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })
}

/// Seconds a held record waits for `defer_every` records before its batch is converted
/// anyway: at 2 ms steps a batch of ten forms in 20 ms, at a step a second it would keep the
/// page ten seconds behind.
const DEFER_FOR: f64 = 0.05;

#[pyclass(module = "stepstream._stepstream")]
struct Run {
    collector: Option<Arc<Collector>>,
    sampler: Option<system::Sampler>,
    held: Vec<Held>,
    defer_every: usize,
    next_step: i64,
    /// Reads the held records' tensors off the training thread.
    converter: Option<Converter>,
    /// Samples refused here (too big, a ragged table...), each with a warning.
    bad_samples: u64,
    /// Histograms whose packs are read with the next batch of held records.
    held_items: Vec<HeldItem>,
    /// The console, captured while the run lasts (`console=True`).
    console: Option<stepstream_collector::console::Capture>,
    /// Metric names by the address of the `str` object that carried them: a training loop
    /// passes the same (interned) key objects every step, and reading a `str`'s text
    /// through the stable ABI costs an allocation. Holding the object keeps the address valid.
    names: FxHashMap<usize, Name>,
    /// The previous record's keys (addresses of objects held in `names`) in order, with
    /// their ids: a training loop passes the same keys in the same order every step, and a
    /// record of that shape then needs no lookup at all.
    shape: Vec<(usize, MetricId)>,
    /// The ids and values of the record being logged (kept for its allocation).
    scratch: Vec<(MetricId, f64)>,
    run_id: String,
    archive: Option<(String, String)>,
}

impl Run {
    fn name_of(&mut self, key: &Bound<'_, PyString>) -> PyResult<usize> {
        let addr = key.as_ptr() as usize;
        if let std::collections::hash_map::Entry::Vacant(slot) = self.names.entry(addr) {
            let text = key.to_cow()?.into_owned();
            slot.insert(Name {
                _key: key.clone().unbind(),
                text,
                id: None,
            });
        }
        Ok(addr)
    }

    /// Whether the record's keys are the previous record's, in the same order, and every
    /// value a plain number; its ids and values are then in `ids`. `false` sends it down the
    /// general path.
    fn same_shape(
        &self,
        metrics: &Bound<'_, PyDict>,
        ids: &mut Vec<(MetricId, f64)>,
    ) -> PyResult<bool> {
        if metrics.len() != self.shape.len() || self.shape.is_empty() {
            return Ok(false);
        }
        for ((k, v), &(addr, id)) in metrics.iter().zip(&self.shape) {
            // The address of a key held in `names`: that very `str` object, so no check of
            // its type or text is needed.
            if k.as_ptr() as usize != addr {
                return Ok(false);
            }
            match classify(&v)? {
                Kind::Number(f) => ids.push((id, f)),
                Kind::Later | Kind::Sample => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The collector's id for the name at `addr`, asked once per key object.
    fn id_of(&mut self, addr: usize, c: &Collector) -> Option<MetricId> {
        let name = self.names.get_mut(&addr)?;
        if name.id.is_none() {
            name.id = c.metric_id(&name.text);
        }
        name.id
    }

    /// Sends a record's samples (a bad one is a warning, not an error).
    fn log_samples(
        &mut self,
        py: Python<'_>,
        c: &Collector,
        step: i64,
        wall_time: f64,
        found: &[(String, Bound<'_, PyAny>)],
    ) {
        let limits = stepstream_protocol::Limits::default();
        for (key, v) in found {
            if let Some(image) = samples::raw_image(key, v) {
                match image {
                    Ok(raw) => {
                        c.log_image_at(step, wall_time, key, raw);
                    }
                    Err(why) => {
                        self.bad_samples += 1;
                        samples::warn(py, &why);
                    }
                }
                continue;
            }
            if let Some(pack) = samples::pack_of(v) {
                self.held_items.push(HeldItem {
                    step,
                    wall_time,
                    key: key.clone(),
                    pack: pack.unbind(),
                });
                continue;
            }
            let checked = samples::body(key, v).and_then(|body| {
                let item = stepstream_protocol::Item {
                    step,
                    wall_time,
                    key: key.clone(),
                    body,
                };
                item.check(&limits).map(|()| item)
            });
            self.send_item(py, c, checked);
        }
        if self.held_items.len() > self.defer_every {
            self.release_items(py, c);
        }
    }

    fn send_item(
        &mut self,
        py: Python<'_>,
        c: &Collector,
        checked: Result<stepstream_protocol::Item, String>,
    ) {
        match checked {
            Ok(item) => {
                c.log_item_at(item.step, item.wall_time, &item.key, item.body);
            }
            Err(why) => {
                self.bad_samples += 1;
                samples::warn(py, &why);
            }
        }
    }

    /// Reads the held histograms' packs (one copy per device) and sends them.
    fn release_items(&mut self, py: Python<'_>, c: &Collector) {
        let held = std::mem::take(&mut self.held_items);
        let packs: Vec<&Py<PyAny>> = held.iter().map(|h| &h.pack).collect();
        let read = samples::read_packs(py, &packs);
        let limits = stepstream_protocol::Limits::default();
        for (h, pack) in held.iter().zip(read) {
            let checked = pack
                .as_deref()
                .and_then(samples::histogram)
                .ok_or_else(|| format!("histogram {:?} could not be read", h.key))
                .and_then(|body| {
                    let item = stepstream_protocol::Item {
                        step: h.step,
                        wall_time: h.wall_time,
                        key: h.key.clone(),
                        body,
                    };
                    item.check(&limits).map(|()| item)
                });
            self.send_item(py, c, checked);
        }
    }

    /// Hands the held records to the converter; `keep_newest` keeps the last one held: its
    /// tensors may still be computing (an asynchronous step), and reading them now would
    /// keep the converter waiting for the device, where the older ones are done.
    fn release(&mut self, py: Python<'_>, keep_newest: bool) {
        let Some(c) = self.collector.clone() else {
            self.held.clear();
            self.held_items.clear();
            return;
        };
        if !keep_newest {
            self.release_items(py, &c);
        }
        let newest = if keep_newest { self.held.pop() } else { None };
        let held = std::mem::take(&mut self.held);
        self.held.extend(newest);
        if let Some(converter) = &mut self.converter {
            converter.hand(py, held);
        }
    }

    /// Whether a record of plain numbers may go straight to the collector: nothing held
    /// and nothing with the converter that it would overtake.
    fn idle(&self) -> bool {
        self.held.is_empty() && !self.converter.as_ref().is_some_and(Converter::busy)
    }
}

#[pymethods]
impl Run {
    #[new]
    #[pyo3(signature = (hub, project, name, *, config_json = "{}".to_string(), run_id = None,
        token = None, rank = 0, world_size = 1, archive_dir = None, archive_tag = String::new(),
        flush_every = 10, defer_every = 10, system_interval = None, memory_records = 500_000,
        spool_dir = None, job = None, framework = String::new(), ca_file = None,
        linger_ms = 40.0, console = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        hub: &str,
        project: &str,
        name: &str,
        config_json: String,
        run_id: Option<String>,
        token: Option<String>,
        rank: u32,
        world_size: u32,
        archive_dir: Option<std::path::PathBuf>,
        archive_tag: String,
        flush_every: usize,
        defer_every: usize,
        system_interval: Option<f64>,
        memory_records: usize,
        spool_dir: Option<std::path::PathBuf>,
        job: Option<String>,
        framework: String,
        ca_file: Option<std::path::PathBuf>,
        linger_ms: f64,
        console: bool,
    ) -> PyResult<Self> {
        let mut o = Options::new(hub, project, name);
        o.linger = Duration::try_from_secs_f64(linger_ms / 1e3)
            .ok()
            .filter(|d| *d <= Duration::from_secs(60))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "linger_ms must be milliseconds from 0 to 60000, not {linger_ms}"
                ))
            })?;
        o.config_json = config_json;
        o.run_id = run_id
            .map(RunId::new)
            .transpose()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        o.token = token;
        o.rank = rank;
        o.world_size = world_size;
        o.job = job;
        o.framework = framework;
        o.ca_file = ca_file;
        o.archive_dir = archive_dir;
        o.archive_tag = archive_tag;
        o.flush_every = flush_every;
        o.memory_records = memory_records.max(1);
        o.spool_dir = spool_dir;
        let collector =
            Arc::new(Collector::start(o).map_err(|e| PyValueError::new_err(e.to_string()))?);
        let console = if console {
            match collector.capture_console() {
                Ok(capture) => Some(capture),
                // The process's console goes to the run that captured it first.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                Err(e) => {
                    // The training goes on without it; the reason is kept.
                    let why = format!("stepstream: cannot capture the console: {e}");
                    samples::warn(py, &why);
                    None
                }
            }
        } else {
            None
        };
        let sampler = system_interval
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .filter(|d| !d.is_zero())
            .map(|d| system::start(collector.clone(), d));
        Ok(Run {
            sampler,
            held: Vec::new(),
            defer_every: defer_every.max(1),
            next_step: 0,
            converter: Some(Converter::new(collector.clone())),
            bad_samples: 0,
            held_items: Vec::new(),
            console,
            names: FxHashMap::default(),
            shape: Vec::new(),
            scratch: Vec::new(),
            run_id: collector.run_id().to_string(),
            archive: collector
                .archive_paths()
                .map(|(m, c)| (m.display().to_string(), c.display().to_string())),
            collector: Some(collector),
        })
    }

    /// Records one step. `step` defaults to the previous step + 1. Never blocks on the hub.
    #[pyo3(signature = (metrics, step = None))]
    fn log(
        &mut self,
        py: Python<'_>,
        metrics: &Bound<'_, PyDict>,
        step: Option<i64>,
    ) -> PyResult<()> {
        let Some(c) = self.collector.as_ref() else {
            return Ok(());
        };
        let step = step.unwrap_or(self.next_step);
        self.next_step = step + 1;
        // Console lines printed from now on belong to this step, even while its record is
        // held until its tensors are read.
        c.note_step(step);
        let wall_time = unix_now();
        if self.idle() {
            let mut ids = std::mem::take(&mut self.scratch);
            let same = self.same_shape(metrics, &mut ids);
            if let Ok(true) = same {
                c.log_ids_at(step, wall_time, &ids);
            }
            ids.clear();
            self.scratch = ids;
            if same? {
                return Ok(());
            }
        }
        let c = c.clone();
        if self.names.len() >= 4096 {
            // Callers building fresh key strings each step: start over rather than grow
            // (and forget the shape, whose addresses only `names` keeps valid).
            self.names.clear();
            self.shape.clear();
        }
        let mut keys: Vec<usize> = Vec::with_capacity(metrics.len());
        let mut numbers: Vec<f64> = Vec::with_capacity(metrics.len());
        let mut later = false;
        let mut samples = Vec::new();
        for (k, v) in metrics.iter() {
            let k = k
                .downcast_into::<PyString>()
                .map_err(|_| PyTypeError::new_err("metric names must be str"))?;
            match classify(&v)? {
                Kind::Number(f) => numbers.push(f),
                Kind::Later => {
                    later = true;
                    break;
                }
                Kind::Sample => {
                    samples.push((k.to_cow()?.into_owned(), v));
                    continue;
                }
            }
            keys.push(self.name_of(&k)?);
        }
        if !later {
            self.log_samples(py, &c, step, wall_time, &samples);
        }
        if !later && self.idle() && keys.is_empty() && !samples.is_empty() {
            // Only samples: no empty record beside them.
            return Ok(());
        }
        if !later && self.idle() {
            // Ids cached per key object, no name hashed.
            let mut ids = Vec::with_capacity(keys.len());
            for (&k, &v) in keys.iter().zip(&numbers) {
                match self.id_of(k, &c) {
                    Some(id) => ids.push((id, v)),
                    None => {
                        // A definition the queue had no room for: the string path counts it.
                        let pairs: Vec<(&str, f64)> = keys
                            .iter()
                            .map(|k| self.names[k].text.as_str())
                            .zip(numbers)
                            .collect();
                        c.log_at(step, wall_time, &pairs);
                        return Ok(());
                    }
                }
            }
            self.shape.clear();
            self.shape
                .extend(keys.iter().zip(&ids).map(|(&k, &(id, _))| (k, id)));
            c.log_ids_at(step, wall_time, &ids);
            return Ok(());
        }
        // Hold the whole record (keeping step order) until the batch is converted.
        let mut values = Vec::with_capacity(metrics.len());
        let mut samples = Vec::new();
        for (k, v) in metrics.iter() {
            let k = k.downcast_into::<PyString>()?;
            let value = match classify(&v)? {
                Kind::Number(f) => Value::Number(f),
                Kind::Later => Value::Later(v.unbind()),
                Kind::Sample => {
                    if later {
                        samples.push((k.to_cow()?.into_owned(), v));
                    }
                    continue;
                }
            };
            let key = self.name_of(&k)?;
            let name = self.names[&key].text.clone();
            values.push((name, value));
        }
        self.log_samples(py, &c, step, wall_time, &samples);
        self.held.push(Held {
            step,
            wall_time,
            values,
        });
        // Every `defer_every` records, or sooner when steps are slow: a record waits for at
        // most one step after `DEFER_FOR` (its successor's tensors may still be computing).
        let waited = wall_time - self.held[0].wall_time;
        if self.held.len() > self.defer_every || (self.held.len() > 1 && waited >= DEFER_FOR) {
            self.release(py, true);
        }
        Ok(())
    }

    /// Adds `text` to the run's console as lines of `stream` (`stdout` or `stderr`), as if
    /// printed: for what is printed only after the run ends (a traceback).
    #[pyo3(signature = (text, stream = "stdout"))]
    fn console_write(&self, text: &str, stream: &str) -> PyResult<()> {
        let stream = stepstream_protocol::Stream::parse(stream).ok_or_else(|| {
            PyValueError::new_err(format!("stream must be stdout or stderr, not {stream:?}"))
        })?;
        if let Some(c) = &self.collector {
            for line in text.lines() {
                c.log_item(
                    "",
                    stepstream_protocol::ItemBody::Line {
                        stream,
                        text: line.replace('\0', "\u{fffd}"),
                    },
                );
            }
        }
        Ok(())
    }

    /// Converts held tensors (waiting for the converter) and asks the sender to send now.
    fn flush(&mut self, py: Python<'_>) {
        self.release(py, false);
        if let Some(converter) = &self.converter {
            converter.drain(py);
        }
        if let Some(c) = &self.collector {
            c.flush();
        }
    }

    /// Ends the run (`finished`, `failed` or `killed`) and waits up to `timeout` seconds for
    /// the hub to acknowledge everything. Returns a report; never raises for an absent hub.
    #[pyo3(signature = (status = "finished", message = None, timeout = 30.0))]
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        status: &str,
        message: Option<String>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let outcome = match status {
            "finished" => Outcome::Finished,
            "failed" => Outcome::Failed(message.unwrap_or_default()),
            "killed" => Outcome::Killed(message.unwrap_or_default()),
            "stopped" => Outcome::Stopped(message.unwrap_or_default()),
            other => {
                return Err(PyValueError::new_err(format!(
                    "status must be finished, failed, killed or stopped, not {other:?}"
                )))
            }
        };
        self.release(py, false);
        let unconvertible = match self.converter.take() {
            Some(converter) => {
                converter.drain(py);
                converter.unconvertible()
            }
            None => 0,
        };
        self.sampler = None;
        if let Some(capture) = self.console.take() {
            // What Python still buffers goes out first, then the readers drain the pipes.
            if let Ok(sys) = py.import(intern!(py, "sys")) {
                for stream in [intern!(py, "stdout"), intern!(py, "stderr")] {
                    if let Ok(s) = sys.getattr(stream) {
                        let _ = s.call_method0(intern!(py, "flush"));
                    }
                }
            }
            py.allow_threads(|| capture.stop());
        }
        let report = dict(py)?;
        let Some(c) = self.collector.take() else {
            report.set_item("delivered", false)?;
            return Ok(report);
        };
        // `inf` waits as long as it takes; NaN or a negative timeout does not wait.
        let timeout = if timeout.is_nan() {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX)
        };
        let r = py.allow_threads(|| c.finish_shared(outcome, timeout));
        report.set_item("delivered", r.delivered)?;
        report.set_item("logged", r.logged)?;
        report.set_item("dropped", r.dropped)?;
        report.set_item("acked", r.acked)?;
        report.set_item("unacked", r.unacked)?;
        report.set_item("refused", r.refused)?;
        report.set_item("lost", r.lost)?;
        report.set_item("unconvertible", unconvertible)?;
        report.set_item("items_acked", r.items_acked)?;
        report.set_item("items_dropped", r.items_dropped)?;
        report.set_item("items_refused", r.items_refused + self.bad_samples)?;
        Ok(report)
    }

    /// The step `log` uses when given none: the last logged step + 1.
    #[getter]
    fn next_step(&self) -> i64 {
        self.next_step
    }

    #[setter]
    fn set_next_step(&mut self, step: i64) {
        self.next_step = step;
    }

    #[getter]
    fn run_id(&self) -> String {
        self.run_id.clone()
    }

    /// The archive CSV's path, when archiving.
    #[getter]
    fn metrics_csv(&self) -> Option<String> {
        self.archive.as_ref().map(|(m, _)| m.clone())
    }

    /// The archived config JSON's path, when archiving.
    #[getter]
    fn config_path(&self) -> Option<String> {
        self.archive.as_ref().map(|(_, c)| c.clone())
    }

    /// Whether the hub delivered commands not yet taken (one atomic load).
    #[getter]
    fn has_commands(&self) -> bool {
        self.collector.as_ref().is_some_and(|c| c.has_commands())
    }

    /// The commands delivered since the last call, as dicts (`id`, `action`: stop,
    /// checkpoint or note, `checkpoint`, `text`, `by`, `reason`, `issued_at`); each once.
    fn take_commands<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let Some(c) = &self.collector else {
            return Ok(Vec::new());
        };
        c.take_commands()
            .into_iter()
            .map(|cmd| {
                let d = dict(py)?;
                d.set_item("id", cmd.id)?;
                d.set_item("action", cmd.action.name())?;
                let (checkpoint, text) = match &cmd.action {
                    stepstream_protocol::Action::Stop { checkpoint } => (*checkpoint, ""),
                    stepstream_protocol::Action::Checkpoint => (true, ""),
                    stepstream_protocol::Action::Note { text } => (false, text.as_str()),
                };
                d.set_item("checkpoint", checkpoint)?;
                d.set_item("text", text)?;
                d.set_item("by", cmd.by)?;
                d.set_item("reason", cmd.reason)?;
                d.set_item("issued_at", cmd.issued_at)?;
                Ok(d)
            })
            .collect()
    }

    /// Raises an alert of the training's own, told on the hub's channels (`level`: info,
    /// warning or error). Returns whether it was queued.
    #[pyo3(signature = (title, text = String::new(), level = "warning"))]
    fn alert(&self, title: &str, text: String, level: &str) -> PyResult<bool> {
        let level = stepstream_protocol::AlertLevel::parse(level).ok_or_else(|| {
            PyValueError::new_err(format!(
                "level must be info, warning or error, not {level:?}"
            ))
        })?;
        if title.trim().is_empty() {
            return Err(PyValueError::new_err("an alert needs a title"));
        }
        Ok(self
            .collector
            .as_ref()
            .is_some_and(|c| c.alert(title, &text, level)))
    }

    /// Tells the hub what became of command `id` (the first answer stands).
    #[pyo3(signature = (id, honoured = true, message = String::new()))]
    fn command_done(&self, id: u64, honoured: bool, message: String) {
        if let Some(c) = &self.collector {
            c.command_done(id, honoured, &message);
        }
    }

    #[getter]
    fn connected(&self) -> bool {
        self.collector.as_ref().is_some_and(|c| c.connected())
    }

    #[getter]
    fn last_error(&self) -> Option<String> {
        self.collector.as_ref().and_then(|c| c.last_error())
    }
}

fn dict(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    Ok(PyDict::new(py))
}

#[pymodule]
fn _stepstream(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Run>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", stepstream_protocol::codec::VERSION)?;
    Ok(())
}
