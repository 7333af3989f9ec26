//! Device batches encoded on several threads ([`PerfettoLayerBuilder::encoder_threads`]).
//!
//! The layer's writer thread stays the one that writes the file. For each
//! batch it writes, itself, what lies above the warps ([`Core::head`](super::encode::Core::head) and
//! [`Core::kernel`](super::encode::Core::kernel): the GPU and SM descriptors, the kernel slice, the drop
//! counter), then hands the batch to every encoder thread. Encoder `i` of `n`
//! writes the warps whose key hashes to `i` ([`Shard`]): the same warps,
//! batch after batch, so each warp's lanes and their writer sequences belong
//! to one encoder, which writes their packets in order, with its own interned
//! names and its own short sequence ids. Packets of different sequences may
//! interleave in a trace; each encoder's output is written in the order it was
//! made, so every sequence stays in order. Descriptors come before the events
//! on their tracks: the SMs' go out before the batch is handed over (their
//! uuids are derived, [`sm_uuid`](super::tracks::sm_uuid), so the encoders
//! need not ask), a warp lane's in its encoder's output before its first
//! event.
//!
//! Bounds: at most [`DEPTH_PER_ENCODER`] × `n` batches are in the encoders'
//! hands (a new one waits until the oldest is written); an encoder's output
//! goes out in pieces of about [`FLUSH_AT`] bytes, or as soon as it has
//! nothing else to do, through a channel of [`OUTPUT_QUEUE`] pieces.
//!
//! [`PerfettoLayerBuilder::encoder_threads`]: super::PerfettoLayerBuilder::encoder_threads

use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::proto::Enc;
use super::tracks::Ids;
use super::warps::{Shard, WarpEncoder, FLUSH_AT};
use super::writer::TraceWriter;
use super::PerfettoError;
use crate::batch::Batch;

/// Batches each encoder may have been handed and not finished: enough that
/// an encoder whose share of one batch is small goes on with the next ones.
pub(crate) const DEPTH_PER_ENCODER: usize = 4;

/// Output pieces waiting for the writer, all encoders together.
const OUTPUT_QUEUE: usize = 16;

/// What an encoder hands back: encoded packets, and how many batches they
/// complete (their last packets are in `bytes` or in earlier pieces);
/// [`DIED`] batches: the encoder panicked (a bug), and will hand back no more.
struct Piece {
    encoder: usize,
    bytes: Vec<u8>,
    batches: u64,
    events: u64,
}

/// [`Piece::batches`] of an encoder's last word when it panics.
const DIED: u64 = u64::MAX;

/// Tells the writer that its encoder panicked, so that it does not wait for
/// it forever: the trace is lost ([`PerfettoError::WriterPanicked`]).
struct Obituary<'a> {
    encoder: usize,
    out: &'a SyncSender<Piece>,
}

impl Drop for Obituary<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.out.send(Piece {
                encoder: self.encoder,
                bytes: Vec::new(),
                batches: DIED,
                events: 0,
            });
        }
    }
}

struct Job {
    batch: Arc<Batch>,
    window: (u64, u64),
}

/// The encoder threads of one layer, seen from its writer thread.
pub(crate) struct Encoders {
    jobs: Vec<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    out: Receiver<Piece>,
    /// Batches handed out so far, and per encoder, batches it has finished
    /// and whose output is written.
    handed: u64,
    done: Vec<u64>,
}

impl std::fmt::Debug for Encoders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoders")
            .field("threads", &self.threads.len())
            .field("handed", &self.handed)
            .field("done", &self.done)
            .finish()
    }
}

impl Encoders {
    /// Starts `n` encoder threads that take their sequence ids and track
    /// uuids from `ids`. Each calls `wake` after it hands back a piece, so
    /// that a writer thread waiting for other work looks at [`Encoders::take_ready`].
    pub(crate) fn start(
        n: usize,
        ids: &Arc<Ids>,
        wake: impl Fn() + Clone + Send + 'static,
    ) -> std::io::Result<Encoders> {
        let (tx, out) = mpsc::sync_channel(OUTPUT_QUEUE);
        let (mut jobs, mut threads) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for index in 0..n {
            // Never full: at most DEPTH_PER_ENCODER × n batches are handed out.
            let (job_tx, rx) = mpsc::sync_channel(DEPTH_PER_ENCODER * n);
            let shard = Shard {
                index: index as u32,
                of: n as u32,
            };
            let (ids, tx, wake) = (ids.clone(), tx.clone(), wake.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("tracing-gpu perfetto encoder {index}"))
                .spawn(move || encode(index, shard, &ids, &rx, &tx, &wake));
            match spawned {
                Ok(t) => {
                    jobs.push(job_tx);
                    threads.push(t);
                }
                Err(e) => {
                    // The threads started end, with nothing to hand back,
                    // once their job channels close.
                    drop(jobs);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Encoders {
            jobs,
            threads,
            out,
            handed: 0,
            done: vec![0; n],
        })
    }

    /// Batches handed out whose output is not all written yet.
    fn pending(&self) -> u64 {
        self.handed - self.done.iter().min().copied().unwrap_or(self.handed)
    }

    /// Writes the batch's GPU and SM descriptors, kernel slice and drops, and
    /// hands its warps to the encoders; first writes what they have finished,
    /// waiting for the oldest batch if too many are out.
    pub(crate) fn submit<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        batch: &Arc<Batch>,
        failed: &mut Option<PerfettoError>,
    ) {
        self.take_ready(w, failed);
        while self.pending() >= (DEPTH_PER_ENCODER * self.jobs.len()) as u64 {
            if !self.take_one(w, failed) {
                return;
            }
        }
        let core = w.core();
        let head = core.head(batch);
        core.kernel(batch, &head);
        if let Err(e) = w.drain(FLUSH_AT) {
            failed.get_or_insert(e);
        }
        for jobs in &self.jobs {
            let job = Job {
                batch: batch.clone(),
                window: head.window,
            };
            // Cannot fail while the encoder lives; if it died, take_one says so.
            let _ = jobs.send(job);
        }
        self.handed += 1;
    }

    /// Writes what the encoders have handed back, without waiting.
    pub(crate) fn take_ready<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        failed: &mut Option<PerfettoError>,
    ) {
        loop {
            match self.out.try_recv() {
                Ok(p) => self.write(w, p, failed),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    failed.get_or_insert(PerfettoError::WriterPanicked);
                    return;
                }
            }
        }
    }

    /// Waits until every batch handed out is written.
    pub(crate) fn wait_all<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        failed: &mut Option<PerfettoError>,
    ) {
        while self.pending() > 0 && self.take_one(w, failed) {}
    }

    /// Waits for one piece and writes it; `false` if an encoder died.
    fn take_one<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        failed: &mut Option<PerfettoError>,
    ) -> bool {
        match self.out.recv() {
            Ok(p) => {
                self.write(w, p, failed);
                true
            }
            Err(_) => {
                failed.get_or_insert(PerfettoError::WriterPanicked);
                false
            }
        }
    }

    fn write<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        p: Piece,
        failed: &mut Option<PerfettoError>,
    ) {
        if failed.is_none() && !p.bytes.is_empty() {
            if let Err(e) = w.write_raw(&p.bytes) {
                *failed = Some(e);
            }
        }
        w.core().stats.device_events += p.events;
        if p.batches == DIED {
            failed.get_or_insert(PerfettoError::WriterPanicked);
        }
        self.done[p.encoder] = self.done[p.encoder].saturating_add(p.batches);
    }
}

impl Drop for Encoders {
    fn drop(&mut self) {
        // Closing the job channels ends the threads once their queues are
        // empty; emptying the output channel lets them hand back what they
        // were writing.
        self.jobs.clear();
        while self.out.recv().is_ok() {}
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// An encoder thread: encodes its shard of every batch it is handed, and
/// hands the output back at about [`FLUSH_AT`] bytes, and whenever no batch
/// is waiting (so that nothing stays behind while the layer is idle).
fn encode(
    encoder: usize,
    shard: Shard,
    ids: &Ids,
    jobs: &Receiver<Job>,
    out: &SyncSender<Piece>,
    wake: &dyn Fn(),
) {
    let _obituary = Obituary { encoder, out };
    let mut warps = WarpEncoder::default();
    let mut enc = Enc::with_capacity(FLUSH_AT + (64 << 10));
    let (mut batches, mut events) = (0u64, 0u64);
    // Hands back what `enc` holds; `false` once the writer is gone.
    let hand_back = |enc: &mut Enc, batches: &mut u64, events: &mut u64| {
        let bytes = std::mem::replace(&mut enc.buf, Vec::with_capacity(FLUSH_AT + (64 << 10)));
        let piece = Piece {
            encoder,
            bytes,
            batches: std::mem::take(batches),
            events: std::mem::take(events),
        };
        let sent = out.send(piece).is_ok();
        wake();
        sent
    };
    loop {
        let job = match jobs.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Empty) => {
                if (batches > 0 || !enc.is_empty())
                    && !hand_back(&mut enc, &mut batches, &mut events)
                {
                    return;
                }
                match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                }
            }
            Err(TryRecvError::Disconnected) => return,
        };
        let r = warps.batch(ids, &mut enc, &job.batch, job.window, shard, &mut |enc| {
            // The writer is gone (finished or failed): nobody to tell.
            let (mut none, mut no_events) = (0, 0);
            if hand_back(enc, &mut none, &mut no_events) {
                Ok(())
            } else {
                Err(PerfettoError::WriterPanicked)
            }
        });
        match r {
            Ok(n) => {
                events += n;
                batches += 1;
            }
            Err(_) => return,
        }
        if enc.len() > FLUSH_AT && !hand_back(&mut enc, &mut batches, &mut events) {
            return;
        }
    }
}
