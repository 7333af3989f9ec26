//! The subscriber the overhead benchmarks launch under, as an application would: a
//! `PerfettoLayer` writing to a file in a temporary folder, so that the launch spans
//! and the device events are really recorded and written; and, for a benchmark that
//! checks what was delivered, a sink of its own beside it.

use std::error::Error;
use std::sync::Arc;

use tempfile::TempDir;
use tracing::Dispatch;
use tracing_gpu::batch::BatchSink;
use tracing_gpu::deliver::SinkLayer;
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
        let (dir, layer, guard) = open(name)?;
        let subscriber = tracing_subscriber::registry().with(filter()).with(layer);
        Ok(PerfettoTrace {
            dispatch: Dispatch::new(subscriber),
            guard,
            _dir: dir,
        })
    }

    /// [`PerfettoTrace::new`], with `sink` given every batch too; returns it.
    pub fn with_sink<T: BatchSink + 'static>(
        name: &str,
        sink: T,
    ) -> Result<(Self, Arc<T>), Box<dyn Error>> {
        let (dir, layer, guard) = open(name)?;
        let sink = SinkLayer::new(sink)?;
        let shared = sink.sink().clone();
        let subscriber = tracing_subscriber::registry()
            .with(filter())
            .with(layer)
            .with(sink);
        let trace = PerfettoTrace {
            dispatch: Dispatch::new(subscriber),
            guard,
            _dir: dir,
        };
        Ok((trace, shared))
    }

    /// Writes the trace out (call it after the profiler is dropped: its batches are
    /// then all in), and says what was written; the folder goes with `self`.
    pub fn finish(self) -> Result<WriteStats, PerfettoError> {
        self.guard.finish()
    }
}

/// A new temporary folder, and a Perfetto layer writing `NAME.perfetto-trace` there.
fn open(name: &str) -> Result<(TempDir, PerfettoLayer, PerfettoGuard), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let (layer, guard) = PerfettoLayer::builder()
        .file(dir.path().join(format!("{name}.perfetto-trace")))
        .build()?;
    Ok((dir, layer, guard))
}
