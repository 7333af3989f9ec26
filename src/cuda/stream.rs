//! A streamed launch on the collector's side ([`Drain`]): its warps' rings
//! (docs/format.md, "Streaming slots") read in place, in mapped host memory,
//! while the kernel runs, and cut into parts, each a packed buffer of the
//! events drained since the part before.
//!
//! A poll walks every slot of the launch: it loads the chunk the warp will
//! store next, and while that chunk is complete, reads it ([`WarpStream`]),
//! zeroes it and publishes the new read count in the slot header, which is
//! what frees the chunk for the warp. No driver call, no copy: the device's
//! stores arrive in this memory over the host link.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::error::ProfilerError;
use super::memory::Memory;
use super::ring::{Arena, Region};
use crate::decode::stream::{complete, WarpStream};
use crate::decode::DecodeError;
use crate::format::{
    slot_stream_offsets as so, BufferHeader, Event, PackedWriter, SlotHeader, BUFFER_HEADER_SIZE,
    CHUNK_SIZE, NO_CLUSTER, RECORD_SIZE, SLOT_FLAG_OPEN_AT_FLUSH, SLOT_HEADER_SIZE,
    SLOT_MAGIC_STREAM,
};
use crate::registry::EventRegistry;

/// Default size of the streaming arena: 64 MiB of pinned host memory, mapped
/// into the device, allocated at the first streamed launch.
pub const DEFAULT_STREAM_MEMORY: usize = 64 << 20;
/// Default records (of 16 bytes) per warp's ring: 64 chunks of 31 entries.
pub const DEFAULT_STREAM_CAPACITY: u32 = 64 * CHUNK_RECORDS;
/// Records (of 16 bytes) per chunk: a ring's capacity is a multiple of it.
pub(crate) const CHUNK_RECORDS: u32 = (CHUNK_SIZE / RECORD_SIZE) as u32;
/// The largest ring: 2¹⁵ chunks.
const MAX_STREAM_CAPACITY: u32 = 1 << 19;
/// Default time between two parts of a running streamed launch.
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(100);

/// The streaming settings of a [`ProfilerBuilder`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamSettings {
    pub(crate) memory: usize,
    pub(crate) capacity: u32,
    pub(crate) interval: Duration,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            memory: DEFAULT_STREAM_MEMORY,
            capacity: DEFAULT_STREAM_CAPACITY,
            interval: DEFAULT_STREAM_INTERVAL,
        }
    }
}

impl StreamSettings {
    pub(crate) fn check(&self) -> Result<(), ProfilerError> {
        // The device keeps its ring counters modulo 2¹⁶ and finds a chunk by the
        // low bits of its number (docs/format.md).
        let c = self.capacity;
        if !c.is_power_of_two() || !(2 * CHUNK_RECORDS..=MAX_STREAM_CAPACITY).contains(&c) {
            return Err(ProfilerError::Invalid(format!(
                "stream capacity must be a power of two from {} to {MAX_STREAM_CAPACITY} records, not {c}",
                2 * CHUNK_RECORDS
            )));
        }
        Ok(())
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

/// How often a running launch's rings are read: often enough that a ring of
/// a few dozen chunks does not fill at the rates the host can decode.
pub(crate) const POLL: Duration = Duration::from_millis(1);

/// A part is cut early when it holds this many events (24 bytes each in its
/// packed buffer): what a part holds in memory is bounded whatever the rate.
const PART_EVENTS: usize = 1 << 21;

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

/// Below this many slots a poll reads them all on the collector thread.
const PARALLEL_SLOTS: usize = 64;

/// One streamed launch's rings, and the part being gathered.
pub(crate) struct Drain {
    header: BufferHeader,
    /// Chunks per ring.
    chunks: u32,
    stride: usize,
    rings: Vec<Ring>,
    /// Threads a poll reads on: one warp's ring always on the same thread,
    /// since rebuilding its ranges carries from chunk to chunk.
    workers: usize,
    in_part: usize,
    part: u32,
    cut_at: Instant,
    polled_at: Option<Instant>,
    interval: Duration,
}

impl Drain {
    /// The drain of a launch of `header`'s shape (its capacity a multiple of a
    /// chunk's records), whose chunks' stamps come after `before_ns` (device
    /// ns; within 2⁴⁸ ns); parts are cut every `interval`; a poll reads on up
    /// to `workers` threads.
    pub(crate) fn new(
        header: BufferHeader,
        before_ns: u64,
        interval: Duration,
        workers: usize,
    ) -> Drain {
        let n = header.slot_count as usize;
        let rings = (0..n)
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
            rings,
            workers: workers.max(1),
            in_part: 0,
            part: 0,
            cut_at: Instant::now(),
            polled_at: None,
            interval,
        }
    }

    /// Whether a poll is due ([`POLL`] since the last).
    pub(crate) fn poll_due(&self) -> bool {
        self.polled_at.is_none_or(|t| t.elapsed() >= POLL)
    }

    /// Whether the part gathered so far should go now (its interval is over,
    /// or it is large).
    pub(crate) fn part_due(&self) -> bool {
        // Lost events alone wait for the next part with events, or the last.
        self.in_part > 0 && (self.cut_at.elapsed() >= self.interval || self.in_part >= PART_EVENTS)
    }

    /// Reads every complete chunk of every ring of the launch, whose buffer is
    /// `region` of `memory`. Errors are per slot: that slot stops, the others
    /// go on. Many slots are read on several threads: one core rebuilds about
    /// 50-60 M entries a second, short of what a GPU can send.
    pub(crate) fn poll(
        &mut self,
        memory: &Memory,
        region: &Region,
        registry: &EventRegistry,
    ) -> Vec<SlotError> {
        self.polled_at = Some(Instant::now());
        let (chunks, stride) = (self.chunks, self.stride);
        let base = region.offset + BUFFER_HEADER_SIZE;
        let read = |first: usize, rings: &mut [Ring], errors: &mut Vec<SlotError>| {
            let mut added = 0;
            for (k, ring) in rings.iter_mut().enumerate() {
                let s = first + k;
                added += ring.poll(
                    s as u32,
                    (memory, base + s * stride),
                    chunks,
                    registry,
                    errors,
                );
            }
            added
        };
        let mut errors = Vec::new();
        let n = self.rings.len();
        if self.workers == 1 || n < PARALLEL_SLOTS {
            self.in_part += read(0, &mut self.rings, &mut errors);
            return errors;
        }
        let per = n.div_ceil(self.workers);
        let done: Vec<(usize, Vec<SlotError>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .rings
                .chunks_mut(per)
                .enumerate()
                .map(|(i, rings)| {
                    scope.spawn(move || {
                        let mut errors = Vec::new();
                        (read(i * per, rings, &mut errors), errors)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reading a ring does not panic"))
                .collect()
        });
        for (added, e) in done {
            self.in_part += added;
            errors.extend(e);
        }
        errors
    }

    /// The part gathered so far, as a packed buffer (`None` if it has nothing).
    /// For the launch's last part, after it completed and a last [`poll`](Self::poll),
    /// `last` gives its region: the flushed slot headers' drop counts and times
    /// go in, every held event goes out, and the ring's counts are checked.
    /// The last part is always cut, empty or not: it finishes the launch.
    pub(crate) fn cut(
        &mut self,
        last: Option<(&Memory, &Region)>,
    ) -> (Option<Vec<u8>>, Vec<SlotError>) {
        let mut errors = Vec::new();
        let wpb = self.header.warps_per_block;
        let [gx, gy, _] = self.header.grid;
        let mut w = PackedWriter::new(&self.header);
        for (s, ring) in self.rings.iter_mut().enumerate() {
            let end = match last {
                Some((memory, region)) => {
                    let slot = region.offset + BUFFER_HEADER_SIZE + s * self.stride;
                    Flushed::read(memory, slot, ring, s as u32, &mut errors)
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
            let first_ts = events.iter().map(|e| e.start_ns).min();
            let ends = events.iter().map(|e| e.end_ns).max();
            let last_ts = ends
                .into_iter()
                .chain(end.as_ref().map(|f| f.last_ts))
                .max()
                .unwrap_or(0);
            let s = s as u32;
            let bl = s / wpb;
            let sm = end.as_ref().map_or(ring.warp.sm, |f| f.sm);
            let h = SlotHeader {
                flags: if end.as_ref().is_some_and(|f| f.open > 0) {
                    SLOT_FLAG_OPEN_AT_FLUSH
                } else {
                    0
                },
                first_ts: first_ts.unwrap_or(last_ts),
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
        if w.slot_count() == 0 && last.is_none() {
            return (None, errors);
        }
        self.part += 1;
        (Some(w.finish()), errors)
    }

    /// Parts cut so far.
    pub(crate) fn parts(&self) -> u32 {
        self.part
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
