//! [`PerfettoGuard`]: finishes the trace.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::error::PerfettoError;
use super::state::{LayerState, Msg};
use super::stats::WriteStats;

/// Finishes the trace by [`PerfettoGuard::finish`], which reports errors, or
/// when dropped: writes what is buffered, ends slices still open at the
/// finish time, and renames the file into place. After that the layer
/// records nothing more. Dropped without `finish` before anything was
/// recorded (a program that failed early), it writes no file at all.
#[must_use = "dropping the guard finishes the trace now: hold it while the program records"]
#[derive(Debug)]
pub struct PerfettoGuard {
    pub(super) state: Arc<LayerState>,
    pub(super) thread: Option<JoinHandle<Result<WriteStats, PerfettoError>>>,
}

impl PerfettoGuard {
    /// Waits until everything recorded so far is in the (temporary) file.
    pub fn flush(&self) {
        self.state.flush();
    }

    /// Finishes the file, even an empty one, and reports what was written.
    pub fn finish(mut self) -> Result<WriteStats, PerfettoError> {
        self.finish_inner(true)
    }

    fn finish_inner(&mut self, keep_empty: bool) -> Result<WriteStats, PerfettoError> {
        let Some(thread) = self.thread.take() else {
            return Ok(WriteStats::default());
        };
        self.state.closed.store(true, Ordering::SeqCst);
        // If the writer is gone, the send fails and the join reports why.
        let _ = self.state.tx.send(Msg::Finish(keep_empty));
        thread.join().map_err(|_| PerfettoError::WriterPanicked)?
    }
}

impl Drop for PerfettoGuard {
    fn drop(&mut self) {
        // A library does not print: finish() is the way to see errors.
        let _ = self.finish_inner(false);
    }
}
