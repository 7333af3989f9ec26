//! What a sink receives: one [`Batch`] per profiled launch, or per part of a
//! streamed one ([`Part`]) (the decoded
//! buffer, the clock mapping, the launch as the host saw it, the device), the
//! [`HostSpan`]s a recorded run replays beside its batches, and the
//! [`BatchSink`] trait that takes them.
//!
//! This module names no sink and no transport: [`crate::deliver`] finds the
//! sinks in a subscriber, the live profiler (`crate::cuda`) and a capture file's
//! replay ([`crate::capture`]) make the batches.

use std::sync::Arc;

use crate::clock::{Calibration, HostClock};
use crate::decode::{OwnedBuffer, Slot};
use crate::registry::EventRegistry;

/// The target of the plain spans and events that device events become (see the
/// module docs for their fields).
pub const DEVICE_TARGET: &str = "tracing_gpu::device";

/// What is known of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA device ordinal.
    pub ordinal: u32,
    /// Marketing name, such as "NVIDIA H200".
    pub name: String,
    /// UUID, formatted `GPU-xxxxxxxx-xxxx-...` as nvidia-smi prints it.
    pub uuid: String,
    /// Number of SMs.
    pub sm_count: u32,
    /// Driver version, such as "580.159.04" (or the CUDA driver API version).
    pub driver_version: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// One profiled launch, as the host saw it. Times are on the trace clock
/// ([`crate::clock::HostClock::Boottime`]), in ns.
#[derive(Debug, Clone, Default)]
pub struct LaunchInfo {
    /// The host's id for this launch (also in the buffer header). Unique in the
    /// process, across devices and profilers.
    pub launch_id: u64,
    /// The name given to `gpu_profile!` (usually the kernel's). Shared, so that
    /// a launch call does not allocate it.
    pub kernel: Arc<str>,
    /// Host time read just before the launch call.
    pub host_launch_ns: u64,
    /// Host time read just after completion was observed.
    pub host_complete_ns: u64,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// The host span that wraps the launch, if any. It stays open until the
    /// batch has been delivered (see the module docs).
    pub parent: Option<tracing::span::Id>,
    /// Name of the host thread that launched.
    pub host_thread: Arc<str>,
    /// `None` for a launch delivered whole, in one batch (every launch but a
    /// streamed one). A streamed launch is delivered in parts while it runs,
    /// one batch each, all with the same `launch_id`: see [`Part`].
    pub part: Option<Part>,
}

/// Which part of a streamed launch a batch holds. Its warps' events are those
/// the host drained since the previous part; a warp's ranges never straddle
/// two parts (a range is delivered in the part that drains its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// 0 for the launch's first part, then 1, 2, ...
    pub index: u32,
    /// The launch's last part, delivered after it completed:
    /// `host_complete_ns` is the completion's, and its drop counts are final.
    /// In the parts before it, `host_complete_ns` is when the part was drained
    /// (the kernel still ran).
    pub last: bool,
}

/// Everything a sink needs to draw one launch: the decoded buffer, the clock
/// mapping, the launch and the device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The GPU.
    pub device: Arc<DeviceInfo>,
    /// The launch.
    pub launch: LaunchInfo,
    /// The decoded buffer.
    pub buffer: Arc<OwnedBuffer>,
    /// Device → host clock mapping for this device.
    pub calibration: Arc<Calibration>,
    /// Event names.
    pub registry: Arc<EventRegistry>,
}

impl Batch {
    /// A device time (`%globaltimer` ns) on the trace clock
    /// ([`HostClock::Boottime`], ns): the one mapping every output uses.
    #[inline]
    pub fn trace_ns(&self, device_ns: u64) -> u64 {
        self.calibration.to_host(HostClock::Boottime, device_ns)
    }
}

/// The synthetic thread a warp's events are drawn on:
/// `"GPU 0 / SM 12 / block 7 warp 3"` (`SM` is the warp's SM at its first event).
pub(crate) fn thread_name(device: u32, slot: &Slot<'_>) -> String {
    format!(
        "GPU {device} / SM {} / block {} warp {}",
        slot.header.sm_first, slot.header.block_linear, slot.header.warp
    )
}

/// A host `tracing` span recorded during the run, so a replay shows host and
/// device together. Times are on the trace clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSpan {
    /// Span name.
    pub name: String,
    /// `tracing` target.
    pub target: String,
    /// Name of the thread it ran on.
    pub thread_name: String,
    /// Id of that thread (OS thread id).
    pub thread_id: u64,
    /// Start (ns).
    pub start_ns: u64,
    /// End (ns), `≥ start_ns`.
    pub end_ns: u64,
    /// Index of the parent span in the run's list of host spans ([`crate::capture::Capture::host_spans`]): always an earlier one
    /// (spans are stored in the order they were created).
    pub parent: Option<u32>,
    /// For the span that wraps a launch: that launch's id.
    pub launch_id: Option<u64>,
    /// Recorded fields, as strings.
    pub fields: Vec<(String, String)>,
}

/// A consumer of whole batches. [`crate::deliver`] hands each batch to every
/// sink it finds in the subscriber (ours, `PerfettoLayer` and `OtlpLayer`, and
/// any other registered with a [`crate::deliver::SinkHandle`] or wrapped in a
/// [`crate::deliver::SinkLayer`]), in bulk, with no per-event `tracing` dispatch.
pub trait BatchSink: Send + Sync {
    /// Takes one batch. Must not block on I/O: hand the work to a writer thread.
    /// It runs on the profiler's collector thread, which delivers a streamed
    /// launch's parts one after another: a sink that walks every event here holds
    /// them back (about one core at 200 M events/s).
    /// `batch.launch.parent` names the launch span only until this returns.
    fn on_batch(&self, batch: &Arc<Batch>);
    /// Waits until everything handed over so far is written.
    fn flush(&self);
}
