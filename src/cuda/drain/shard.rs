//! One drain thread's share of a streamed launch's rings ([`Drain`]): each
//! warp's ring read in place, chunk by chunk ([`WarpRing`]), and the events
//! gathered since the last part cut into the next one, a packed buffer.

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::cuda::device::{Memory, Region};
use crate::decode::chunk::{complete, WarpChunks};
use crate::decode::{DecodeError, OwnedBuffer};
use crate::format::{
    slot_stream_offsets as so, BufferHeader, Event, PackedWriter, SlotHeader, CHUNK_SIZE,
    NO_CLUSTER, RECORD_SIZE, SLOT_FLAG_OPEN_AT_FLUSH, SLOT_HEADER_SIZE, SLOT_MAGIC_STREAM,
};
use crate::registry::EventRegistry;

/// Records (of 16 bytes) per chunk: a ring's capacity is a multiple of it.
pub(crate) const CHUNK_RECORDS: u32 = (CHUNK_SIZE / RECORD_SIZE) as u32;

/// A drain thread cuts a part early when it holds this many events (24 bytes
/// each in its packed buffer): what a part holds in memory is bounded whatever
/// the rate, and so is the time the thread spends packing and checking it,
/// during which its rings are not read (a few milliseconds). A pass stops at
/// the ring that brings its part there (the next pass goes on from the ring
/// after), so a part exceeds it by one ring at most: a drain that fell behind
/// would otherwise gather every ring's backlog into one part, larger the further
/// behind it is, and slower to pack (H100, session 32: with 1 GiB of rings,
/// parts of 1.1 M events on average and the drain thread saturated).
pub(super) const PART_EVENTS: usize = 1 << 18;

/// What the drain found wrong with a launch; the launch goes on without the slot.
#[derive(Debug)]
pub(crate) struct SlotError {
    pub(crate) slot: u32,
    pub(crate) error: DecodeError,
}

/// One warp's ring, as the drain knows it.
struct WarpRing {
    warp: WarpChunks,
    /// Chunks consumed (what the slot header's `read` says).
    read: u32,
    /// A decode error stopped it: its chunks are consumed unread.
    broken: bool,
    /// This part's events.
    events: Vec<Event>,
    /// Events lost to gaps (`WarpChunks::lost`) already counted in an earlier part.
    lost_reported: u64,
    /// It has news for this part (events, or lost ones).
    touched: bool,
}

impl WarpRing {
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

/// A shard of one streamed launch's rings, and the part being gathered.
pub(crate) struct Drain {
    header: BufferHeader,
    /// Chunks per ring.
    chunks: u32,
    stride: usize,
    /// The shard's slots.
    slots: Range<u32>,
    rings: Vec<WarpRing>,
    /// The ring the next pass starts at.
    next: usize,
    /// When the first ring was last read, and the longest between two reads of it.
    first_read: Instant,
    longest_gap: Duration,
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
            .map(|_| WarpRing {
                warp: WarpChunks::new(before_ns),
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
            next: 0,
            first_read: Instant::now(),
            longest_gap: Duration::ZERO,
            in_part: 0,
            cut_at: Instant::now(),
            interval,
        }
    }

    /// The longest the shard's rings went unread so far (between two reads of
    /// its first ring: a part cut, a stop for the backlog, a wait for a core).
    pub(crate) fn longest_gap(&self) -> Duration {
        self.longest_gap
    }

    /// Whether the part gathered so far should go now (its interval is over,
    /// or it is large). Lost events alone wait for a part with events, or the last.
    pub(crate) fn part_due(&self) -> bool {
        self.in_part > 0 && (self.cut_at.elapsed() >= self.interval || self.in_part >= PART_EVENTS)
    }

    /// Reads every complete chunk of the shard's rings, in the launch's buffer
    /// `region` of `memory`, ring after ring from where the last pass stopped;
    /// unless `whole`, it stops after the ring that brings the part to
    /// [`PART_EVENTS`]. Returns the events it added. Errors are per slot: that
    /// slot stops, the others go on.
    pub(crate) fn poll(
        &mut self,
        memory: &Memory,
        region: &Region,
        registry: &EventRegistry,
        errors: &mut Vec<SlotError>,
        whole: bool,
    ) -> usize {
        let base = region.offset + self.header.size();
        let mut added = 0;
        for _ in 0..self.rings.len() {
            let i = self.next;
            self.next = (i + 1) % self.rings.len();
            if i == 0 {
                // One clock read a round of the shard: every ring waits about as
                // long between two reads as the first does.
                let now = Instant::now();
                self.longest_gap = self.longest_gap.max(now - self.first_read);
                self.first_read = now;
            }
            let s = self.slots.start + i as u32;
            let at = (memory, base + s as usize * self.stride);
            added += self.rings[i].poll(s, at, self.chunks, registry, errors);
            if !whole && self.in_part + added >= PART_EVENTS {
                break;
            }
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
    /// region: the flushed slot headers' events lost and times go in, every
    /// held event goes out, and the ring's counts are checked.
    pub(crate) fn cut(
        &mut self,
        last: Option<(&Memory, &Region)>,
        registry: &EventRegistry,
    ) -> (Option<OwnedBuffer>, Vec<SlotError>) {
        let mut errors = Vec::new();
        let [gx, gy, _] = self.header.grid;
        let mut w = PackedWriter::new(&self.header);
        let events = self.rings.iter().map(|r| r.events.len()).sum();
        w.reserve(self.rings.len(), events);
        for (ring, s) in self.rings.iter_mut().zip(self.slots.clone()) {
            let end = match last {
                Some((memory, region)) => {
                    let slot = region.offset + self.header.size() + s as usize * self.stride;
                    Flushed::read(memory, slot, ring, s, &mut errors)
                }
                None => None,
            };
            if !ring.touched && end.is_none() {
                continue;
            }
            ring.touched = false;
            // Lost: the ends read after a gap that lost their begin, as they are
            // read, and in the last part the events the warp dropped the ends of.
            let lost = ring.warp.lost - ring.lost_reported;
            ring.lost_reported = ring.warp.lost;
            let lost = lost + end.as_ref().map_or(0, |f| f.events_lost);
            let events = &ring.events;
            if events.is_empty() && lost == 0 {
                continue;
            }
            // One pass for both (the events are megabytes, read once more to pack).
            let (first_ts, ends) = events.iter().fold((u64::MAX, 0), |(s, e), ev| {
                (s.min(ev.start_ns), e.max(ev.end_ns))
            });
            let last_ts = end.as_ref().map_or(ends, |f| f.last_ts.max(ends));
            // The drain's slots are the launch's: placed (Drainers::start).
            let (bl, warp) = self.header.place(s).unwrap_or_default();
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
                warp,
                cluster_rank: end.as_ref().map_or(NO_CLUSTER, |f| f.cluster_rank),
                events_lost: lost.min(u32::MAX as u64) as u32,
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

/// What a flushed slot header says.
struct Flushed {
    last_ts: u64,
    /// Events whose ends the warp dropped.
    events_lost: u64,
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
        ring: &mut WarpRing,
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
            events_lost: memory.load_u32(slot + so::EVENTS_LOST) as u64,
            sm: memory.load_u32(slot + so::SM),
            cluster_rank: memory.load_u32(slot + so::CLUSTER_RANK),
            open: ring.warp.finish(&mut ring.events),
        })
    }
}
