//! The layer's writer thread: takes the host threads' chunks and the device
//! batches off the queue, encodes each batch itself ([`TraceWriter::write_batch`])
//! or hands its warps to the encoder threads ([`Encoders`]), and writes
//! everything through one [`TraceWriter`].
//!
//! Memory is bounded: each thread keeps at most [`PerfettoLayerBuilder::queued_chunks`]
//! full chunks waiting for the writer (then it waits for the writer to catch
//! up), the batch queue holds at most [`PerfettoLayerBuilder::batch_queue`] batches,
//! and the encoders at most 4 groups of batches per encoder thread.
//!
//! [`PerfettoLayerBuilder::queued_chunks`]: super::PerfettoLayerBuilder::queued_chunks
//! [`PerfettoLayerBuilder::batch_queue`]: super::PerfettoLayerBuilder::batch_queue

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use super::error::PerfettoError;
use super::output::Output;
use super::parallel::Encoders;
use super::state::{LayerState, Msg, ThreadSlot};
use super::stats::WriteStats;
use super::writer::TraceWriter;
use crate::clock::HostClock;

/// Marks every thread buffer closed when the writer stops, however it stops,
/// so that no thread waits for it forever.
struct CloseOnExit<'a>(&'a LayerState);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        for slot in self.0.threads.lock().iter() {
            slot.buf.lock().closed = true;
            slot.drained.notify_all();
        }
    }
}

/// Collects the threads' chunks (all of them if `all`, else only full
/// ones) and writes them. At the finish, also ends the slices still open.
fn collect(
    state: &LayerState,
    w: &mut TraceWriter<Output>,
    all: bool,
    finish: bool,
    failed: &mut Option<PerfettoError>,
) {
    let slots: Vec<Arc<ThreadSlot>> = state.threads.lock().clone();
    let now = HostClock::Boottime.now_ns();
    for slot in &slots {
        let (chunks, rest, slices) = {
            let mut b = slot.buf.lock();
            if finish {
                while b.host.depth > 0 {
                    b.host.end(now);
                }
                b.closed = true;
            }
            let chunks = std::mem::take(&mut b.full);
            let rest = if all {
                std::mem::take(&mut b.host.enc.buf)
            } else {
                Vec::new()
            };
            (chunks, rest, std::mem::take(&mut b.host.slices))
        };
        slot.drained.notify_all();
        w.add_host_slices(slices);
        for c in chunks.iter().chain(std::iter::once(&rest)) {
            if failed.is_none() && !c.is_empty() {
                if let Err(e) = w.write_raw(c) {
                    *failed = Some(e);
                }
            }
        }
        if !chunks.is_empty() {
            let mut b = slot.buf.lock();
            let room = state.queued_chunks.saturating_sub(b.spare.len());
            b.spare.extend(chunks.into_iter().take(room).map(|mut c| {
                c.clear();
                c
            }));
        }
    }
    // Threads that are gone, and whose bytes are written, need no slot.
    state
        .threads
        .lock()
        .retain(|s| Arc::strong_count(s) > 2 || !s.buf.lock().host.enc.is_empty());
}

pub(super) fn run_writer(
    state: &LayerState,
    rx: Receiver<Msg>,
    mut w: TraceWriter<Output>,
    mut encoders: Option<Encoders>,
) -> Result<WriteStats, PerfettoError> {
    let _close = CloseOnExit(state);
    let mut failed: Option<PerfettoError> = None;
    // Whether a trace with nothing in it is still written (see PerfettoGuard).
    let mut keep_empty = true;
    let handle = |msg: Msg,
                  w: &mut TraceWriter<Output>,
                  failed: &mut Option<PerfettoError>,
                  encoders: &mut Option<Encoders>| {
        let r = match msg {
            Msg::Batch(b) => {
                collect(state, w, false, false, failed);
                match (&mut *encoders, failed.is_none()) {
                    (_, false) => {}
                    (Some(e), true) => e.submit(w, &b, failed),
                    (None, true) => {
                        if let Err(e) = w.write_batch(&b) {
                            *failed = Some(e);
                        }
                    }
                }
                None
            }
            Msg::Snapshot(s) => {
                if failed.is_none() {
                    if let Err(e) = w.write_snapshot(s) {
                        *failed = Some(e);
                    }
                }
                None
            }
            Msg::Wake => {
                collect(state, w, false, false, failed);
                None
            }
            Msg::Flush(ack) => {
                if let Some(e) = encoders {
                    e.wait_all(w, failed);
                }
                collect(state, w, true, false, failed);
                if failed.is_none() {
                    if let Err(e) = w.flush() {
                        *failed = Some(e);
                    }
                }
                let _ = ack.send(());
                None
            }
            Msg::Finish(keep) => Some(keep),
        };
        // What the encoders finished meanwhile (they send a Wake for each).
        if let Some(e) = encoders {
            e.take_ready(w, failed);
        }
        r
    };
    loop {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // Nothing waits: the encoders get the batches gathered so far.
                if let Some(e) = &mut encoders {
                    e.hand_out(&mut w, &mut failed);
                }
                match rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => break,
                }
            }
        };
        if let Some(keep) = handle(msg, &mut w, &mut failed, &mut encoders) {
            keep_empty = keep;
            break;
        }
    }
    // Batches queued before the finish are still written.
    while let Ok(msg) = rx.try_recv() {
        handle(msg, &mut w, &mut failed, &mut encoders);
    }
    if failed.is_none() {
        write_unfinished(&mut w, &mut encoders, &mut failed);
    }
    if let Some(mut e) = encoders.take() {
        e.wait_all(&mut w, &mut failed);
    }
    collect(state, &mut w, true, true, &mut failed);
    if let Some(e) = failed {
        return Err(e); // The AtomicFile is dropped uncommitted: no file.
    }
    let (out, stats) = w.finish()?;
    if keep_empty || stats.host_slices > 0 || stats.kernels > 0 {
        out.commit()?;
    }
    Ok(stats)
}

/// The launches still running at the end: their kernel slices, then their warps'
/// ranges open at the latest snapshot, through the encoder that writes each warp.
fn write_unfinished(
    w: &mut TraceWriter<Output>,
    encoders: &mut Option<Encoders>,
    failed: &mut Option<PerfettoError>,
) {
    let all = match w.write_unfinished() {
        Ok(all) => all,
        Err(e) => {
            *failed = Some(e);
            return;
        }
    };
    for watched in all {
        match encoders {
            Some(e) => e.open(w, watched, failed),
            None => {
                if let Err(e) = w.write_open(&watched) {
                    *failed = Some(e);
                    return;
                }
            }
        }
    }
}
