//! [`CaptureError`]: why a capture file could not be read or written.

use std::io;
use std::path::PathBuf;

use super::{CAPTURE_OLDEST_VERSION, CAPTURE_VERSION};
use crate::clock::ClockError;
use crate::decode::DecodeError;
use crate::registry::RegistryError;

/// Why a capture file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Opening, reading or writing the file failed.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Reading from or writing to a stream failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Not a capture file.
    #[error("not a tracing-gpu capture: magic {found:?}")]
    BadMagic {
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// A version this reader does not know.
    #[error("unsupported capture version {found} (this reader reads {CAPTURE_OLDEST_VERSION} to {CAPTURE_VERSION})")]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The file ends inside its header or its body.
    #[error("capture truncated: {what}")]
    Truncated {
        /// Where it ended.
        what: String,
    },
    /// The compressed body does not inflate.
    #[error("capture body is not a valid zlib stream: {0}")]
    CorruptStream(io::Error),
    /// The body does not parse.
    #[error("capture body corrupt at byte {offset}: {what}")]
    Corrupt {
        /// Offset within the uncompressed body.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// The registry holds one id twice with two names.
    #[error("capture registry: {0}")]
    Registry(#[from] RegistryError),
    /// Two devices with one ordinal.
    #[error("device ordinal {ordinal} appears twice")]
    DuplicateDevice {
        /// The ordinal.
        ordinal: u32,
    },
    /// Two launches with one launch id (not the parts of one streamed
    /// launch): a host span's flow would have two ends.
    #[error("launch id {launch_id} appears twice")]
    DuplicateLaunch {
        /// The launch id.
        launch_id: u64,
    },
    /// The parts of a streamed launch out of order: not numbered 0, 1, 2, ...
    /// in file order, or one after the last.
    #[error("launch id {launch_id}: {what}")]
    BadParts {
        /// The launch id.
        launch_id: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// What the reader keeps of the capture would pass [`CAPTURE_MEMORY_LIMIT`](super::CAPTURE_MEMORY_LIMIT).
    #[error("capture body byte {offset}: what the reader keeps would need more than {limit} bytes of memory (the reader's limit)")]
    OverLimit {
        /// Offset within the uncompressed body of the count, string or
        /// trace buffer slot that passed the limit.
        offset: usize,
        /// The limit, [`CAPTURE_MEMORY_LIMIT`](super::CAPTURE_MEMORY_LIMIT).
        limit: usize,
    },
    /// A name longer than [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes.
    #[error("capture body byte {offset}: a {what} of {len} bytes (a name has at most {max} bytes)", max = super::MAX_NAME_LEN)]
    LongName {
        /// Offset within the uncompressed body of the name's length.
        offset: usize,
        /// What it names: `kernel name`, `thread name`, `event name`...
        what: &'static str,
        /// Its length.
        len: u32,
    },
    /// A launch on a device the file does not describe.
    #[error("launch {launch}: device ordinal {ordinal} is not in the capture")]
    UnknownDevice {
        /// Index of the launch.
        launch: usize,
        /// The ordinal it names.
        ordinal: u32,
    },
    /// A launch's trace buffer does not decode.
    #[error("launch {launch}: {source}")]
    Decode {
        /// Index of the launch.
        launch: usize,
        /// The decoder's error.
        source: DecodeError,
    },
    /// A launch's metadata disagrees with its buffer header.
    #[error("launch {launch}: {field} differs from the trace buffer's header")]
    LaunchMismatch {
        /// Index of the launch.
        launch: usize,
        /// The field: `launch_id`, `grid` or `block`.
        field: &'static str,
    },
    /// A device's calibration samples do not fit a clock map.
    #[error("device {device}, calibration round {round}: {source}")]
    Clock {
        /// Device ordinal.
        device: u32,
        /// Index of the calibration round.
        round: usize,
        /// The fit's error.
        source: ClockError,
    },
    /// A launch on a device that has no calibration round.
    #[error("launch {launch}: device {device} has no calibration")]
    NoCalibration {
        /// Index of the launch.
        launch: usize,
        /// Device ordinal.
        device: u32,
    },
    /// A count or string too long for the format's 32-bit lengths.
    #[error("capture too large: a count or string exceeds 2^32 - 1")]
    TooLarge,
    /// A host span that is not well formed.
    #[error("host span {span}: {what}")]
    BadSpan {
        /// Index of the span.
        span: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A watchdog snapshot's warps note that does not read (docs/capture.md,
    /// "Watchdog snapshots").
    #[error("metadata note {note} (a watchdog snapshot's warps){}: {what}", at_line(*.line))]
    BadSnapshot {
        /// Index of the note in the metadata.
        note: usize,
        /// The line of its value, from 1; 0: the note as a whole.
        line: usize,
        /// What was wrong.
        what: &'static str,
    },
}

/// `", line 3"`; nothing for line 0 (the note as a whole).
fn at_line(line: usize) -> String {
    match line {
        0 => String::new(),
        n => format!(", line {n}"),
    }
}
