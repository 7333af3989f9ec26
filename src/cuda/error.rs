//! The errors of the live path: one per boundary, each keeping its source.

use std::time::Duration;

use cudarc::driver::DriverError;

use crate::capture::CaptureError;
use crate::clock::ClockError;
use crate::decode::DecodeError;
use crate::registry::RegistryError;

/// Errors from the CUDA side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// libcuda or libnvrtc could not be loaded.
    #[error("{0} could not be loaded: no NVIDIA driver or CUDA toolkit on this machine (or not on the library path)")]
    LibraryMissing(&'static str),
    /// A driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC rejected a kernel.
    #[error("NVRTC could not compile {name}: {message}")]
    Compile {
        /// The program's name.
        name: String,
        /// NVRTC's log, or the failure.
        message: String,
    },
}

/// Errors of device clock calibration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrateError {
    /// The CUDA side failed (libraries, driver, compilation).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The samples could not be fitted.
    #[error("clock fit: {0}")]
    Fit(#[from] ClockError),
    /// The GPU did not answer a round in time (a GPU too busy to start a
    /// one-thread kernel, or a kernel that failed to launch). The kernel was
    /// not waited on: it returns, unanswered, whenever it starts.
    #[error("the calibration kernel did not answer round {round} within {} ms (it is left queued and returns when it starts)", timeout.as_millis())]
    Timeout {
        /// The round that went unanswered.
        round: usize,
        /// How long the host waited.
        timeout: Duration,
    },
    /// Nothing was launched: the calibration kernels given up on after earlier
    /// timeouts are all still queued, and hold the calibrator's memory
    /// (`calibrate::LANES` slots) until they have run.
    #[error("{kernels} calibration kernels that timed out are still queued behind other work on the GPU; no new one is launched until one has run")]
    Stuck {
        /// Kernels still queued.
        kernels: usize,
    },
    /// A request that cannot be served.
    #[error("{0}")]
    Invalid(&'static str),
}

impl From<DriverError> for CalibrateError {
    fn from(e: DriverError) -> Self {
        CalibrateError::Cuda(CudaError::Driver(e))
    }
}

/// Errors from profiling.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfilerError {
    /// A CUDA library is missing, or a driver call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// No GPU with that ordinal.
    #[error("no GPU with ordinal {ordinal}: this machine has {count}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// GPUs present.
        count: usize,
    },
    /// The stream belongs to another context than the profiler's.
    #[error("the stream belongs to another CUDA context (device {stream_device}) than this profiler's (device {profiler_device})")]
    WrongContext {
        /// The profiler's device.
        profiler_device: usize,
        /// The stream's device.
        stream_device: usize,
    },
    /// A launch shape with an empty dimension.
    #[error("launch shape has an empty dimension: grid {grid:?}, block {block:?}")]
    EmptyLaunch {
        /// Grid in blocks.
        grid: [u32; 3],
        /// Block in threads.
        block: [u32; 3],
    },
    /// The trace buffer for this launch is larger than the arena.
    #[error("the trace buffer for this launch needs {needed} bytes ({slots} warps × {capacity} records); the profiler's limit is {limit} bytes (ProfilerBuilder::memory_limit, ::capacity)")]
    BufferTooLarge {
        /// Bytes needed.
        needed: u128,
        /// Warp slots in the launch.
        slots: u64,
        /// Records per slot.
        capacity: u32,
        /// The arena's size.
        limit: usize,
    },
    /// A launch's buffer did not decode.
    #[error("launch {launch_id}: the trace buffer did not decode: {source}")]
    Decode {
        /// The launch.
        launch_id: u64,
        /// Why.
        source: DecodeError,
    },
    /// A slot of a streamed launch did not decode; the launch went on without it.
    #[error("launch {launch_id}: slot {slot} of the streamed trace did not decode: {source}")]
    Stream {
        /// The launch.
        launch_id: u64,
        /// The slot.
        slot: u32,
        /// Why.
        source: DecodeError,
    },
    /// A profiled graph's replays went out of step with `Profiler::launch_graph`:
    /// it was replayed another way (`cuGraphLaunch` on its executable graph,
    /// another instantiation of it), or its executable graph was updated in
    /// place. The replays brought back from then on are counted as skipped,
    /// and later calls to `launch_graph` for it return this error without
    /// launching (docs/architecture.md, "CUDA graphs").
    #[error("graph {graph:?} is out of step: when its replay {replay} had finished, the device had run {device} replays of it and Profiler::launch_graph had made {launched}. It was replayed outside launch_graph (cuGraphLaunch, or another instantiation of its graph), or its executable graph was updated in place; launch_graph refuses it from now on. Replay a profiled graph only through Profiler::launch_graph, and to change one, capture it again and adopt the new graph with Profiler::graph")]
    GraphOutOfStep {
        /// The graph's name, as given to `launch_graph`.
        graph: String,
        /// The host's number of the replay after which the counts were compared.
        replay: u64,
        /// Replays the device had run then.
        device: u64,
        /// Replays `launch_graph` had made then.
        launched: u64,
    },
    /// Event names conflict.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The clock could not be calibrated (or a checkpoint did not follow the last).
    #[error("clock calibration failed: {0}")]
    Calibration(#[from] CalibrateError),
    /// The capture file could not be written.
    #[error("capture file: {0}")]
    Capture(#[from] CaptureError),
    /// The collector thread could not be started.
    #[error("cannot start the collector thread: {0}")]
    Thread(std::io::Error),
    /// The collector thread is gone (a sink panicked).
    #[error("the collector thread has stopped (a sink panicked); launches since were not traced")]
    CollectorGone,
    /// Anything else wrong with a request.
    #[error("{0}")]
    Invalid(String),
}

impl From<DriverError> for ProfilerError {
    fn from(e: DriverError) -> Self {
        ProfilerError::Cuda(CudaError::Driver(e))
    }
}
