//! The spool: batches that do not fit the sender's memory budget wait in a file, in order.
//!
//! Each entry is `len u32 LE | frame`, the frame being the batch's wire encoding (so the
//! spool has no format of its own). Entries are read back first in, first out; the file is
//! emptied whenever everything in it was read, and removed when the spool is dropped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use stepstream_protocol::{Batch, ToHub};

pub struct Spool {
    path: PathBuf,
    file: File,
    read_pos: u64,
    write_pos: u64,
    batches: usize,
    /// Added to every sequence number read back (a run renumbered after the spool was written).
    pub shift: i64,
}

impl Spool {
    pub fn create(path: &Path) -> std::io::Result<Spool> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Spool {
            path: path.to_path_buf(),
            file,
            read_pos: 0,
            write_pos: 0,
            batches: 0,
            shift: 0,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    pub fn push(&mut self, batch: Batch) -> std::io::Result<()> {
        let mut batch = batch;
        // Stored under the numbering in force when read: undo the current shift.
        batch.seq = (batch.seq as i64 - self.shift) as u64;
        let frame = ToHub::Batch(batch).encode();
        self.file.seek(SeekFrom::Start(self.write_pos))?;
        self.file.write_all(&(frame.len() as u32).to_le_bytes())?;
        self.file.write_all(&frame)?;
        self.write_pos += 4 + frame.len() as u64;
        self.batches += 1;
        Ok(())
    }

    pub fn pop(&mut self) -> std::io::Result<Option<Batch>> {
        if self.batches == 0 {
            return Ok(None);
        }
        self.file.seek(SeekFrom::Start(self.read_pos))?;
        let mut len = [0u8; 4];
        self.file.read_exact(&mut len)?;
        let mut frame = vec![0u8; u32::from_le_bytes(len) as usize];
        self.file.read_exact(&mut frame)?;
        self.read_pos += 4 + frame.len() as u64;
        self.batches -= 1;
        if self.batches == 0 {
            self.file.set_len(0)?;
            self.read_pos = 0;
            self.write_pos = 0;
        }
        match ToHub::decode(&frame) {
            Ok(ToHub::Batch(mut b)) => {
                b.seq = (b.seq as i64 + self.shift) as u64;
                Ok(Some(b))
            }
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "damaged spool entry",
            )),
        }
    }
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
        }
    }

    #[test]
    fn first_in_first_out_then_empty_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.spool");
        let mut s = Spool::create(&path).unwrap();
        for seq in 1..=3 {
            s.push(batch(seq)).unwrap();
        }
        assert_eq!(s.pop().unwrap().unwrap().seq, 1);
        s.shift = 10; // renumbered: the rest come back 10 higher
        s.push(batch(14)).unwrap();
        assert_eq!(s.pop().unwrap().unwrap().seq, 12);
        assert_eq!(s.pop().unwrap().unwrap().seq, 13);
        assert_eq!(s.pop().unwrap().unwrap().seq, 14);
        assert!(s.pop().unwrap().is_none());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        drop(s);
        assert!(!path.exists());
    }
}
