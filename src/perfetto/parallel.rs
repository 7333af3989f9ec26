//! Device batches encoded on several threads
//! ([`PerfettoLayerBuilder::encoder_threads`]).
//!
//! The layer's writer thread stays the one that writes the file. For each batch
//! it writes, itself, what lies above the warps ([`TraceWriter::write_head`]:
//! the GPU and SM descriptors, the kernel slice, the events-lost counter), then
//! hands the batch to every encoder thread. Encoder `i` of `n` writes the warps
//! given to `i` ([`Owners`](super::owners::Owners): a warp seen first goes to
//! the encoder given the fewest events so far): the same warps, batch after
//! batch, so each warp's lanes and their writer sequences belong to one
//! encoder, which writes their packets in order, with its own interned names
//! and its own one-byte sequence ids. Packets of different sequences may
//! interleave in a trace; each encoder's output is written in the order it was
//! made, so every sequence stays in order.
//! Descriptors come before the events on their tracks: the SMs' go out
//! before the batch is handed over (their uuids are derived,
//! [`sm_uuid`](super::tracks::sm_uuid), so the encoders need not ask), a
//! warp lane's in its encoder's output before its first event.
//!
//! Bounds: at most [`DEPTH_PER_ENCODER`] × `n` groups of batches (a group
//! closes at [`GROUP_BATCHES`] batches or [`GROUP_EVENTS`] events) are in the
//! encoders' hands (a new one waits until the oldest is written). An
//! encoder's output goes out in pieces of at most about [`FLUSH_AT`] bytes
//! (each deflated by the encoder into one `compressed_packets` packet if the
//! trace is compressed: deflating costs several times what encoding does, and
//! on the writer thread it bounded the whole layer to one core's rate),
//! or as soon as it has nothing else to do, through a channel of
//! [`OUTPUT_QUEUE`] pieces, in buffers that the writer gives back: at most
//! `OUTPUT_QUEUE + 2` of them per encoder.
//!
//! [`PerfettoLayerBuilder::encoder_threads`]: super::PerfettoLayerBuilder::encoder_threads

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::PerfettoError;
use super::proto::Enc;
use super::tracks::Ids;
use super::warps::{WarpEncoder, FLUSH_AT};
use super::writer::{compressed_packet, TraceWriter};
use crate::batch::Batch;
use crate::deliver::watched::Watched;

/// Groups of batches each encoder may have been handed and not finished:
/// enough that an encoder whose share of one group is small goes on with the
/// next ones.
pub(crate) const DEPTH_PER_ENCODER: usize = 4;

/// Batches are handed out in groups, closed at this many batches or once
/// they hold [`GROUP_EVENTS`] events (so a large batch closes its group): a
/// storm of short launches then costs the threads one hand-over (and the
/// encoders one wake-up) per group rather than per launch. A group goes out
/// early when no batch waits for the writer.
const GROUP_BATCHES: usize = 64;
const GROUP_EVENTS: u64 = 32 << 10;

/// When the encoders deflate their output (`PerfettoLayerBuilder::compress`,
/// `compress_when_behind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deflate {
    /// Never: the packets as they are.
    Never,
    /// Every piece, at this zlib level.
    Always(u32),
    /// A piece made while the writer is behind ([`Duty`]): the output (a
    /// disk) takes less than the encoders make, so it gets fewer bytes for CPU
    /// time the encoders have; otherwise as it is.
    WhenBehind(u32),
}

/// How long the writer thread spends in writing encoders' pieces, over
/// windows of [`Duty::WINDOW`]: a writer busy writing half of a window or
/// more is behind (the output, not the encoders, sets the pace). Pieces
/// waiting in the output queue would not say it: the writer thread also
/// hands the encoders their work, so a slow output starves them first.
#[derive(Debug)]
struct Duty {
    since: Instant,
    busy: Duration,
    behind: Arc<AtomicBool>,
}

impl Duty {
    const WINDOW: Duration = Duration::from_millis(50);

    /// One write of `took`, ended at `now`.
    fn add(&mut self, took: Duration, now: Instant) {
        self.busy += took;
        let span = now.saturating_duration_since(self.since);
        if span >= Self::WINDOW {
            self.behind.store(self.busy * 2 >= span, Ordering::Relaxed);
            (self.since, self.busy) = (now, Duration::ZERO);
        }
    }
}

/// Output pieces waiting for the writer, all encoders together. Each
/// encoder then owns at most this many buffers plus the one it fills and the
/// one being written (about [`FLUSH_AT`] each): the writer gives them back.
const OUTPUT_QUEUE: usize = 4;

/// What an encoder hands back: encoded packets, and how many groups they
/// complete (their last packets are in `bytes` or in earlier pieces);
/// [`DIED`] groups: the encoder panicked (a bug), and will hand back no more.
struct Piece {
    encoder: usize,
    /// The packets from `start` on (a compressed piece's head is written
    /// just before its body: `writer::compressed_packet`).
    bytes: Vec<u8>,
    start: usize,
    groups: u64,
    events: u64,
}

/// [`Piece::groups`] of an encoder's last word when it panics.
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
                start: 0,
                groups: DIED,
                events: 0,
            });
        }
    }
}

/// A group of batches, each with its device time window ([`TraceWriter::write_head`]).
type Group = Arc<[(Arc<Batch>, (u64, u64))]>;

/// What an encoder is handed: a group of batches, or, at the end of the trace, a
/// launch still running whose warps' open ranges are to be written.
enum Job {
    Batches(Group),
    Open(Arc<Watched>),
}

/// The encoder threads of one layer, seen from its writer thread.
pub(crate) struct Encoders {
    jobs: Vec<SyncSender<Job>>,
    /// Per encoder: its written pieces' buffers, given back to be reused
    /// (never more than the pieces in flight).
    spare: Vec<mpsc::Sender<Vec<u8>>>,
    threads: Vec<JoinHandle<()>>,
    out: Receiver<Piece>,
    /// The writer's time in writes ([`Deflate::WhenBehind`]).
    duty: Duty,
    /// The group being gathered, and its events.
    group: Vec<(Arc<Batch>, (u64, u64))>,
    group_events: u64,
    /// Groups handed out so far, and per encoder, groups it has finished
    /// and whose output is written.
    handed: u64,
    done: Vec<u64>,
}

impl std::fmt::Debug for Encoders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoders")
            .field("threads", &self.threads.len())
            .field("group", &self.group.len())
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
        deflate: Deflate,
        wake: impl Fn() + Clone + Send + 'static,
    ) -> std::io::Result<Encoders> {
        let (tx, out) = mpsc::sync_channel(OUTPUT_QUEUE);
        let behind = Arc::new(AtomicBool::new(false));
        let (mut jobs, mut threads, mut spare) = (Vec::new(), Vec::new(), Vec::new());
        // The one-byte sequence ids left, dealt out now: drawn as each
        // encoder needs them, they would go to whichever asks first.
        let mut short = vec![Vec::new(); n];
        for k in 0.. {
            let id = ids.sequence();
            if id >= 128 {
                break;
            }
            short[k % n].push(id);
        }
        for (index, short) in short.into_iter().enumerate() {
            // Never full: at most DEPTH_PER_ENCODER × n groups are handed out.
            let (job_tx, rx) = mpsc::sync_channel(DEPTH_PER_ENCODER * n);
            let (spare_tx, spare_rx) = mpsc::channel();
            let (ids, tx, wake) = (ids.clone(), tx.clone(), wake.clone());
            let behind = behind.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tracing-gpu perfetto encoder {index}"))
                .spawn(move || {
                    let warps = WarpEncoder::sharded(index, n, short);
                    let out = Out {
                        tx: &tx,
                        deflate,
                        behind: &behind,
                        wake: &wake,
                    };
                    encode(index, warps, &ids, (&rx, &spare_rx), out)
                });
            match spawned {
                Ok(t) => {
                    jobs.push(job_tx);
                    threads.push(t);
                    spare.push(spare_tx);
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
            spare,
            threads,
            out,
            duty: Duty {
                since: Instant::now(),
                busy: Duration::ZERO,
                behind,
            },
            group: Vec::new(),
            group_events: 0,
            handed: 0,
            done: vec![0; n],
        })
    }

    /// Groups handed out whose output is not all written yet.
    fn pending(&self) -> u64 {
        self.handed - self.done.iter().min().copied().unwrap_or(self.handed)
    }

    /// Writes the batch's GPU and SM descriptors, kernel slice and events lost, and
    /// adds the batch to the group for the encoders (handed out when full);
    /// first writes what they have finished.
    pub(crate) fn submit<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        batch: &Arc<Batch>,
        failed: &mut Option<PerfettoError>,
    ) {
        self.take_ready(w, failed);
        let window = match w.write_head(batch) {
            Ok(window) => window,
            Err(e) => {
                failed.get_or_insert(e);
                return;
            }
        };
        self.group.push((batch.clone(), window));
        self.group_events += batch.buffer.event_count();
        if self.group.len() >= GROUP_BATCHES || self.group_events >= GROUP_EVENTS {
            self.hand_out(w, failed);
        }
    }

    /// Hands the group gathered so far to the encoders, after waiting (and
    /// writing what they make) while too many groups are out.
    pub(crate) fn hand_out<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        failed: &mut Option<PerfettoError>,
    ) {
        if self.group.is_empty() {
            return;
        }
        while self.pending() >= (DEPTH_PER_ENCODER * self.jobs.len()) as u64 {
            if !self.take_one(w, failed) {
                break;
            }
        }
        let group: Group = std::mem::take(&mut self.group).into();
        self.group_events = 0;
        for jobs in &self.jobs {
            // Cannot fail while the encoder lives; if it died, take_one says so.
            let _ = jobs.send(Job::Batches(group.clone()));
        }
        self.handed += 1;
    }

    /// Hands every encoder a launch still running at the end of the trace: each
    /// writes the open ranges of the warps it owns ([`WarpEncoder::open`]), after
    /// every batch handed out before.
    pub(crate) fn open<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        watched: Arc<Watched>,
        failed: &mut Option<PerfettoError>,
    ) {
        self.hand_out(w, failed);
        while self.pending() >= (DEPTH_PER_ENCODER * self.jobs.len()) as u64 {
            if !self.take_one(w, failed) {
                break;
            }
        }
        for jobs in &self.jobs {
            let _ = jobs.send(Job::Open(watched.clone()));
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

    /// Hands out the group gathered so far and waits until every batch
    /// submitted is written.
    pub(crate) fn wait_all<W: Write>(
        &mut self,
        w: &mut TraceWriter<W>,
        failed: &mut Option<PerfettoError>,
    ) {
        self.hand_out(w, failed);
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
            let t = Instant::now();
            if let Err(e) = w.write_encoded(&p.bytes[p.start..]) {
                *failed = Some(e);
            }
            let now = Instant::now();
            self.duty.add(now - t, now);
        }
        // A dead encoder's channel is gone: the buffer is freed then.
        let _ = self.spare[p.encoder].send(p.bytes);
        w.add_device_events(p.events);
        if p.groups == DIED {
            failed.get_or_insert(PerfettoError::WriterPanicked);
        }
        self.done[p.encoder] = self.done[p.encoder].saturating_add(p.groups);
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

/// Where an encoder's output goes: the writer's channel, deflated first as
/// `deflate` says (`behind`: whether the writer is, [`Duty`]), and who to
/// wake then.
struct Out<'a> {
    tx: &'a SyncSender<Piece>,
    deflate: Deflate,
    behind: &'a AtomicBool,
    wake: &'a dyn Fn(),
}

impl Out<'_> {
    /// The zlib level the next piece goes out at, if any.
    fn level(&self) -> Option<u32> {
        match self.deflate {
            Deflate::Never => None,
            Deflate::Always(level) => Some(level),
            Deflate::WhenBehind(level) => self.behind.load(Ordering::Relaxed).then_some(level),
        }
    }
}

/// An encoder thread: encodes its shard of every batch it is handed, and
/// hands the output back at about [`FLUSH_AT`] bytes, and whenever no batch
/// is waiting (so that nothing stays behind while the layer is idle).
fn encode(
    encoder: usize,
    mut warps: WarpEncoder,
    ids: &Ids,
    (jobs, spare): (&Receiver<Job>, &Receiver<Vec<u8>>),
    out: Out<'_>,
) {
    let _obituary = Obituary {
        encoder,
        out: out.tx,
    };
    let mut enc = Enc::with_capacity(FLUSH_AT + (64 << 10));
    let (mut groups, mut events) = (0u64, 0u64);
    // Hands back what `enc` holds; `false` once the writer is gone.
    let hand_back = |enc: &mut Enc, groups: &mut u64, events: &mut u64| {
        // A buffer the writer is done with, or a new one (while there are
        // fewer than the pieces in flight).
        let mut next = spare
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(FLUSH_AT + (64 << 10)));
        let (bytes, start) = match out.level() {
            None => {
                next.clear();
                (std::mem::replace(&mut enc.buf, next), 0)
            }
            Some(level) => {
                // Writing into a Vec cannot fail; were it to, the obituary
                // tells the writer (the trace is lost, not hung).
                let start = compressed_packet(level, &enc.buf, &mut next)
                    .expect("deflating into memory does not fail");
                enc.clear();
                (next, start)
            }
        };
        let piece = Piece {
            encoder,
            bytes,
            start,
            groups: std::mem::take(groups),
            events: std::mem::take(events),
        };
        let sent = out.tx.send(piece).is_ok();
        (out.wake)();
        sent
    };
    loop {
        let job = match jobs.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Empty) => {
                if (groups > 0 || !enc.is_empty()) && !hand_back(&mut enc, &mut groups, &mut events)
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
        let group = match job {
            Job::Batches(group) => group,
            Job::Open(watched) => {
                // Kept whole (this sink never fails): it goes back as the next hand-back does.
                let _ = warps.open(ids, &mut enc, &watched, &mut |_| Ok(()));
                groups += 1;
                continue;
            }
        };
        for (batch, window) in group.iter() {
            let r = warps.batch(ids, &mut enc, batch, *window, &mut |enc| {
                // The writer is gone (finished or failed): nobody to tell.
                let (mut none, mut no_events) = (0, 0);
                if hand_back(enc, &mut none, &mut no_events) {
                    Ok(())
                } else {
                    Err(PerfettoError::WriterPanicked)
                }
            });
            match r {
                Ok(n) => events += n,
                Err(_) => return,
            }
        }
        groups += 1;
        if enc.len() > FLUSH_AT && !hand_back(&mut enc, &mut groups, &mut events) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which pieces an encoder deflates: never, always, or while the writer
    /// spent half of its last window writing.
    #[test]
    fn deflates_when_behind_only_while_the_writer_is_busy_writing() {
        let (tx, _rx) = mpsc::sync_channel(1);
        let t0 = Instant::now();
        let mut duty = Duty {
            since: t0,
            busy: Duration::ZERO,
            behind: Arc::new(AtomicBool::new(false)),
        };
        let level = |deflate, duty: &Duty| {
            Out {
                tx: &tx,
                deflate,
                behind: &duty.behind,
                wake: &|| {},
            }
            .level()
        };
        let ms = Duration::from_millis;
        // (write took, ended at): within a window nothing changes; at its end,
        // busy ≥ half of it says behind.
        let steps = [
            (ms(10), ms(20), None),
            (ms(20), ms(49), None),
            (ms(1), ms(50), Some(1)),
            (ms(5), ms(80), Some(1)),
            (ms(5), ms(110), None),
            (ms(55), ms(170), Some(1)),
        ];
        for (took, at, want) in steps {
            duty.add(took, t0 + at);
            assert_eq!(level(Deflate::WhenBehind(1), &duty), want, "at {at:?}");
            assert_eq!(level(Deflate::Never, &duty), None);
            assert_eq!(level(Deflate::Always(6), &duty), Some(6));
        }
    }
}
