//! TFRecord framing, as TensorBoard's event files use it: each record is
//!
//! ```text
//! u64 length (little endian) | u32 masked CRC32C of the length bytes | data | u32 masked CRC32C of data
//! ```
//!
//! with `masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`. Both checksums are verified:
//! a damaged record is an error, never a value. A record cut short at the end of the file (a
//! writer mid-record) is "not yet": the reader stops before it and resumes there later.

/// The mask TensorFlow applies to stored CRCs.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record at byte {offset}: the length's checksum does not match (a damaged file)")]
    LengthChecksum { offset: u64 },
    #[error("record at byte {offset}: the data's checksum does not match (a damaged file)")]
    DataChecksum { offset: u64 },
    #[error("record at byte {offset}: {length} bytes is more than a scalar event needs")]
    TooLong { offset: u64, length: u64 },
}

/// Records longer than this are refused: scalar events are tiny, and a damaged length must
/// not make the reader allocate gigabytes.
pub const MAX_RECORD: u64 = 64 << 20;

/// Whole records of a buffer, where the next one starts, and the damage that stopped the
/// split, if any (the records before it are good).
pub type Split<'a> = (Vec<&'a [u8]>, usize, Option<RecordError>);

/// Splits `buf` (bytes of a file from `base` on) into whole records; stops at a record cut
/// short (to be read later) or at a damaged one (an error, after the good ones).
pub fn split(buf: &[u8], base: u64) -> Split<'_> {
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let offset = base + at as u64;
        let Some(head) = buf.get(at..at + 12) else {
            return (out, at, None);
        };
        let len_bytes = &head[..8];
        let length = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let stored = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if masked_crc(len_bytes) != stored {
            return (out, at, Some(RecordError::LengthChecksum { offset }));
        }
        if length > MAX_RECORD {
            return (out, at, Some(RecordError::TooLong { offset, length }));
        }
        let end = at + 12 + length as usize + 4;
        let Some(rest) = buf.get(at + 12..end) else {
            return (out, at, None);
        };
        let (data, crc) = rest.split_at(length as usize);
        if masked_crc(data) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return (out, at, Some(RecordError::DataChecksum { offset }));
        }
        out.push(data);
        at = end;
    }
}

/// One framed record (for tests and tools that write event files).
pub fn frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_its_mask() {
        // CRC-32C's check value, and the mask TensorFlow's crc32c::Mask applies.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // ((crc >> 15) | (crc << 17)) + 0xa282ead8, worked by hand for that check value.
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn whole_records_cut_ones_wait_damaged_ones_are_errors() {
        let mut file = frame(b"first");
        file.extend(frame(b"second record"));
        let (records, next, damage) = split(&file, 0);
        assert_eq!(records, [&b"first"[..], &b"second record"[..]]);
        assert_eq!((next, damage), (file.len(), None));
        // A writer mid-record: the whole ones, and where to resume.
        let cut = &file[..file.len() - 3];
        let (records, next, damage) = split(cut, 0);
        assert_eq!(records.len(), 1);
        assert_eq!((next, damage), (frame(b"first").len(), None));
        // One flipped bit in the second record's data: the first is still good.
        let first = frame(b"first").len();
        let mut bad = file.clone();
        bad[first + 14] ^= 1;
        let (records, next, damage) = split(&bad, 0);
        assert_eq!((records.len(), next), (1, first));
        assert_eq!(
            damage,
            Some(RecordError::DataChecksum {
                offset: first as u64
            })
        );
        let mut bad = file.clone();
        bad[0] ^= 1;
        assert_eq!(
            split(&bad, 7).2,
            Some(RecordError::LengthChecksum { offset: 7 })
        );
        // A huge length with a valid checksum is refused, not allocated.
        let len = u64::MAX.to_le_bytes();
        let mut huge = len.to_vec();
        huge.extend_from_slice(&masked_crc(&len).to_le_bytes());
        assert!(matches!(
            split(&huge, 0).2,
            Some(RecordError::TooLong { .. })
        ));
    }
}
