//! A streamed launch on the collector's side: its warps' rings (docs/format.md,
//! "Streaming slots") read in place, in mapped host memory, while the kernel
//! runs, and cut into parts, each a packed buffer of the events drained since
//! the part before.
//!
//! The rings are read by threads of their own ([`Drainers`]), each over a
//! shard of the launch's warps ([`Drain`]), so that reading never waits for
//! what the collector does with a part (decoding it, holding it for a clock
//! checkpoint, handing it to the sinks): a ring fills in milliseconds. A pass
//! over a shard loads, for each warp, the chunk it will store next, and while
//! that chunk is complete, rebuilds its events ([`WarpStream`]), zeroes it and
//! publishes the new read count in the slot header, which frees the chunk for
//! the warp. No driver call, no copy: the device's stores arrive in this
//! memory over the host link.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::error::ProfilerError;
use super::memory::Memory;
use super::ring::{Arena, Region};
use crate::decode::stream::{complete, WarpStream};
use crate::decode::{DecodeError, OwnedBuffer};
use crate::format::{
    slot_stream_offsets as so, BufferHeader, Event, PackedWriter, SlotHeader, BUFFER_HEADER_SIZE,
    CHUNK_SIZE, NO_CLUSTER, RECORD_SIZE, SLOT_FLAG_OPEN_AT_FLUSH, SLOT_HEADER_SIZE,
    SLOT_MAGIC_STREAM,
};
use crate::registry::EventRegistry;

/// Default size of the streaming arena: 256 MiB of pinned host memory, mapped
/// into the device (no device memory), allocated at the first streamed launch.
/// Its rings hold about 30 ms of a 200 M events/s kernel: on the H200 the
/// drain threads' pauses (cutting a part) outlasted the 7 ms that 64 MiB held
/// and entries were dropped (docs/performance.md, "Streamed launches").
pub const DEFAULT_STREAM_MEMORY: usize = 256 << 20;

/// Records (of 16 bytes) per chunk: a ring's capacity is a multiple of it.
pub(crate) const CHUNK_RECORDS: u32 = (CHUNK_SIZE / RECORD_SIZE) as u32;
/// The smallest ring: 2 chunks.
const MIN_STREAM_CAPACITY: u32 = 2 * CHUNK_RECORDS;
/// The largest ring: 2¹⁵ chunks.
const MAX_STREAM_CAPACITY: u32 = 1 << 19;
/// Default time between two parts of a running streamed launch.
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(100);

/// The streaming settings of a [`ProfilerBuilder`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamSettings {
    pub(crate) memory: usize,
    /// Records per ring; `None`: sized per launch ([`StreamSettings::capacity_for`]).
    pub(crate) capacity: Option<u32>,
    pub(crate) interval: Duration,
    /// Threads reading a launch's rings; `None`: [`DrainThreads::by_cores`].
    pub(crate) drain_threads: Option<usize>,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            memory: DEFAULT_STREAM_MEMORY,
            capacity: None,
            interval: DEFAULT_STREAM_INTERVAL,
            drain_threads: None,
        }
    }
}

impl StreamSettings {
    pub(crate) fn check(&self) -> Result<(), ProfilerError> {
        // The device keeps its ring counters modulo 2¹⁶ and finds a chunk by the
        // low bits of its number (docs/format.md).
        let Some(c) = self.capacity else {
            return Ok(());
        };
        if !c.is_power_of_two() || !(MIN_STREAM_CAPACITY..=MAX_STREAM_CAPACITY).contains(&c) {
            return Err(ProfilerError::Invalid(format!(
                "stream capacity must be a power of two from {MIN_STREAM_CAPACITY} to {MAX_STREAM_CAPACITY} records, not {c}"
            )));
        }
        Ok(())
    }

    /// The ring size of a launch of `slots` warps: the one set, or the largest
    /// whose rings take at most half the arena (room for a second streamed
    /// launch), so that a ring holds as many milliseconds as memory allows.
    pub(crate) fn capacity_for(&self, slots: u64) -> u32 {
        self.capacity.unwrap_or_else(|| {
            let per_warp = (self.memory as u64 / 2).saturating_sub(64) / slots.max(1);
            let records = per_warp.saturating_sub(64) / 16;
            let fit = if records == 0 {
                1
            } else {
                1u64 << records.ilog2()
            };
            fit.clamp(MIN_STREAM_CAPACITY as u64, MAX_STREAM_CAPACITY as u64) as u32
        })
    }
}

/// The streaming arena, made at the first streamed launch.
#[derive(Default)]
pub(crate) struct StreamArena(Mutex<Option<(Arc<Memory>, Arc<Arena>)>>);

impl StreamArena {
    /// The memory and its bookkeeping, if made.
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Option<(Arc<Memory>, Arc<Arena>)>> {
        self.0.lock()
    }

    /// The arena's bytes (0 until the first streamed launch).
    pub(crate) fn bytes(&self) -> usize {
        self.0.lock().as_ref().map_or(0, |(m, _)| m.len)
    }
}

/// A drain thread cuts a part early when it holds this many events (24 bytes
/// each in its packed buffer): what a part holds in memory is bounded whatever
/// the rate, and so is the time the thread spends packing and checking it,
/// during which its rings are not read (a few milliseconds).
const PART_EVENTS: usize = 1 << 18;

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

/// What the drain found wrong with a launch; the launch goes on without the slot.
#[derive(Debug)]
pub(crate) struct SlotError {
    pub(crate) slot: u32,
    pub(crate) error: DecodeError,
}

/// One warp's ring, as the drain knows it.
struct Ring {
    warp: WarpStream,
    /// Chunks consumed (what the slot header's `read` says).
    read: u32,
    /// A decode error stopped it: its chunks are consumed unread.
    broken: bool,
    /// This part's events.
    events: Vec<Event>,
    /// Lost events already counted in an earlier part.
    lost_reported: u64,
    /// It has news for this part (events, or lost ones).
    touched: bool,
}

impl Ring {
    /// Reads every complete chunk of the ring of slot `s` at `slot` (bytes
    /// into `memory`); returns the events it added.
    fn poll(
        &mut self,
        s: u32,
        at: (&Memory, usize),
        chunks: u32,
        registry: &EventRegistry,
        errors: &mut Vec<SlotError>,
    ) -> usize {
        let (memory, slot) = at;
        let before = self.events.len();
        loop {
            let at = slot + SLOT_HEADER_SIZE + (self.read % chunks) as usize * CHUNK_SIZE;
            let chunk = memory.load_chunk(at);
            let Some(meta) = complete(&chunk) else {
                break;
            };
            if !self.broken {
                let known = |id| registry.contains(id);
                if let Err(error) = self.warp.take(&chunk, meta, s, known, &mut self.events) {
                    self.broken = true;
                    errors.push(SlotError { slot: s, error });
                }
            }
            memory.zero(at, CHUNK_SIZE);
            self.read = self.read.wrapping_add(1);
            memory.publish_u32(slot + so::READ, self.read);
            self.touched = true;
        }
        self.events.len() - before
    }
}

/// Warps per drain thread by default, at least: fewer would spend more on
/// threads than on reading (one core rebuilds about 50-60 M entries a second).
const SHARD_WARPS_BY_CORES: usize = 32;
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
    /// [`ProfilerBuilder::stream_drain_threads`]: super::ProfilerBuilder::stream_drain_threads
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

/// A shard of one streamed launch's rings, and the part being gathered.
pub(crate) struct Drain {
    header: BufferHeader,
    /// Chunks per ring.
    chunks: u32,
    stride: usize,
    /// The shard's slots.
    slots: Range<u32>,
    rings: Vec<Ring>,
    in_part: usize,
    cut_at: Instant,
    interval: Duration,
}

impl Drain {
    /// The drain of `slots` of a launch of `header`'s shape (its capacity a
    /// multiple of a chunk's records), whose chunks' stamps come after
    /// `before_ns` (device ns; within 2⁴⁸ ns); parts are cut every `interval`.
    pub(crate) fn new(
        header: BufferHeader,
        slots: Range<u32>,
        before_ns: u64,
        interval: Duration,
    ) -> Drain {
        let rings = slots
            .clone()
            .map(|_| Ring {
                warp: WarpStream::new(before_ns),
                read: 0,
                broken: false,
                events: Vec::new(),
                lost_reported: 0,
                touched: false,
            })
            .collect();
        Drain {
            header,
            chunks: header.slot_capacity / CHUNK_RECORDS,
            stride: crate::format::slot_stride(header.slot_capacity),
            slots,
            rings,
            in_part: 0,
            cut_at: Instant::now(),
            interval,
        }
    }

    /// Whether the part gathered so far should go now (its interval is over,
    /// or it is large). Lost events alone wait for a part with events, or the last.
    pub(crate) fn part_due(&self) -> bool {
        self.in_part > 0 && (self.cut_at.elapsed() >= self.interval || self.in_part >= PART_EVENTS)
    }

    /// Reads every complete chunk of the shard's rings, in the launch's buffer
    /// `region` of `memory`; returns the events it added. Errors are per slot:
    /// that slot stops, the others go on.
    pub(crate) fn poll(
        &mut self,
        memory: &Memory,
        region: &Region,
        registry: &EventRegistry,
        errors: &mut Vec<SlotError>,
    ) -> usize {
        let base = region.offset + BUFFER_HEADER_SIZE;
        let mut added = 0;
        for (ring, s) in self.rings.iter_mut().zip(self.slots.clone()) {
            let at = (memory, base + s as usize * self.stride);
            added += ring.poll(s, at, self.chunks, registry, errors);
        }
        self.in_part += added;
        added
    }

    /// The part gathered so far, as a packed buffer (`None` if it has nothing),
    /// as the collector receives it: indexed as it is written, not decoded
    /// again, which would read every event once more while the rings wait
    /// (`OwnedBuffer::from_drain` says why that is safe; `registry` is the one
    /// the events were checked against). For the shard's last part, after the
    /// launch completed and a last [`poll`](Self::poll), `last` gives its
    /// region: the flushed slot headers' drop counts and times go in, every
    /// held event goes out, and the ring's counts are checked.
    pub(crate) fn cut(
        &mut self,
        last: Option<(&Memory, &Region)>,
        registry: &EventRegistry,
    ) -> (Option<OwnedBuffer>, Vec<SlotError>) {
        let mut errors = Vec::new();
        let wpb = self.header.warps_per_block;
        let [gx, gy, _] = self.header.grid;
        let mut w = PackedWriter::new(&self.header);
        let events = self.rings.iter().map(|r| r.events.len()).sum();
        w.reserve(self.rings.len(), events);
        for (ring, s) in self.rings.iter_mut().zip(self.slots.clone()) {
            let end = match last {
                Some((memory, region)) => {
                    let slot = region.offset + BUFFER_HEADER_SIZE + s as usize * self.stride;
                    Flushed::read(memory, slot, ring, s, &mut errors)
                }
                None => None,
            };
            if !ring.touched && end.is_none() {
                continue;
            }
            ring.touched = false;
            let lost = ring.warp.lost - ring.lost_reported;
            ring.lost_reported = ring.warp.lost;
            let drops = lost + end.as_ref().map_or(0, |f| f.drops);
            let events = &ring.events;
            if events.is_empty() && drops == 0 {
                continue;
            }
            // One pass for both (the events are megabytes, read once more to pack).
            let (first_ts, ends) = events.iter().fold((u64::MAX, 0), |(s, e), ev| {
                (s.min(ev.start_ns), e.max(ev.end_ns))
            });
            let last_ts = end.as_ref().map_or(ends, |f| f.last_ts.max(ends));
            let bl = s / wpb;
            let sm = end.as_ref().map_or(ring.warp.sm, |f| f.sm);
            let h = SlotHeader {
                flags: if end.as_ref().is_some_and(|f| f.open > 0) {
                    SLOT_FLAG_OPEN_AT_FLUSH
                } else {
                    0
                },
                first_ts: if events.is_empty() { last_ts } else { first_ts },
                last_ts,
                sm_first: sm,
                sm_last: sm,
                block_linear: bl,
                block: [bl % gx, bl / gx % gy, bl / gx / gy],
                warp: s % wpb,
                cluster_rank: end.as_ref().map_or(NO_CLUSTER, |f| f.cluster_rank),
                drop_count: drops.min(u32::MAX as u64) as u32,
                ..SlotHeader::default()
            };
            w.slot(&h, events);
            ring.events.clear();
        }
        self.in_part = 0;
        self.cut_at = Instant::now();
        if w.slot_count() == 0 {
            return (None, errors);
        }
        let (bytes, header, index) = w.finish_indexed();
        let part = OwnedBuffer::from_drain(bytes, header, index, registry);
        (Some(part), errors)
    }
}

/// What the drain threads send the collector.
pub(crate) enum Drained {
    /// A part: a packed buffer, indexed on the drain thread (the collector is
    /// one thread), its index in the launch, and when it was cut (trace clock).
    Part {
        buffer: OwnedBuffer,
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
            buffer,
            index,
            cut_ns,
        });
    }
}

/// A launch's parts sent and not yet taken: their bytes, the limit past which
/// its drain threads stop reading, and how many times one stopped (not yet
/// counted in the stats).
struct Backlog {
    bytes: AtomicUsize,
    limit: usize,
    stalls: AtomicU64,
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
                drain.run(&memory, &region, &registry, &halt, (&sent.0, &sent.1));
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

    /// How many times a thread stopped reading for the backlog since the
    /// last call.
    pub(crate) fn stalls(&self) -> u64 {
        self.backlog.stalls.swap(0, Ordering::AcqRel)
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
    /// and the number the launch's last part (empty, to say it is the last) takes.
    pub(crate) fn finish(self) -> (Vec<Drained>, u32) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            // A thread that panicked loses its shard's last part; the others' are kept.
            let _ = t.join();
        }
        let next = self.outbox.lock().next;
        (self.rx.try_iter().collect(), next)
    }
}

impl Drain {
    /// A drain thread: reads the shard until told to stop, then once more (the
    /// kernel has finished: every store has landed) for its last part. While
    /// the parts sent and not yet taken are over the backlog's limit, it reads
    /// nothing and cuts nothing: the rings fill, and the warps drop their
    /// newest entries and count them.
    fn run(
        &mut self,
        memory: &Memory,
        region: &Region,
        registry: &EventRegistry,
        stop: &AtomicBool,
        (outbox, backlog): (&Mutex<Outbox>, &Backlog),
    ) {
        let mut was_held_back = false;
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
                false => self.poll(memory, region, registry, &mut errors),
            };
            let (part, more) = if stopping {
                self.cut(Some((memory, region)), registry)
            } else if !held_back && self.part_due() {
                self.cut(None, registry)
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
}

/// What a flushed slot header says.
struct Flushed {
    last_ts: u64,
    drops: u64,
    sm: u32,
    cluster_rank: u32,
    /// Ranges still open after the last entry.
    open: usize,
}

impl Flushed {
    /// The flushed header of the ring of slot `s` at `slot`, if its warp
    /// flushed: the ring's held event goes out, and its count is checked
    /// against the chunks read.
    fn read(
        memory: &Memory,
        slot: usize,
        ring: &mut Ring,
        s: u32,
        errors: &mut Vec<SlotError>,
    ) -> Option<Flushed> {
        if memory.load_u32(slot + so::MAGIC) != SLOT_MAGIC_STREAM {
            return None;
        }
        let stored = memory.load_u32(slot + so::CHUNKS);
        if stored != ring.read && !ring.broken {
            ring.broken = true;
            errors.push(SlotError {
                slot: s,
                error: DecodeError::RingUnread {
                    slot: s,
                    stored,
                    read: ring.read,
                },
            });
        }
        Some(Flushed {
            last_ts: memory.load_u64(slot + so::LAST_TS),
            drops: memory.load_u32(slot + so::DROP_COUNT) as u64,
            sm: memory.load_u32(slot + so::SM),
            cluster_rank: memory.load_u32(slot + so::CLUSTER_RANK),
            open: ring.warp.finish(&mut ring.events),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_threads_share_the_warps_as_set_or_by_the_cores() {
        // By the cores: 32 warps a thread at least, at most 12 threads.
        let cores = DrainThreads::by_cores();
        assert_eq!(cores.shards(528), 12.min(cores.max));
        assert_eq!(cores.shards(32), 1);
        assert!(cores.max <= 12);
        // Set: that many, at most one a warp.
        assert_eq!(DrainThreads::exactly(12).shards(528), 12);
        assert_eq!(DrainThreads::exactly(12).shards(5), 5);
        assert_eq!(DrainThreads::exactly(0).shards(528), 1);
        assert_eq!(DrainThreads::exactly(1).shards(528), 1);
    }

    #[test]
    fn rings_fill_half_the_arena_unless_set() {
        let auto = StreamSettings::default();
        // 132 SMs × 4 warps in 256 MiB: 8192 records (128 KiB, 512 chunks) each.
        assert_eq!(auto.capacity_for(528), 8192);
        let total = 528 * crate::format::slot_stride(8192);
        assert!(total <= DEFAULT_STREAM_MEMORY / 2 && 2 * total > DEFAULT_STREAM_MEMORY / 2);
        // Few warps: the largest ring; very many: the smallest (the launch is
        // then refused if even those do not fit).
        assert_eq!(auto.capacity_for(2), MAX_STREAM_CAPACITY);
        assert_eq!(auto.capacity_for(1 << 30), MIN_STREAM_CAPACITY);
        let set = StreamSettings {
            capacity: Some(64),
            ..auto
        };
        assert_eq!(set.capacity_for(528), 64);
        assert!(set.check().is_ok());
        let bad = StreamSettings {
            capacity: Some(48),
            ..auto
        };
        assert!(bad.check().is_err());
    }
}
