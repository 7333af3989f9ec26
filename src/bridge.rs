//! The bridge from decoded device captures to the `tracing` world: [`Batch`],
//! the [`BatchSink`] trait our layers implement, and delivery.

use std::sync::Arc;

use crate::clock::Calibration;
use crate::decode::OwnedCapture;
use crate::registry::EventRegistry;

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
    /// The host's id for this launch (also in the buffer header).
    pub launch_id: u64,
    /// The name given to `gpu_profile!` (usually the kernel's).
    pub kernel: String,
    /// Host time read just before the launch call.
    pub host_launch_ns: u64,
    /// Host time read just after completion was observed.
    pub host_complete_ns: u64,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// The host span that wraps the launch, if any.
    pub parent: Option<tracing::span::Id>,
    /// Name of the host thread that launched.
    pub host_thread: String,
}

/// Everything a sink needs to draw one launch: the decoded capture, the clock
/// mapping, the launch and the device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The GPU.
    pub device: Arc<DeviceInfo>,
    /// The launch.
    pub launch: LaunchInfo,
    /// The decoded buffer.
    pub capture: Arc<OwnedCapture>,
    /// Device → host clock mapping for this device.
    pub calibration: Arc<Calibration>,
    /// Event names.
    pub registry: Arc<EventRegistry>,
}

/// A consumer of whole batches: our own layers implement it, so device events
/// reach them in bulk, with no per-event `tracing` dispatch.
pub trait BatchSink: Send + Sync {
    /// Takes one batch. Must not block on I/O: hand the work to a writer thread.
    fn on_batch(&self, batch: &Arc<Batch>);
    /// Waits until everything handed over so far is written.
    fn flush(&self);
}
