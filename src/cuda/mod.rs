//! Live capture on NVIDIA GPUs (feature `cuda`): kernel compilation through
//! NVRTC, and the device side of profiling.
//!
//! cudarc loads libcuda and libnvrtc at first use and panics when they are
//! missing; every entry point here checks for them first
//! ([`ensure_libraries`]) and returns [`CudaError::LibraryMissing`] instead.
//!
//! The rooms, by the thread that runs them (docs/architecture.md, "The live
//! path"): `profiler/` (the launching threads: [`Profiler`], its builder,
//! graphs, streamed launches), `collector/` (the collector thread, a file per
//! step, with its simulated-device tests), `drain/` (a streamed launch's drain
//! threads), [`calibrate`] (the clock), `device/` (the device port and its CUDA
//! implementation, the arena), `ledger.rs` (what launching threads and the
//! collector share), `job.rs` (what a launch hands the collector) and
//! `recorder.rs` ([`CaptureRecorder`]).

pub mod calibrate;
mod collector;
mod compile;
mod device;
mod drain;
mod error;
mod job;
mod ledger;
mod profiler;
mod recorder;
mod snapshot_check;
mod traced;

pub use cudarc;

pub use compile::{
    compile, ensure_libraries, ensure_nvrtc, KernelBuild, HEADER_NAME, HEADER_PATH, HEADER_SOURCE,
};
pub use error::{CalibrateError, CudaError, ProfilerError};
pub use ledger::ProfilerStats;
pub use profiler::{ProfiledGraph, MAX_GRAPHS, MAX_GRAPH_NODES};
pub use profiler::{
    Profiler, ProfilerBuilder, DEFAULT_CAPACITY, DEFAULT_GRAPH_REGIONS, DEFAULT_MEMORY_LIMIT,
    DEFAULT_RECALIBRATION,
};
pub use profiler::{Sampled, Sampler};
pub use profiler::{Streaming, DEFAULT_STREAM_INTERVAL, DEFAULT_STREAM_MEMORY};
pub use recorder::{CaptureLayer, CaptureRecorder};
pub use traced::{TracedKernel, TracedLaunch};

/// `gpu_profile!`, re-exported here beside [`Profiler`] (it is defined at the crate root).
#[doc(no_inline)]
pub use crate::gpu_profile;

#[doc(hidden)]
pub mod __bench {
    //! What `benches/drain.rs` measures: a drain thread's work on host memory;
    //! not public API.
    pub use super::drain::Rings;
}

#[doc(hidden)]
pub mod __private {
    //! What `gpu_profile!` expands to needs, and what the device tests check
    //! snapshots with; not public API.
    pub use super::profiler::next_launch_id;
    pub use super::snapshot_check::WatchdogSnapshot;
    pub use tracing;
}
