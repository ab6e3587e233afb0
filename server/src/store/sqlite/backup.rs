//! `stepstream backup` and `restore`: a consistent copy of a hub's SQLite database while the
//! hub ingests (the online backup API in one step, inside one read transaction: in WAL mode
//! the hub's writer goes on meanwhile), and putting such a copy in place of a database no
//! hub has open.

use super::super::{Result, StoreError};
use super::{open_connection, schema};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// What a copy holds.
#[derive(Debug)]
pub struct Copied {
    pub runs: u64,
    pub bytes: u64,
}

fn refused(message: String) -> StoreError {
    StoreError::Schema(message)
}

/// Checks that `conn` holds a stepstream database this build can read, whole.
fn check(conn: &Connection, what: &Path) -> Result<u64> {
    let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if ok != "ok" {
        return Err(refused(format!("{} is damaged: {ok}", what.display())));
    }
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > schema::SCHEMA_VERSION {
        return Err(refused(format!(
            "{} is at schema version {version}; this build knows up to {}: upgrade stepstream",
            what.display(),
            schema::SCHEMA_VERSION
        )));
    }
    let runs: i64 = conn
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .map_err(|_| refused(format!("{} is not a stepstream database", what.display())))?;
    Ok(runs as u64)
}

/// Copies the database at `db` (a hub may be writing it) to `dest`, which must not exist:
/// the copy is the database as one read transaction saw it, checked before it is kept.
pub fn backup(db: &Path, dest: &Path) -> Result<Copied> {
    if dest.exists() {
        return Err(refused(format!(
            "{} exists: a backup never overwrites a file",
            dest.display()
        )));
    }
    if !db.exists() {
        return Err(refused(format!("no database at {}", db.display())));
    }
    let src = open_connection(db)?;
    let partial = dest.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    {
        let mut out = Connection::open(&partial)?;
        let copy = rusqlite::backup::Backup::new(&src, &mut out)?;
        // Every page in one step: one read transaction, so one consistent moment however
        // busy the hub is (stepping page by page restarts each time the hub commits).
        copy.step(-1)?;
    }
    let out = Connection::open(&partial)?;
    out.pragma_update(None, "journal_mode", "DELETE")?;
    let runs = check(&out, &partial)?;
    drop(out);
    std::fs::rename(&partial, dest).map_err(|e| refused(format!("{}: {e}", dest.display())))?;
    let bytes = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
    Ok(Copied { runs, bytes })
}

/// Puts the backup at `from` in place of the database at `db`, which no hub may have open
/// (checked: a hub holds its database's lock while it runs).
pub fn restore(from: &Path, db: &Path) -> Result<Copied> {
    let src = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let runs = check(&src, from)?;
    if db.exists() {
        let conn = Connection::open(db)?;
        // An exclusive lock is refused while any connection (a running hub's) has the
        // database open.
        conn.busy_timeout(std::time::Duration::ZERO)?;
        let free = conn
            .execute_batch("PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; COMMIT;")
            .is_ok();
        if !free {
            return Err(refused(format!(
                "{} is in use (a hub has it open): stop the hub, then restore",
                db.display()
            )));
        }
    }
    let mut out = open_connection(db)?;
    let copy = rusqlite::backup::Backup::new(&src, &mut out)?;
    copy.step(-1)?;
    drop(copy);
    check(&out, db)?;
    drop(out);
    let bytes = std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
    Ok(Copied { runs, bytes })
}
