//! The spool: batches that do not fit the sender's memory budget wait in a file, in order.
//!
//! Each entry is `len u32 LE | frame`, the frame being the batch's wire encoding (so the
//! spool has no format of its own). Entries are read back first in, first out; the file is
//! emptied whenever everything in it was read, and removed when the spool is dropped. An
//! index in memory (sequence number and record count per entry) says exactly what a damaged
//! spool lost, so the sender can account for it and close the sequence gap.
//!
//! The file lives in a folder only this user can write to (created `0700`; an existing one
//! must be owned by this user and not writable by others) and is created new (`0600`),
//! never opened if it exists: another user cannot plant a symlink where it will be written,
//! nor read the metrics.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use stepstream_protocol::{Batch, ToHub};

pub struct Spool {
    path: PathBuf,
    file: File,
    read_pos: u64,
    write_pos: u64,
    /// Per entry, oldest first: its sequence number as stored, and its records.
    index: VecDeque<(u64, usize)>,
    /// Added to every sequence number read back (a run renumbered after the spool was written).
    pub shift: i64,
}

/// The default spool folder: private to this user, under the runtime or temp folder.
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    // The effective uid: the owner of `/proc/self` (no `libc` call needed).
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0);
    base.join(format!("stepstream-spool-{uid}"))
}

/// Creates `dir` (mode 0700) or checks that the existing one is ours and private.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let me = std::fs::metadata("/proc/self")?.uid();
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "spool folder {} is not this user's own folder (a link, another owner, or \
                 writable by others)",
                dir.display()
            ),
        ));
    }
    Ok(())
}

impl Spool {
    /// A new spool file in `dir` named after `stem`, the process and the time.
    pub fn create(dir: &Path, stem: &str) -> std::io::Result<Spool> {
        use std::os::unix::fs::OpenOptionsExt;
        private_dir(dir)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = dir.join(format!("{stem}-{}-{nanos:09}.spool", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Spool {
            path,
            file,
            read_pos: 0,
            write_pos: 0,
            index: VecDeque::new(),
            shift: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// What the spool holds: `(sequence number, records)` per entry, oldest first, under the
    /// current numbering.
    pub fn entries(&self) -> Vec<(u64, usize)> {
        self.index
            .iter()
            .map(|&(seq, n)| ((seq as i64 + self.shift) as u64, n))
            .collect()
    }

    pub fn push(&mut self, batch: Batch) -> std::io::Result<()> {
        let mut batch = batch;
        // Stored under the numbering in force when read: undo the current shift.
        batch.seq = (batch.seq as i64 - self.shift) as u64;
        let (seq, n) = (batch.seq, batch.entries());
        let frame = ToHub::Batch(batch).encode();
        self.file.seek(SeekFrom::Start(self.write_pos))?;
        self.file.write_all(&(frame.len() as u32).to_le_bytes())?;
        self.file.write_all(&frame)?;
        self.write_pos += 4 + frame.len() as u64;
        self.index.push_back((seq, n));
        Ok(())
    }

    /// The oldest entry. On an error nothing is taken: [`Spool::entries`] still lists it.
    pub fn pop(&mut self) -> std::io::Result<Option<Batch>> {
        let Some(&(seq, n)) = self.index.front() else {
            return Ok(None);
        };
        self.file.seek(SeekFrom::Start(self.read_pos))?;
        let mut len = [0u8; 4];
        self.file.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > stepstream_protocol::codec::MAX_FRAME_LEN {
            return Err(damaged("an entry length beyond the frame limit"));
        }
        let mut frame = vec![0u8; len];
        self.file.read_exact(&mut frame)?;
        let mut batch = match ToHub::decode(&frame) {
            Ok(ToHub::Batch(b)) if b.seq == seq && b.entries() == n => b,
            _ => return Err(damaged("an entry that is not the batch it should be")),
        };
        self.read_pos += 4 + len as u64;
        self.index.pop_front();
        if self.index.is_empty() {
            self.file.set_len(0)?;
            self.read_pos = 0;
            self.write_pos = 0;
        }
        batch.seq = (batch.seq as i64 + self.shift) as u64;
        Ok(Some(batch))
    }
}

fn damaged(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("damaged spool: {what}"),
    )
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepstream_protocol::{MetricId, StepRecord};

    fn batch(seq: u64) -> Batch {
        Batch {
            seq,
            records: vec![StepRecord {
                step: seq as i64,
                wall_time: 1.0,
                values: vec![(MetricId(0), seq as f64)],
            }],
            items: Vec::new(),
        }
    }

    #[test]
    fn first_in_first_out_then_empty_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::create(&dir.path().join("spool"), "r").unwrap();
        let path = s.path().to_path_buf();
        for seq in 1..=3 {
            s.push(batch(seq)).unwrap();
        }
        assert_eq!(s.pop().unwrap().unwrap().seq, 1);
        s.shift = 10; // renumbered: the rest come back 10 higher
        s.push(batch(14)).unwrap();
        assert_eq!(s.entries(), vec![(12, 1), (13, 1), (14, 1)]);
        assert_eq!(s.pop().unwrap().unwrap().seq, 12);
        assert_eq!(s.pop().unwrap().unwrap().seq, 13);
        assert_eq!(s.pop().unwrap().unwrap().seq, 14);
        assert!(s.pop().unwrap().is_none());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        drop(s);
        assert!(!path.exists());
    }

    #[test]
    fn a_damaged_entry_is_an_error_and_stays_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::create(&dir.path().join("spool"), "r").unwrap();
        s.push(batch(1)).unwrap();
        s.push(batch(2)).unwrap();
        std::fs::write(s.path(), b"garbage!").unwrap();
        assert!(s.pop().is_err());
        assert_eq!(s.entries(), vec![(1, 1), (2, 1)]);
    }

    #[test]
    fn the_folder_must_be_private_and_the_file_new() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            Spool::create(&open, "r").is_err(),
            "a world-writable folder is refused"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(
            Spool::create(&link, "r").is_err(),
            "a symlinked folder is refused"
        );
        let private = dir.path().join("private");
        let s = Spool::create(&private, "r").unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(s);
    }
}
