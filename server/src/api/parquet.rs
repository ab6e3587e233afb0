//! `GET /api/runs/{id}/metrics.parquet`: a run's records as one Parquet file, for pandas,
//! polars, DuckDB and Spark users. The columns are the CSV export's, typed: `run_id`
//! (a string, dictionary-coded: the files of several runs concatenate), `step` (INT64),
//! `timestamp` (DOUBLE, unix seconds exactly as logged), `time` (the same as a UTC
//! TIMESTAMP in microseconds, for readers that want a date), then one nullable DOUBLE per
//! metric (null where a step did not log it; NaN and the infinities as they were). The
//! run's identity and config ride in the file's key-value metadata (`stepstream.run`).
//!
//! Streamed a row group (65,536 steps) at a time: the hub holds one row group, whatever the
//! run's length, and a client that stops reading holds no database connection.

use super::{download, find, ApiError, EXPORT_STALL};
use crate::auth::Scope;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::Response;
use parquet::basic::{
    Compression, LogicalType, Repetition, TimeUnit, TimestampType, Type as Physical,
};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use stepstream_protocol::{utc_stamp, MetricDef, MetricId, RunIdentity, StepRecord};

/// Steps per row group: a reader's unit of work, and what the hub holds while exporting.
const ROW_GROUP: usize = 65_536;

/// Columns before the metrics'.
const LEADING: [&str; 4] = ["run_id", "step", "timestamp", "time"];

/// One row group's steps, column by column.
#[derive(Default)]
pub struct Rows {
    steps: Vec<i64>,
    wall: Vec<f64>,
    /// Per metric: its values, and a definition level per step (1: logged, 0: null).
    metrics: Vec<(Vec<f64>, Vec<i16>)>,
}

impl Rows {
    fn new(width: usize) -> Rows {
        Rows {
            metrics: vec![Default::default(); width],
            ..Rows::default()
        }
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Adds a record; `column` maps a metric id to its column.
    pub fn push(&mut self, r: &StepRecord, column: &HashMap<MetricId, usize>) {
        self.steps.push(r.step);
        self.wall.push(r.wall_time);
        for (_, levels) in &mut self.metrics {
            levels.push(0);
        }
        for &(id, v) in &r.values {
            if let Some(&i) = column.get(&id) {
                let (values, levels) = &mut self.metrics[i];
                // A metric once per record: the level just pushed is this step's.
                if let Some(level) = levels.last_mut().filter(|l| **l == 0) {
                    *level = 1;
                    values.push(v);
                }
            }
        }
    }
}

/// A Parquet file being written into memory, taken out a row group at a time.
pub struct RunFile {
    writer: SerializedFileWriter<Vec<u8>>,
    run_id: ByteArray,
}

impl RunFile {
    /// The file's schema and metadata for `identity` with `metrics`, in that column order.
    pub fn new(identity: &RunIdentity, metrics: &[MetricDef]) -> parquet::errors::Result<RunFile> {
        let mut fields = vec![
            Arc::new(
                Type::primitive_type_builder("run_id", Physical::BYTE_ARRAY)
                    .with_repetition(Repetition::REQUIRED)
                    .with_logical_type(Some(LogicalType::String))
                    .build()?,
            ),
            Arc::new(
                Type::primitive_type_builder("step", Physical::INT64)
                    .with_repetition(Repetition::REQUIRED)
                    .build()?,
            ),
            Arc::new(
                Type::primitive_type_builder("timestamp", Physical::DOUBLE)
                    .with_repetition(Repetition::REQUIRED)
                    .build()?,
            ),
            Arc::new(
                Type::primitive_type_builder("time", Physical::INT64)
                    .with_repetition(Repetition::REQUIRED)
                    .with_logical_type(Some(LogicalType::Timestamp(TimestampType {
                        is_adjusted_to_u_t_c: true,
                        unit: TimeUnit::MICROS,
                    })))
                    .build()?,
            ),
        ];
        for m in metrics {
            fields.push(Arc::new(
                Type::primitive_type_builder(&column_name(&m.name), Physical::DOUBLE)
                    .with_repetition(Repetition::OPTIONAL)
                    .build()?,
            ));
        }
        let schema = Type::group_type_builder("stepstream_run")
            .with_fields(fields)
            .build()?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP))
            .set_created_by(format!("stepstream {}", env!("CARGO_PKG_VERSION")))
            .build();
        let mut writer = SerializedFileWriter::new(Vec::new(), Arc::new(schema), Arc::new(props))?;
        let run = serde_json::json!({
            "run_id": identity.run_id.as_str(),
            "project": identity.project,
            "name": identity.name,
            "host": identity.host,
            "rank": identity.rank,
            "world_size": identity.world_size,
            "job": identity.job,
            "framework": identity.framework,
            "started_at": identity.started_at,
            "config": serde_json::from_str::<serde_json::Value>(&identity.config_json)
                .unwrap_or_else(|_| identity.config_json.clone().into()),
        });
        writer.append_key_value_metadata(KeyValue::new(
            "stepstream.run".to_string(),
            run.to_string(),
        ));
        Ok(RunFile {
            writer,
            run_id: ByteArray::from(identity.run_id.as_str()),
        })
    }

    /// Writes `rows` as one row group; returns the bytes of the file written so far and not
    /// yet taken.
    pub fn write(&mut self, rows: &Rows) -> parquet::errors::Result<Vec<u8>> {
        if !rows.is_empty() {
            let n = rows.len();
            let micros: Vec<i64> = rows
                .wall
                .iter()
                .map(|t| (t * 1e6).round().clamp(i64::MIN as f64, i64::MAX as f64) as i64)
                .collect();
            let mut group = self.writer.next_row_group()?;
            let mut i = 0;
            while let Some(mut column) = group.next_column()? {
                match i {
                    0 => {
                        column.typed::<ByteArrayType>().write_batch(
                            &vec![self.run_id.clone(); n],
                            None,
                            None,
                        )?;
                    }
                    1 => {
                        column
                            .typed::<Int64Type>()
                            .write_batch(&rows.steps, None, None)?;
                    }
                    2 => {
                        column
                            .typed::<DoubleType>()
                            .write_batch(&rows.wall, None, None)?;
                    }
                    3 => {
                        column
                            .typed::<Int64Type>()
                            .write_batch(&micros, None, None)?;
                    }
                    _ => {
                        let (values, levels) = &rows.metrics[i - LEADING.len()];
                        column
                            .typed::<DoubleType>()
                            .write_batch(values, Some(levels), None)?;
                    }
                }
                column.close()?;
                i += 1;
            }
            group.close()?;
        }
        self.writer.flush()?;
        Ok(std::mem::take(self.writer.inner_mut()))
    }

    /// Writes the footer; the file's last bytes.
    pub fn finish(self) -> parquet::errors::Result<Vec<u8>> {
        self.writer.into_inner()
    }
}

/// A metric's column: its name, unless a leading column has it.
fn column_name(metric: &str) -> String {
    if LEADING.contains(&metric) {
        format!("{metric} (metric)")
    } else {
        metric.to_string()
    }
}

fn failed(e: impl std::fmt::Display) -> std::io::Error {
    tracing::error!(error = %e, "Parquet export failed");
    std::io::Error::other(e.to_string())
}

pub async fn export(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = find(&app, &id, &scope).await?;
    let (metrics, last_seq, identity) =
        run.state(|st| (st.metrics.clone(), st.tail.last_seq, st.identity.clone()));
    let column: Arc<HashMap<MetricId, usize>> =
        Arc::new(metrics.iter().enumerate().map(|(i, m)| (m.id, i)).collect());
    let width = metrics.len();
    let file = RunFile::new(&identity, &metrics)
        .map_err(|e| ApiError::BadRequest(format!("cannot export this run as Parquet: {e}")))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    let store = app.hub.store.clone();
    let key = run.key;
    tokio::spawn(async move {
        let mut file = Some(file);
        let mut from = 0u64;
        loop {
            let column = column.clone();
            let read = store
                .scan(
                    key,
                    from,
                    last_seq,
                    (Rows::new(width), from),
                    move |(rows, last), seq, records| {
                        *last = seq;
                        for r in records {
                            rows.push(r, &column);
                        }
                        if rows.len() >= ROW_GROUP {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    },
                )
                .await;
            let (rows, last) = match read {
                Ok(read) => read,
                Err(e) => {
                    let _ = tx.send(Err(failed(e))).await;
                    return;
                }
            };
            let done = last == from || last >= last_seq;
            let mut writing = file
                .take()
                .expect("the file is put back after each row group");
            // Encoding a row group is CPU work: off the runtime's workers.
            let written = tokio::task::spawn_blocking(move || {
                let bytes = writing.write(&rows)?;
                if done {
                    let mut bytes = bytes;
                    bytes.extend(writing.finish()?);
                    Ok((bytes, None))
                } else {
                    Ok((bytes, Some(writing)))
                }
            })
            .await;
            let bytes = match written {
                Ok(Ok((bytes, back))) => {
                    file = back;
                    bytes
                }
                Ok(Err(e)) => {
                    let e: parquet::errors::ParquetError = e;
                    let _ = tx.send(Err(failed(e))).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(failed(e))).await;
                    return;
                }
            };
            let sent = tokio::time::timeout(EXPORT_STALL, tx.send(Ok(Bytes::from(bytes)))).await;
            if !matches!(sent, Ok(Ok(()))) || done {
                return;
            }
            from = last;
        }
    });
    let name = format!("run_{}_metrics.parquet", utc_stamp(identity.started_at));
    Ok(download(rx, "application/vnd.apache.parquet", &name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    /// Written, then read back by the crate's own reader: every value's bits, nulls where a
    /// step logged nothing, the metadata, a metric named like a leading column.
    #[test]
    fn a_run_file_reads_back_exactly() {
        let identity = crate::store::test_identity("pq", "p");
        let metrics = vec![
            MetricDef {
                id: MetricId(3),
                name: "loss".into(),
            },
            MetricDef {
                id: MetricId(7),
                name: "step".into(),
            },
        ];
        let column: HashMap<MetricId, usize> =
            metrics.iter().enumerate().map(|(i, m)| (m.id, i)).collect();
        let specials = [f64::NAN, -0.0, f64::INFINITY, f64::NEG_INFINITY, 5e-324];
        let records: Vec<StepRecord> = (0..150_000i64)
            .map(|s| StepRecord {
                step: s * 3 - 7,
                wall_time: 1.7e9 + s as f64 * 0.013,
                values: match s % 4 {
                    0 => vec![(MetricId(3), specials[(s / 4) as usize % 5])],
                    1 => vec![(MetricId(7), s as f64), (MetricId(3), 1.0 / s as f64)],
                    2 => Vec::new(),
                    _ => vec![(MetricId(3), -(s as f64))],
                },
            })
            .collect();
        let mut file = RunFile::new(&identity, &metrics).unwrap();
        let mut bytes = Vec::new();
        for chunk in records.chunks(ROW_GROUP) {
            let mut rows = Rows::new(2);
            for r in chunk {
                rows.push(r, &column);
            }
            bytes.extend(file.write(&rows).unwrap());
        }
        bytes.extend(file.finish().unwrap());
        let reader = SerializedFileReader::new(Bytes::from(bytes)).unwrap();
        let meta = reader.metadata().file_metadata();
        assert_eq!(meta.num_rows(), records.len() as i64);
        assert_eq!(reader.metadata().num_row_groups(), 3);
        let kv = meta.key_value_metadata().unwrap();
        assert!(kv[0].value.as_ref().unwrap().contains("\"run_id\":\"pq\""));
        let names: Vec<String> = meta
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "run_id",
                "step",
                "timestamp",
                "time",
                "loss",
                "step (metric)"
            ]
        );
        let bits = |f: &Field| match f {
            Field::Double(v) => Some(v.to_bits()),
            Field::Null => None,
            other => panic!("{other:?}"),
        };
        for (row, r) in reader.get_row_iter(None).unwrap().zip(&records) {
            let row = row.unwrap();
            let cols: Vec<&Field> = row.get_column_iter().map(|(_, f)| f).collect();
            assert_eq!(cols[0], &Field::Str("pq".into()));
            assert_eq!(cols[1], &Field::Long(r.step));
            assert_eq!(bits(cols[2]), Some(r.wall_time.to_bits()));
            let want = |id| {
                r.values
                    .iter()
                    .find(|(i, _)| *i == MetricId(id))
                    .map(|(_, v)| v.to_bits())
            };
            assert_eq!(bits(cols[4]), want(3), "step {}", r.step);
            assert_eq!(bits(cols[5]), want(7), "step {}", r.step);
        }
    }
}
