//! The envelope and the only use of bincode in stepstream.
//!
//! Every frame is `MAGIC (2 bytes "SS") | VERSION (1 byte) | KIND (1 byte) | payload`, where
//! the payload is the bincode 2 encoding (standard config: little endian, varint integers,
//! IEEE-754 floats as 8 raw bytes) of the message struct that `KIND` names. Decoding checks the
//! magic, the version, the kind, a size limit and that the payload is consumed exactly, so a
//! damaged or foreign frame is an error, never a panic and never a silently wrong message.
//!
//! bincode is unmaintained (RUSTSEC-2025-0141); keeping it behind this module means replacing
//! it touches one file, and the golden files in `tests/golden/` show whether bytes changed.

use serde::{de::DeserializeOwned, Serialize};

/// First two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"SS";
/// The wire version this build speaks. Bump it on any change to a payload's bytes.
pub const VERSION: u8 = 9;
/// Frames above this size are refused by every decoder (and by the hub before decoding).
pub const MAX_FRAME_LEN: usize = 16 << 20;
/// Length of the envelope header.
pub const HEADER_LEN: usize = 4;

type Config = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_FRAME_LEN>,
>;

fn config() -> Config {
    bincode::config::standard().with_limit::<MAX_FRAME_LEN>()
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame is shorter than the 4-byte envelope header.
    #[error("frame of {0} bytes is shorter than the 4-byte envelope")]
    Truncated(usize),
    /// The first two bytes are not `SS`: not a stepstream frame.
    #[error("not a stepstream frame (magic {0:02x?}, expected \"SS\")")]
    BadMagic([u8; 2]),
    /// The frame was written by a peer speaking another wire version.
    #[error("unsupported wire version {got} (this build speaks version {supported})")]
    UnsupportedVersion { got: u8, supported: u8 },
    /// The kind byte names no message this side accepts.
    #[error("unexpected message kind 0x{kind:02x} for {expected}")]
    UnexpectedKind { kind: u8, expected: &'static str },
    /// The frame is larger than [`MAX_FRAME_LEN`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte limit")]
    TooLarge(usize),
    /// The payload does not decode as the message its kind names.
    #[error("malformed {kind} payload: {reason}")]
    Malformed { kind: &'static str, reason: String },
}

/// Encodes `payload` inside the envelope with the given kind byte.
pub(crate) fn encode_frame<T: Serialize>(kind: u8, payload: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind);
    // Writing into a Vec cannot fail, and every message type serializes (no maps with
    // non-string keys, no unsized sequences), so an error here is a programming bug.
    bincode::serde::encode_into_std_write(payload, &mut out, config())
        .expect("stepstream messages always encode");
    out
}

/// Checks the envelope and returns the kind byte and the payload bytes.
pub(crate) fn open_frame(bytes: &[u8]) -> Result<(u8, &[u8]), DecodeError> {
    if bytes.len() > MAX_FRAME_LEN {
        return Err(DecodeError::TooLarge(bytes.len()));
    }
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::Truncated(bytes.len()));
    }
    let magic = [bytes[0], bytes[1]];
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    if bytes[2] != VERSION {
        return Err(DecodeError::UnsupportedVersion {
            got: bytes[2],
            supported: VERSION,
        });
    }
    Ok((bytes[3], &bytes[HEADER_LEN..]))
}

/// Decodes a payload as `T`, refusing trailing bytes.
pub(crate) fn decode_payload<T: DeserializeOwned>(
    kind: &'static str,
    payload: &[u8],
) -> Result<T, DecodeError> {
    let malformed = |reason: String| DecodeError::Malformed { kind, reason };
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(payload, config())
        .map_err(|e| malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(malformed(format!(
            "{} trailing bytes after the message",
            payload.len() - used
        )));
    }
    Ok(value)
}
