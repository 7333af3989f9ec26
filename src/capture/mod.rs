//! The capture file (`.tgpu`): everything needed to replay a profiled run without
//! the GPU — devices, raw clock calibration samples, the event registry, every
//! launch with its raw trace buffer, and the host spans recorded around them.
//! The CLI's `convert`, `report` and `demo` read it, and so do the tests.
//!
//! The layout is in `docs/capture.md`: a small uncompressed header (magic, version,
//! body length) and a zlib-compressed body of little-endian, length-prefixed
//! fields. Reading is strict and never panics: every trace buffer is decoded
//! (structure only; the registry names ids, it does not filter them), device
//! references, span parents and times are checked, and each fault is a
//! [`CaptureError`].
//!
//! Clock samples are stored raw, as measured; a reader refits them, so a better
//! fit later improves old captures too.
//!
//! [`Capture::read`] holds the whole capture in memory. [`CaptureReader`] reads
//! one of any size in bounded memory: everything but the launches first, then
//! the launches one at a time ([`CaptureReader::launches`],
//! [`CaptureReader::batches`]), each decoded and checked as it comes. Both read
//! through the same decoder and accept the same files.

use std::sync::Arc;

use crate::batch::{DeviceInfo, HostSpan, LaunchInfo, Part};
use crate::clock::{HostClock, HostOffsets, Sample};
use crate::decode::OwnedBuffer;
use crate::registry::EventRegistry;

mod body;
mod codec;
mod error;
mod reader;
mod replay;
mod snapshot;
#[cfg(test)]
mod tests;
mod trace;

pub use error::CaptureError;
pub use reader::{Batches, CaptureReader, Launches};
#[cfg(any(test, feature = "cuda"))]
pub(crate) use snapshot::KeptSnapshot;

/// The metadata key under which a capture says why it holds no host spans
/// (written by the live recorder when its layer was not in the subscriber).
pub const HOST_SPANS_NOTE: &str = "host_spans";

/// The first 8 bytes of every capture file.
///
/// This constant and the three below describe the file's first bytes for the
/// tests that build and corrupt captures by hand; `docs/capture.md` is the
/// reference, and [`Capture`] reads and writes them.
#[doc(hidden)]
pub const CAPTURE_MAGIC: [u8; 8] = *b"TGPUDUMP";
/// The version this crate writes. It also reads
/// [`CAPTURE_OLDEST_VERSION`] and every version in between.
#[doc(hidden)]
pub const CAPTURE_VERSION: u32 = 4;
/// The oldest version this crate reads: version 1 has no payload names in its
/// registry (`docs/capture.md`).
#[doc(hidden)]
pub const CAPTURE_OLDEST_VERSION: u32 = 1;
/// Bytes before the compressed body: magic, version, body length.
#[doc(hidden)]
pub const CAPTURE_HEADER_SIZE: usize = 20;
/// The most memory a reader gives to what it keeps of a capture: the metadata,
/// the devices with their calibration samples, the registry, the host spans and
/// the launches, each item counted at its in-memory size as it is read
/// ([`CaptureError::OverLimit`] past it). A trace buffer counts what its
/// flushed slots hold (an empty slot costs nothing, however many the buffer
/// declares): all of them in [`Capture::read`], one launch at a time in a
/// [`CaptureReader`]. A zlib body inflates about 1000 to 1, so without such a
/// bound a file of a few hundred kilobytes could ask for gigabytes.
pub const CAPTURE_MEMORY_LIMIT: usize = 256 << 20;

/// The longest name a capture may hold, in bytes: kernel, thread and event
/// names, among others (`docs/capture.md`, "Reading in bounded memory"). A
/// reader refuses a longer one ([`CaptureError::LongName`]) before reading it,
/// so that no output copies more than this of a name, however often it uses it.
pub const MAX_NAME_LEN: usize = 4 << 10;

/// One calibration of a device: the raw samples, on the trace clock
/// ([`crate::clock::HostClock::Boottime`]), and the other host clocks' offsets
/// from it, measured right after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CalibrationRound {
    /// Host (BOOTTIME) before, device `%globaltimer`, host after.
    pub samples: Vec<Sample>,
    /// `CLOCK_REALTIME − CLOCK_BOOTTIME` (ns).
    pub realtime_offset_ns: i64,
    /// `CLOCK_MONOTONIC − CLOCK_BOOTTIME` (ns).
    pub monotonic_offset_ns: i64,
    /// `CLOCK_MONOTONIC_RAW − CLOCK_BOOTTIME` (ns).
    pub monotonic_raw_offset_ns: i64,
    /// How far each offset may be off (ns).
    pub offset_uncertainty_ns: u64,
    /// The device timer's step (ns) the live fit assumed (the calibrator
    /// measures it); the refit uses the same. 0: not measured, the
    /// [`FitOptions`](crate::clock::FitOptions) default applies.
    pub timer_step_ns: u64,
}

/// A GPU and its calibrations, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureDevice {
    /// What is known of the GPU.
    pub info: DeviceInfo,
    /// Calibration rounds in time order (the first before the first launch).
    pub calibrations: Vec<CalibrationRound>,
}

/// One profiled launch: [`LaunchInfo`] without its span id (which means nothing
/// outside the process), the device, and the validated trace buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureLaunch {
    /// Ordinal of the device (one of [`Capture::devices`]).
    pub device: u32,
    /// The host's id for the launch (the buffer header has the same).
    pub launch_id: u64,
    /// Kernel name.
    pub kernel: String,
    /// Trace-clock time just before the launch call (ns).
    pub host_launch_ns: u64,
    /// Trace-clock time just after completion was observed (ns).
    pub host_complete_ns: u64,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Name of the launching host thread.
    pub host_thread: String,
    /// Which part of a streamed launch this is ([`LaunchInfo::part`]): a
    /// streamed launch is held as one launch record per part, in order, all
    /// with its launch id. `None`: a launch recorded whole.
    pub part: Option<Part>,
    /// The decoded trace buffer (of a part: that part's events).
    pub buffer: Arc<OwnedBuffer>,
}

impl CaptureLaunch {
    /// A launch record from the live [`LaunchInfo`] (its `parent` is dropped).
    pub fn new(device: u32, info: &LaunchInfo, buffer: Arc<OwnedBuffer>) -> CaptureLaunch {
        CaptureLaunch {
            device,
            launch_id: info.launch_id,
            kernel: info.kernel.to_string(),
            host_launch_ns: info.host_launch_ns,
            host_complete_ns: info.host_complete_ns,
            grid: info.grid,
            block: info.block,
            host_thread: info.host_thread.to_string(),
            part: info.part,
            buffer,
        }
    }

    /// The [`LaunchInfo`] a replay hands on (`parent` is `None`: link replayed
    /// launches to host spans through [`HostSpan::launch_id`]).
    pub fn info(&self) -> LaunchInfo {
        LaunchInfo {
            launch_id: self.launch_id,
            kernel: self.kernel.as_str().into(),
            host_launch_ns: self.host_launch_ns,
            host_complete_ns: self.host_complete_ns,
            grid: self.grid,
            block: self.block,
            parent: None,
            host_thread: self.host_thread.as_str().into(),
            part: self.part,
        }
    }
}

/// A whole capture file, in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capture {
    /// Free-form key/value notes (tool version, command line, host name).
    pub metadata: Vec<(String, String)>,
    /// The GPUs, each with its calibrations.
    pub devices: Vec<CaptureDevice>,
    /// Event id → name.
    pub registry: EventRegistry,
    /// The launches, in launch order.
    pub launches: Vec<CaptureLaunch>,
    /// Host spans, in creation order.
    pub host_spans: Vec<HostSpan>,
}

impl Capture {
    /// The name of the recorded process: the program of the `command` note
    /// (the recorder writes it), or `"host"`.
    pub fn process_name(&self) -> &str {
        self.metadata
            .iter()
            .find(|(k, _)| k == "command")
            .and_then(|(_, cmd)| cmd.split_whitespace().next())
            .and_then(|prog| prog.rsplit('/').next())
            .filter(|p| !p.is_empty())
            .unwrap_or("host")
    }

    /// `CLOCK_REALTIME − CLOCK_BOOTTIME` (ns) as measured with the run's first
    /// calibration: what moves its trace-clock times to wall time. A capture
    /// with no calibration gets this machine's offset now.
    pub fn realtime_offset_ns(&self) -> i64 {
        self.devices
            .iter()
            .find_map(|d| d.calibrations.first())
            .map_or_else(
                || HostOffsets::measure().of(HostClock::Realtime),
                |c| c.realtime_offset_ns,
            )
    }
}
