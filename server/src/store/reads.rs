//! The read side, written once for both engines: a pool of read connections used on the
//! blocking pool (at most [`READERS`] reads at once, so a crowd of readers waits here
//! rather than exhausting the pool), and every read the hub makes. What differs between the
//! engines is a small table, [`Dialect`]: how to connect, each read's SQL and how its rows
//! decode.

use super::blob::visit_values;
use super::items::{ItemQuery, StoredItem};
use super::pack::{is_pack, visit_pack_values};
use super::{Batches, Result, RunKey, StoreError, StoredRun};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use stepstream_protocol::{Alert, MetricId, RunId, StepRecord};

/// Reads on the blocking pool at once, at most; as many connections are pooled.
pub(super) const READERS: usize = 16;

/// What a stored batch's row hands on: its sequence number and its blob.
pub(super) type Visit<'a> = dyn FnMut(u64, &[u8]) -> Result<ControlFlow<()>> + 'a;

/// One engine's SQL and row decoding for the reads.
pub(super) trait Dialect: Send + Sync + 'static {
    type Conn: Send + 'static;

    /// A new read connection.
    fn connect(&self) -> Result<Self::Conn>;
    /// Whether a connection goes back to the pool after a read that ended `ok` (a broken
    /// PostgreSQL connection does not: the next read connects afresh).
    fn reusable(conn: &Self::Conn, ok: bool) -> bool;
    /// Every run, or the one named `run_id`.
    fn load_runs(conn: &mut Self::Conn, run_id: Option<&str>) -> Result<Vec<StoredRun>>;
    /// The run's alerts, oldest first (their `run_id` left for the caller to fill).
    fn alerts(conn: &mut Self::Conn, key: RunKey, run_id: &RunId) -> Result<Vec<Alert>>;
    /// Each stored row holding a batch with `after < seq <= through`, in sequence order,
    /// until `visit` breaks: a pack (`store::pack`) may hold batches outside the range too,
    /// which the caller skips.
    fn batches(
        conn: &mut Self::Conn,
        key: RunKey,
        after: u64,
        through: u64,
        visit: &mut Visit<'_>,
    ) -> Result<()>;
    /// Each stored batch with `seq <= through` that may hold a step in `lo..=hi`, found by
    /// span class (`blob::class_floors`), in sequence order, until `visit` breaks.
    fn batches_in_steps(
        conn: &mut Self::Conn,
        key: RunKey,
        steps: (i64, i64),
        through: u64,
        visit: &mut Visit<'_>,
    ) -> Result<()>;
    /// The run's stored rows with `seq <= through` that hold a step in `lo..=hi`, in
    /// sequence order, until `visit` breaks: a pack lying wholly inside the range and
    /// through `through`, with a summary at `width`, as that summary (its values are not
    /// read); any other row as its blob. One read transaction, as [`Dialect::batches`].
    fn summarized(
        conn: &mut Self::Conn,
        key: RunKey,
        width: i64,
        steps: (i64, i64),
        through: u64,
        visit: &mut dyn FnMut(Row<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<()>;
    /// The lowest and highest step stored.
    fn step_bounds(conn: &mut Self::Conn, key: RunKey) -> Result<Option<(i64, i64)>>;
    /// The run's config JSON.
    fn config(conn: &mut Self::Conn, key: RunKey) -> Result<Option<String>>;
    /// The run's items that `query` asks for, in its order, until `visit` breaks.
    fn items(
        conn: &mut Self::Conn,
        key: RunKey,
        query: &ItemQuery,
        visit: &mut dyn FnMut(StoredItem) -> ControlFlow<()>,
    ) -> Result<()>;
    /// Console lines the run sent in all, and how many the store keeps.
    fn console_counts(conn: &mut Self::Conn, key: RunKey) -> Result<(u64, u64)>;
    /// The run's commands' rows, oldest first.
    fn commands(conn: &mut Self::Conn, key: RunKey) -> Result<Vec<super::commands::Row>>;
    /// Every project's page rules, oldest first.
    fn rules(conn: &mut Self::Conn) -> Result<Vec<super::commands::StoredRule>>;
    /// The run's acknowledgements, oldest first.
    fn acks(conn: &mut Self::Conn, key: RunKey) -> Result<Vec<super::commands::Acked>>;
}

/// A stored row as [`Dialect::summarized`] hands it on.
pub(super) enum Row<'a> {
    /// A pack's summary at the width asked for (`store::summary`), and its first `seq`.
    Summary(u64, &'a [u8]),
    /// A batch's or a pack's blob, and its (first) `seq`.
    Blob(u64, &'a [u8]),
}

/// What [`Reads::scan_summarized`] hands its caller: a pack's summary, or the records of a
/// batch that has no summary (its steps may lie outside the range: the caller filters).
pub enum Part<'a> {
    Summary(super::summary::Summary<'a>),
    Records(&'a [StepRecord]),
}

/// Which of a run's batches a scan reads.
enum Which {
    /// `after < seq <= through`.
    Seqs(u64, u64),
    /// Those that may hold a step in the range, with `seq <= through`.
    Steps((i64, i64), u64),
}

/// An engine's read side; cheap to clone.
pub(super) struct Reads<D: Dialect> {
    dialect: Arc<D>,
    pool: Arc<Mutex<Vec<D::Conn>>>,
    reading: Arc<tokio::sync::Semaphore>,
}

impl<D: Dialect> Clone for Reads<D> {
    fn clone(&self) -> Self {
        Reads {
            dialect: self.dialect.clone(),
            pool: self.pool.clone(),
            reading: self.reading.clone(),
        }
    }
}

impl<D: Dialect> Reads<D> {
    pub(super) fn new(dialect: D) -> Reads<D> {
        Reads {
            dialect: Arc::new(dialect),
            pool: Arc::default(),
            reading: Arc::new(tokio::sync::Semaphore::new(READERS)),
        }
    }

    pub(super) fn dialect(&self) -> &D {
        &self.dialect
    }

    /// Runs `f` on a pooled connection on the blocking pool.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut D::Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (pool, dialect) = (self.pool.clone(), self.dialect.clone());
        let permit = self
            .reading
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Join(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let mut conn = match pooled {
                Some(c) if D::reusable(&c, true) => c,
                _ => dialect.connect()?,
            };
            let out = f(&mut conn);
            let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < READERS && D::reusable(&conn, out.is_ok()) {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?
    }

    pub(super) async fn load_runs(&self) -> Result<Vec<StoredRun>> {
        self.read(|c| D::load_runs(c, None)).await
    }

    pub(super) async fn load_run(&self, run_id: RunId) -> Result<Option<StoredRun>> {
        self.read(move |c| Ok(D::load_runs(c, Some(run_id.as_str()))?.pop()))
            .await
    }

    pub(super) async fn alerts(&self, key: RunKey, run_id: RunId) -> Result<Vec<Alert>> {
        self.read(move |c| D::alerts(c, key, &run_id)).await
    }

    pub(super) async fn scan<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        state: S,
        f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.records(key, Which::Seqs(after_seq, through_seq), state, f)
            .await
    }

    /// The records of the batches `which` names, decoded, for `f`.
    async fn records<S: Send + 'static>(
        &self,
        key: RunKey,
        which: Which,
        mut state: S,
        mut f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.read(move |c| {
            let mut batches = match which {
                Which::Seqs(after, through) => Batches::new(key, (after, through), None),
                Which::Steps(steps, through) => Batches::new(key, (0, through), Some(steps)),
            };
            let mut visit = |seq, blob: &[u8]| batches.visit(seq, blob, &mut state, &mut f);
            match which {
                Which::Seqs(after, through) => D::batches(c, key, after, through, &mut visit)?,
                Which::Steps(steps, through) => {
                    D::batches_in_steps(c, key, steps, through, &mut visit)?
                }
            }
            Ok(state)
        })
        .await
    }

    /// The run's data over the steps `range` through `through` as [`Part`]s, in sequence
    /// order: the summaries at `width` of the packs inside the range, the records of the
    /// rest. Runs on the blocking pool.
    pub(super) async fn scan_summarized<S: Send + 'static>(
        &self,
        key: RunKey,
        width: i64,
        range: (i64, i64),
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, Part<'_>) + Send + 'static,
    ) -> Result<S> {
        self.read(move |c| {
            let mut batches = Batches::new(key, (0, through_seq), Some(range));
            D::summarized(c, key, width, range, through_seq, &mut |row| match row {
                Row::Summary(seq, blob) => {
                    let summary = super::summary::Summary::parse(blob)
                        .ok_or(StoreError::Corrupt { run_key: key, seq })?;
                    f(&mut state, Part::Summary(summary));
                    Ok(ControlFlow::Continue(()))
                }
                Row::Blob(seq, blob) => batches.visit(seq, blob, &mut state, &mut |s, _, r| {
                    f(s, Part::Records(r));
                    ControlFlow::Continue(())
                }),
            })?;
            Ok(state)
        })
        .await
    }

    pub(super) async fn scan_values<S: Send + 'static>(
        &self,
        key: RunKey,
        after_seq: u64,
        through_seq: u64,
        mut state: S,
        mut f: impl FnMut(&mut S, i64, f64, MetricId, f64) + Send + 'static,
    ) -> Result<S> {
        self.read(move |c| {
            D::batches(c, key, after_seq, through_seq, &mut |seq, blob| {
                let corrupt = StoreError::Corrupt { run_key: key, seq };
                if !is_pack(blob) {
                    visit_values(blob, |s, t, id, v| f(&mut state, s, t, id, v)).ok_or(corrupt)?;
                    return Ok(ControlFlow::Continue(()));
                }
                visit_pack_values(blob, (after_seq, through_seq), |s, t, id, v| {
                    f(&mut state, s, t, id, v)
                })
                .ok_or(corrupt)?;
                Ok(ControlFlow::Continue(()))
            })?;
            Ok(state)
        })
        .await
    }

    pub(super) async fn step_bounds(&self, key: RunKey) -> Result<Option<(i64, i64)>> {
        self.read(move |c| D::step_bounds(c, key)).await
    }

    pub(super) async fn scan_steps<S: Send + 'static>(
        &self,
        key: RunKey,
        steps: (i64, i64),
        through_seq: u64,
        state: S,
        f: impl FnMut(&mut S, u64, &[StepRecord]) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.records(key, Which::Steps(steps, through_seq), state, f)
            .await
    }

    pub(super) async fn config(&self, key: RunKey) -> Result<Option<String>> {
        self.read(move |c| D::config(c, key)).await
    }

    pub(super) async fn items<S: Send + 'static>(
        &self,
        key: RunKey,
        query: ItemQuery,
        mut state: S,
        mut f: impl FnMut(&mut S, StoredItem) -> ControlFlow<()> + Send + 'static,
    ) -> Result<S> {
        self.read(move |c| {
            D::items(c, key, &query, &mut |item| f(&mut state, item))?;
            Ok(state)
        })
        .await
    }

    pub(super) async fn console_counts(&self, key: RunKey) -> Result<(u64, u64)> {
        self.read(move |c| D::console_counts(c, key)).await
    }

    pub(super) async fn commands(
        &self,
        key: RunKey,
        run_id: RunId,
    ) -> Result<Vec<stepstream_protocol::CommandEvent>> {
        let rows = self.read(move |c| D::commands(c, key)).await?;
        Ok(rows.into_iter().filter_map(|r| r.event(&run_id)).collect())
    }

    pub(super) async fn rules(&self) -> Result<Vec<super::commands::StoredRule>> {
        self.read(D::rules).await
    }

    pub(super) async fn acks(&self, key: RunKey) -> Result<Vec<super::commands::Acked>> {
        self.read(move |c| D::acks(c, key)).await
    }
}
