//! A streamed launch on the collector's side: its warps' rings (docs/format.md,
//! "Streaming slots") read in place, in mapped host memory, while the kernel
//! runs, and cut into parts, each a packed buffer of the events drained since
//! the part before.
//!
//! The rings are read by threads of their own ([`Drainers`]), each over a
//! shard of the launch's warps ([`Drain`], `shard.rs`), so that reading never waits for
//! what the collector does with a part (decoding it, holding it for a clock
//! checkpoint, handing it to the sinks): a ring fills in milliseconds. A pass
//! over a shard loads, for each warp, the chunk it will store next, and while
//! that chunk is complete, rebuilds its events (`WarpChunks`), zeroes it and
//! publishes the new read count in the slot header, which frees the chunk for
//! the warp. No driver call, no copy: the device's stores arrive in this
//! memory over the host link.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::Mutex;

use crate::cuda::device::{Memory, Region};
use crate::cuda::error::ProfilerError;
use crate::decode::OwnedBuffer;
use crate::format::BufferHeader;
use crate::registry::EventRegistry;

mod bench;
mod shard;

pub use bench::Rings;
pub(crate) use shard::{Drain, SlotError, CHUNK_RECORDS};

/// Bytes of parts a streamed launch's drain threads may have cut and the
/// collector not yet taken ([`DrainConfig::backlog`]), by default: past it they
/// stop reading, so that a collector held back (by a slow sink, or plain spans
/// from an unfiltered subscriber) makes the warps drop their newest entries,
/// counted, instead of the host's memory growing for as long as the kernel
/// runs. 1 GiB: on the H200 at 205 M events/s (24 bytes each in a part) the
/// collector delivers up to a quarter of that at once while parts wait.
pub(crate) const BACKLOG_BYTES: usize = 1 << 30;

/// How a streamed launch's rings are drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainConfig {
    /// The threads that read them.
    pub threads: DrainThreads,
    /// How often a thread cuts a part.
    pub interval: Duration,
    /// Bytes of parts cut and not yet taken by the collector, past which the
    /// threads stop reading (they may go past it by a part each).
    pub backlog: usize,
}

/// Warps per drain thread by default, at least. A warp alone may record tens of
/// millions of events a second, and one core rebuilds about 50-60 M entries a
/// second: a sampled launch's few warps each record at full rate (the sampled
/// GEMM's 34 warps at 55 M events/s lost 5 % on the two threads that 32 warps a
/// thread gave them, none on 8; H100, session 29), while a thread with little to
/// read costs a look at its rings every [`IDLE`].
const SHARD_WARPS_BY_CORES: usize = 4;
/// How many threads read a streamed launch's rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DrainThreads {
    /// Threads, at most.
    max: usize,
    /// Warps per thread, at least.
    shard_warps: usize,
}

impl DrainThreads {
    /// `n` threads (at most one per warp), as [`ProfilerBuilder::stream_drain_threads`] sets.
    ///
    /// [`ProfilerBuilder::stream_drain_threads`]: crate::cuda::ProfilerBuilder::stream_drain_threads
    pub(crate) fn exactly(n: usize) -> DrainThreads {
        DrainThreads {
            max: n.max(1),
            shard_warps: 1,
        }
    }

    /// The default: three quarters of the cores, up to 12 (one core rebuilds
    /// about 50 M entries a second; on the H200's 16-core host 12 threads read
    /// 200 M events a second whole, 8 dropped 1-3 %), each with
    /// [`SHARD_WARPS_BY_CORES`] warps at least.
    pub(crate) fn by_cores() -> DrainThreads {
        DrainThreads {
            max: std::thread::available_parallelism()
                .map_or(1, |n| n.get() * 3 / 4)
                .clamp(1, 12),
            shard_warps: SHARD_WARPS_BY_CORES,
        }
    }

    /// The threads for a launch of `warps` warps.
    fn shards(self, warps: usize) -> usize {
        warps.div_ceil(self.shard_warps).clamp(1, self.max)
    }
}

/// A drain thread that found nothing new sleeps this long before looking again.
const IDLE: Duration = Duration::from_micros(200);

/// What the drain threads send the collector.
pub(crate) enum Drained {
    /// A part: a packed buffer, indexed on the drain thread (the collector is
    /// one thread), its index in the launch, and when it was cut (trace clock).
    /// Boxed (one allocation a part, every `stream_interval` a thread), so that
    /// the channel's slots stay small.
    Part {
        buffer: Box<OwnedBuffer>,
        index: u32,
        cut_ns: u64,
    },
    /// Slots that stopped.
    Errors(Vec<SlotError>),
}

impl Drained {
    /// The bytes it counts in its launch's backlog.
    fn bytes(&self) -> usize {
        match self {
            Drained::Part { buffer, .. } => buffer.bytes().len(),
            Drained::Errors(_) => 0,
        }
    }
}

/// Parts are numbered as they are sent, under one lock, so that they reach the
/// collector in the order of their numbers whatever thread cut them.
struct Outbox {
    tx: mpsc::Sender<Drained>,
    next: u32,
}

impl Outbox {
    fn part(&mut self, buffer: OwnedBuffer) {
        let index = self.next;
        self.next += 1;
        let cut_ns = crate::clock::HostClock::Boottime.now_ns();
        let _ = self.tx.send(Drained::Part {
            buffer: Box::new(buffer),
            index,
            cut_ns,
        });
    }
}

/// A launch's parts sent and not yet taken: their bytes, the limit past which
/// its drain threads stop reading, how many times one stopped, and the longest
/// a thread went between two reads of its rings (ns; both not yet counted in
/// the stats).
struct Backlog {
    bytes: AtomicUsize,
    limit: usize,
    stalls: AtomicU64,
    longest_gap_ns: AtomicU64,
}

/// The drain threads of one streamed launch, reading its rings until the
/// launch completes ([`Drainers::finish`]).
pub(crate) struct Drainers {
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Drained>,
    outbox: Arc<Mutex<Outbox>>,
    backlog: Arc<Backlog>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drainers {
    /// Starts reading the rings of a launch of `header`'s shape in `region` of
    /// `memory`, as `config` says.
    pub(crate) fn start(
        header: BufferHeader,
        memory: Arc<Memory>,
        region: Region,
        registry: Arc<EventRegistry>,
        before_ns: u64,
        config: DrainConfig,
    ) -> Result<Drainers, ProfilerError> {
        let (tx, rx) = mpsc::channel();
        let outbox = Arc::new(Mutex::new(Outbox { tx, next: 0 }));
        let stop = Arc::new(AtomicBool::new(false));
        let backlog = Arc::new(Backlog {
            bytes: AtomicUsize::new(0),
            limit: config.backlog,
            stalls: AtomicU64::new(0),
            longest_gap_ns: AtomicU64::new(0),
        });
        let n = header.slot_count as usize;
        let shards = config.threads.shards(n);
        let per = n.div_ceil(shards).max(1) as u32;
        let mut threads = Vec::with_capacity(shards);
        for k in 0..shards as u32 {
            let slots = (k * per).min(header.slot_count)..((k + 1) * per).min(header.slot_count);
            let mut drain = Drain::new(header, slots, before_ns, config.interval);
            let (memory, registry, halt, sent) = (
                memory.clone(),
                registry.clone(),
                stop.clone(),
                (outbox.clone(), backlog.clone()),
            );
            let name = format!("tracing-gpu drain {} #{k}", header.launch_id);
            let t = std::thread::Builder::new().name(name).spawn(move || {
                read_until_stopped(
                    &mut drain,
                    &memory,
                    &region,
                    &registry,
                    &halt,
                    (&sent.0, &sent.1),
                );
            });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop.store(true, Ordering::Release);
                    return Err(ProfilerError::Thread(e));
                }
            }
        }
        Ok(Drainers {
            stop,
            rx,
            outbox,
            backlog,
            threads,
        })
    }

    /// How many times a thread stopped reading for the backlog, and the
    /// longest a thread went between two reads of its rings, since the last call.
    pub(crate) fn pauses(&self) -> (u64, Duration) {
        (
            self.backlog.stalls.swap(0, Ordering::AcqRel),
            Duration::from_nanos(self.backlog.longest_gap_ns.swap(0, Ordering::AcqRel)),
        )
    }

    /// What the threads have sent so far (their backlog goes down by as much).
    pub(crate) fn take(&self) -> Vec<Drained> {
        let got: Vec<Drained> = self.rx.try_iter().collect();
        let bytes = got.iter().map(Drained::bytes).sum();
        self.backlog.bytes.fetch_sub(bytes, Ordering::AcqRel);
        got
    }

    /// The launch has completed: every thread reads its rings a last time and
    /// sends its last part, with the flushed counts. Returns what they sent,
    /// and the number the launch's last part (empty, to say it is the last) takes;
    /// [`pauses`](Self::pauses) then has the threads' last.
    pub(crate) fn finish(&mut self) -> (Vec<Drained>, u32) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            // A thread that panicked loses its shard's last part; the others' are kept.
            let _ = t.join();
        }
        let next = self.outbox.lock().next;
        (self.rx.try_iter().collect(), next)
    }
}

/// A drain thread: reads the shard until told to stop, then once more (the
/// kernel has finished: every store has landed) for its last part. While
/// the parts sent and not yet taken are over the backlog's limit, it reads
/// nothing and cuts nothing: the rings fill, and the warps drop their
/// newest entries and count them. The longest its rings went unread goes to
/// the stats: a ring that holds less than that has dropped.
fn read_until_stopped(
    drain: &mut Drain,
    memory: &Memory,
    region: &Region,
    registry: &EventRegistry,
    stop: &AtomicBool,
    (outbox, backlog): (&Mutex<Outbox>, &Backlog),
) {
    let mut was_held_back = false;
    let mut gap = Duration::ZERO;
    loop {
        let stopping = stop.load(Ordering::Acquire);
        let held_back = !stopping && backlog.bytes.load(Ordering::Acquire) > backlog.limit;
        if held_back && !was_held_back {
            backlog.stalls.fetch_add(1, Ordering::Relaxed);
        }
        was_held_back = held_back;
        let mut errors = Vec::new();
        let added = match held_back {
            true => 0,
            false => drain.poll(memory, region, registry, &mut errors, stopping),
        };
        if drain.longest_gap() > gap {
            gap = drain.longest_gap();
            let ns = gap.as_nanos().min(u128::from(u64::MAX)) as u64;
            backlog.longest_gap_ns.fetch_max(ns, Ordering::Relaxed);
        }
        let (part, more) = if stopping {
            drain.cut(Some((memory, region)), registry)
        } else if !held_back && drain.part_due() {
            drain.cut(None, registry)
        } else {
            (None, Vec::new())
        };
        errors.extend(more);
        {
            let mut out = outbox.lock();
            if !errors.is_empty() {
                let _ = out.tx.send(Drained::Errors(errors));
            }
            if let Some(buffer) = part {
                backlog
                    .bytes
                    .fetch_add(buffer.bytes().len(), Ordering::AcqRel);
                out.part(buffer);
            }
        }
        if stopping {
            return;
        }
        if added == 0 {
            std::thread::sleep(IDLE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_threads_share_the_warps_as_set_or_by_the_cores() {
        // By the cores: 4 warps a thread at least, at most 12 threads.
        let cores = DrainThreads::by_cores();
        assert_eq!(cores.shards(528), 12.min(cores.max));
        assert_eq!(cores.shards(34), 9.min(cores.max));
        assert_eq!(cores.shards(4), 1);
        assert!(cores.max <= 12);
        // Set: that many, at most one a warp.
        assert_eq!(DrainThreads::exactly(12).shards(528), 12);
        assert_eq!(DrainThreads::exactly(12).shards(5), 5);
        assert_eq!(DrainThreads::exactly(0).shards(528), 1);
        assert_eq!(DrainThreads::exactly(1).shards(528), 1);
    }
}
