//! The subscriber the overhead benchmarks launch under, as an application would: a
//! `PerfettoLayer` writing to a file in a temporary folder, so that the launch spans
//! and the device events are really recorded and written.

use std::error::Error;

use tempfile::TempDir;
use tracing::Dispatch;
use tracing_gpu::perfetto::{PerfettoError, PerfettoGuard, PerfettoLayer, WriteStats};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

/// Every span, and the device events in bulk to the Perfetto layer (no plain span per
/// device event: see `tracing_gpu::deliver`).
pub fn filter() -> EnvFilter {
    EnvFilter::new("trace,tracing_gpu::device=info")
}

/// A Perfetto trace in a temporary folder, removed with it.
pub struct PerfettoTrace {
    /// The subscriber: [`filter`] and the Perfetto layer.
    pub dispatch: Dispatch,
    guard: PerfettoGuard,
    _dir: TempDir,
}

impl PerfettoTrace {
    /// A trace `NAME.perfetto-trace` in a new temporary folder.
    pub fn new(name: &str) -> Result<Self, Box<dyn Error>> {
        let dir = tempfile::tempdir()?;
        let (layer, guard) = PerfettoLayer::builder()
            .file(dir.path().join(format!("{name}.perfetto-trace")))
            .build()?;
        let subscriber = tracing_subscriber::registry().with(filter()).with(layer);
        Ok(PerfettoTrace {
            dispatch: Dispatch::new(subscriber),
            guard,
            _dir: dir,
        })
    }

    /// Writes the trace out (call it after the profiler is dropped: its batches are
    /// then all in), and says what was written; the folder goes with `self`.
    pub fn finish(self) -> Result<WriteStats, PerfettoError> {
        self.guard.finish()
    }
}
