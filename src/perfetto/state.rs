//! The layer's state, shared by the layer, its guard and its writer thread:
//! the queue to the writer thread ([`Msg`]) and each host thread's buffer.
//!
//! Each thread that emits spans owns a buffer (one writer sequence) and
//! encodes its own packets into it, under a lock nobody else takes except the
//! writer thread when it collects full chunks. A span costs a clock read and
//! two small packets; nothing crosses a channel per event. A device batch
//! crosses the queue as an `Arc`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::flows::FlowOrigins;
use super::host::HostThread;
use super::tracks::Ids;
use crate::batch::{Batch, BatchSink};
use crate::deliver::watched::Watched;

pub(super) enum Msg {
    Batch(Arc<Batch>),
    /// A watchdog's snapshot of a launch still running.
    Snapshot(Arc<Watched>),
    /// A thread has a full chunk waiting.
    Wake,
    /// Collect everything, write it, flush, then answer.
    Flush(SyncSender<()>),
    /// Write what is left and end; `true`: write the file even if nothing was
    /// recorded.
    Finish(bool),
}

#[derive(Debug)]
pub(super) struct LayerState {
    /// Tells this layer's thread buffers apart from other layers' (the
    /// address of a dropped layer could be reused).
    pub(super) id: usize,
    pub(super) closed: AtomicBool,
    pub(super) tx: SyncSender<Msg>,
    pub(super) threads: Mutex<Vec<Arc<ThreadSlot>>>,
    pub(super) ids: Arc<Ids>,
    pub(super) flow_origins: Arc<FlowOrigins>,
    pub(super) pid: i32,
    pub(super) chunk_bytes: usize,
    pub(super) queued_chunks: usize,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Batch(_) => "Batch",
            Msg::Snapshot(_) => "Snapshot",
            Msg::Wake => "Wake",
            Msg::Flush(_) => "Flush",
            Msg::Finish(_) => "Finish",
        })
    }
}

impl LayerState {
    pub(super) fn flush(&self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let (ack, done) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(ack)).is_ok() {
            let _ = done.recv();
        }
    }

    /// Hands a watchdog's snapshot to the writer thread, in order with the batches.
    pub(super) fn snapshot(&self, w: Arc<Watched>) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.tx.send(Msg::Snapshot(w));
        }
    }

    /// Runs `f` on the calling thread's buffer (created on first use), then
    /// hands a full chunk to the writer. Returns `None` once the trace is finished.
    pub(super) fn with_thread<R>(&self, f: impl FnOnce(&mut ThreadBuf) -> R) -> Option<R> {
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        let slot = LOCAL
            .try_with(|l| {
                let mut l = l.borrow_mut();
                if let Some((_, s)) = l.iter().find(|(id, _)| *id == self.id) {
                    return s.clone();
                }
                // Forget the buffers of finished layers before adding one.
                l.retain(|(_, s)| !s.buf.lock().closed);
                let s = Arc::new(ThreadSlot::new(self));
                self.threads.lock().push(s.clone());
                l.push((self.id, s.clone()));
                s
            })
            .ok()?;
        let mut b = slot.buf.lock();
        if b.closed {
            return None;
        }
        let r = f(&mut b);
        if b.host.enc.len() >= self.chunk_bytes {
            // A chunk the writer gave back: its pages are already mapped, so the
            // spans that fill it take no page faults and no allocation.
            let next = b
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(self.chunk_bytes + 256));
            let chunk = std::mem::replace(&mut b.host.enc.buf, next);
            b.full.push_back(chunk);
            if let Err(TrySendError::Disconnected(_)) = self.tx.try_send(Msg::Wake) {
                b.closed = true;
            }
            // A full queue means the writer is behind: wait for it rather
            // than grow without bound or drop half a slice.
            while b.full.len() > self.queued_chunks && !b.closed {
                slot.drained.wait(&mut b);
            }
        }
        Some(r)
    }
}

thread_local! {
    static LOCAL: RefCell<Vec<(usize, Arc<ThreadSlot>)>> = const { RefCell::new(Vec::new()) };
}

#[derive(Debug)]
pub(super) struct ThreadSlot {
    pub(super) buf: Mutex<ThreadBuf>,
    pub(super) drained: Condvar,
}

impl ThreadSlot {
    fn new(state: &LayerState) -> ThreadSlot {
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let name = std::thread::current()
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("thread {tid}"));
        ThreadSlot {
            buf: Mutex::new(ThreadBuf {
                host: HostThread::new(&state.ids, state.pid, tid, name, state.chunk_bytes + 256),
                full: VecDeque::new(),
                spare: Vec::new(),
                closed: false,
            }),
            drained: Condvar::new(),
        }
    }
}

/// One thread's track and its pending bytes.
#[derive(Debug)]
pub(super) struct ThreadBuf {
    /// The track; its names are keyed by callsite (`&'static Metadata` address).
    pub(super) host: HostThread,
    pub(super) full: VecDeque<Vec<u8>>,
    /// Written chunks given back, emptied, for the thread's next ones (at most
    /// `queued_chunks`: no more memory than the full queue held).
    pub(super) spare: Vec<Vec<u8>>,
    pub(super) closed: bool,
}

impl BatchSink for LayerState {
    fn on_batch(&self, batch: &Arc<Batch>) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.tx.send(Msg::Batch(batch.clone()));
        }
    }

    fn flush(&self) {
        LayerState::flush(self);
    }
}

#[cfg(test)]
mod tests {
    //! The layer's thread buffers: the chunks the writer has written come back
    //! for the thread's next ones, and no more of them are kept than the queue held.
    use crate::perfetto::PerfettoLayer;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn a_thread_fills_the_chunks_the_writer_gave_back_and_keeps_few() {
        let dir = tempfile::tempdir().unwrap();
        let (layer, guard) = PerfettoLayer::builder()
            .file(dir.path().join("t.perfetto-trace"))
            .chunk_bytes(4096)
            .queued_chunks(4)
            .build()
            .unwrap();
        let state = layer.state.clone();
        let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
        let spans = |n: u64| {
            tracing::dispatcher::with_default(&dispatch, || {
                for i in 0..n {
                    let s = tracing::info_span!("step", i);
                    let _e = s.enter();
                }
            })
        };
        // Many chunks: the writer takes them and gives (at most four) back.
        spans(20_000);
        guard.flush();
        let slot = state.threads.lock()[0].clone();
        let spare: Vec<*const u8> = slot.buf.lock().spare.iter().map(|c| c.as_ptr()).collect();
        assert!(
            (1..=4).contains(&spare.len()),
            "{} spare chunks",
            spare.len()
        );
        assert!(slot.buf.lock().spare.iter().all(|c| c.is_empty()));
        // The flush took the thread's partial chunk; when the next one is full, the
        // thread goes on in a spare one (its bytes start again from nothing).
        let len = || slot.buf.lock().host.enc.buf.len();
        let mut last = len();
        for made in 0.. {
            assert!(made < 10_000, "no chunk filled");
            spans(1);
            if len() < last {
                let now = slot.buf.lock().host.enc.buf.as_ptr();
                assert!(
                    spare.contains(&now),
                    "a new allocation, not a chunk given back"
                );
                break;
            }
            last = len();
        }
        guard.finish().unwrap();
    }
}
