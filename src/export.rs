//! `stepstream export`: runs' metrics from a hub into files, one per run, as Parquet (for
//! pandas, polars, DuckDB: `read_parquet('DIR/*.parquet')` reads them together) or CSV,
//! through the API (`/api/runs/{id}/metrics.parquet`), with a read token. Each file is
//! written beside its name and renamed when whole, so a file never holds half a run.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use stepstream_protocol::RunId;

use crate::api::Failure;

#[derive(clap::Args)]
pub struct ExportArgs {
    /// The ids of the runs to export.
    runs: Vec<String>,
    /// Every run of this project (repeatable), besides the runs named.
    #[arg(long)]
    project: Vec<String>,
    /// The folder the files go into (made if missing): RUN_ID.parquet (or .csv) each.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// `parquet` (typed columns, the run's config in the file's metadata) or `csv`.
    #[arg(long, default_value = "parquet", value_parser = ["parquet", "csv"])]
    format: String,
    #[command(flatten)]
    from: crate::Reading,
}

pub fn export(args: ExportArgs) -> Result<()> {
    let api = args.from.api()?;
    let get = |path: &str| api.request("GET", path).call().map_err(|e| api.failed(e));
    let mut runs: Vec<String> = args.runs.clone();
    if !args.project.is_empty() {
        let listed = match get("/api/runs") {
            Ok(r) => crate::api::json(r, "the run list")?,
            Err(Failure::Refused(code, why)) => {
                bail!("the hub refused the run list ({code}): {why}")
            }
            Err(Failure::Unreachable(e)) => return Err(e),
        };
        for r in listed["runs"].as_array().into_iter().flatten() {
            let in_project = r["project"]
                .as_str()
                .is_some_and(|p| args.project.iter().any(|want| want == p));
            if let Some(id) = r["run_id"].as_str().filter(|_| in_project) {
                if !runs.iter().any(|have| have == id) {
                    runs.push(id.to_string());
                }
            }
        }
    }
    if runs.is_empty() {
        bail!("no run to export: name runs, or a --project that has some");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot make {}", args.out.display()))?;
    let mut failed = 0;
    for run in &runs {
        let run = RunId::new(run.clone()).map_err(anyhow::Error::msg)?;
        let path = args.out.join(format!("{run}.{}", args.format));
        match get(&format!("/api/runs/{run}/metrics.{}", args.format)) {
            Ok(r) => {
                let bytes = save(r, &path)?;
                println!("run {run}: {} ({bytes} bytes)", path.display());
            }
            Err(Failure::Refused(code, why)) => {
                eprintln!("run {run} not exported ({code}): {why}");
                failed += 1;
            }
            Err(Failure::Unreachable(e)) => return Err(e),
        }
    }
    if failed > 0 {
        bail!("{failed} of {} runs not exported", runs.len());
    }
    Ok(())
}

/// Writes the answer's body to `path` through a file beside it, renamed once whole; the
/// bytes written.
fn save(answer: ureq::Response, path: &std::path::Path) -> Result<u64> {
    let part = path.with_extension("part");
    let mut file =
        std::fs::File::create(&part).with_context(|| format!("cannot write {}", part.display()))?;
    let copied = std::io::copy(&mut answer.into_reader(), &mut file);
    let done = copied.and_then(|n| file.flush().and(file.sync_all()).map(|_| n));
    match done {
        Ok(n) => {
            std::fs::rename(&part, path)
                .with_context(|| format!("cannot rename {}", part.display()))?;
            Ok(n)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e).with_context(|| {
                format!("the hub's answer broke off; {} not written", path.display())
            })
        }
    }
}
