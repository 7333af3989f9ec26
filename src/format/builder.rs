//! The host-side encoder: valid buffers written event by event (v1 slots) or
//! boundary by boundary (v2 slots).

use std::collections::BTreeMap;

use super::{
    slot_v2_offsets as v2o, BufferHeader, Entry, Event, EventKind, Record, Sampling, SlotHeader,
    ENTRY_BEGIN, ENTRY_END, ENTRY_INSTANT, ENTRY_PAYLOAD, ENTRY_SIZE, ENTRY_SWITCH, KIND_INSTANT,
    KIND_RANGE, RECORD_SIZE, SLOT_HEADER_SIZE, SLOT_MAGIC, SLOT_MAGIC_V2, VERSION,
};

/// Writes valid buffers on the host, event by event (v1 slots, [`BufferBuilder::warp`])
/// or boundary by boundary (v2 slots, [`BufferBuilder::warp_v2`]): for tests, and for
/// producers other than the CUDA header (a simulator, a converter).
///
/// ```
/// use tracing_gpu::decode::Buffer;
/// use tracing_gpu::format::BufferBuilder;
/// let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 8);
/// b.warp(1, 0).unwrap().range(7, 1_000, 1_500, 0).instant(8, 1_600, 42);
/// let bytes = b.finish();
/// let cap = Buffer::decode(&bytes, None).unwrap();
/// let slot = cap.slots().next().unwrap();
/// assert_eq!(slot.index, 2); // block 1 × 2 warps per block + warp 0
/// assert_eq!(slot.events().map(|e| e.end_ns).collect::<Vec<_>>(), [1_500, 1_600]);
/// ```
#[derive(Debug, Clone)]
pub struct BufferBuilder {
    header: BufferHeader,
    slots: BTreeMap<u32, SlotBuilder>,
    entry_slots: BTreeMap<u32, EntrySlotBuilder>,
}

/// One warp's v2 slot in a [`BufferBuilder`]: the entries in the order the device
/// writes them, with full times. Those past twice the capacity are lost, and
/// counted as the device counts them: entries lost, and events lost (those of
/// them that end an event). Unless set, `last_ts` is the latest time pushed; `anchor_ts` is
/// `last_ts`, or with drops the last kept entry's time, as the device writes it.
#[derive(Debug, Clone, Default)]
pub struct EntrySlotBuilder {
    /// Each entry with its full time (a payload's: the entry's before it).
    entries: Vec<(Entry, u64)>,
    last_ts: Option<u64>,
    sm: u32,
    cluster_rank: u32,
}

/// One warp's slot in a [`BufferBuilder`]. Events are written in the order they
/// are pushed (push them in the order they end, as the device does); those past
/// the capacity are counted as dropped. Unless set, `first_ts` is the earliest
/// start and `last_ts` the latest end of all pushed events, dropped ones included.
#[derive(Debug, Clone, Default)]
pub struct SlotBuilder {
    events: Vec<Event>,
    first_ts: Option<u64>,
    last_ts: Option<u64>,
    sm: (u32, u32),
    cluster_rank: u32,
    open_at_flush: bool,
}

impl BufferBuilder {
    /// A buffer for a launch of `grid` blocks of `block` threads, with one slot
    /// per warp (`slot_count` = blocks × warps per block, saturating) and
    /// `capacity` records per slot.
    pub fn new(grid: [u32; 3], block: [u32; 3], capacity: u32) -> Self {
        let threads: u128 = block.iter().map(|&d| d as u128).product();
        let wpb = u32::try_from(threads.div_ceil(32)).unwrap_or(u32::MAX);
        let blocks: u128 = grid.iter().map(|&d| d as u128).product();
        let slots = u32::try_from(blocks * wpb as u128).unwrap_or(u32::MAX);
        BufferBuilder {
            header: BufferHeader {
                version: VERSION,
                slot_capacity: capacity,
                slot_count: slots,
                warps_per_block: wpb,
                launch_id: 0,
                grid,
                block,
                flags: 0,
                sampling: Sampling::default(),
            },
            slots: BTreeMap::new(),
            entry_slots: BTreeMap::new(),
        }
    }

    /// Sets the launch id written in the header.
    pub fn launch_id(&mut self, id: u64) -> &mut Self {
        self.header.launch_id = id;
        self
    }

    /// Samples the launch: slots only for the warps `sampling` names, as the
    /// device allocates them (`slot_count` becomes theirs, saturating; slots
    /// made before are dropped). [`BufferBuilder::warp`] of a warp it leaves out
    /// is `None`.
    pub fn sampling(&mut self, sampling: Sampling) -> &mut Self {
        let h = &mut self.header;
        h.sampling = sampling;
        let blocks: u64 = h.grid.iter().map(|&d| u64::from(d)).product();
        h.slot_count = u32::try_from(sampling.slots(blocks, h.warps_per_block)).unwrap_or(u32::MAX);
        self.slots.clear();
        self.entry_slots.clear();
        self
    }

    /// Overrides the number of slots (fewer than the warps: the rest record nothing).
    pub fn slot_count(&mut self, n: u32) -> &mut Self {
        self.header.slot_count = n;
        self.slots.retain(|&i, _| i < n);
        self.entry_slots.retain(|&i, _| i < n);
        self
    }

    /// The header as it will be written.
    pub fn header(&self) -> &BufferHeader {
        &self.header
    }

    /// The slot of warp `warp` of block `block_linear` (created, and so flushed,
    /// on first use); `None` if that warp has no slot.
    pub fn warp(&mut self, block_linear: u32, warp: u32) -> Option<&mut SlotBuilder> {
        let index = self.index(block_linear, warp)?;
        self.entry_slots.remove(&index);
        Some(self.slots.entry(index).or_insert_with(|| SlotBuilder {
            cluster_rank: super::NO_CLUSTER,
            ..SlotBuilder::default()
        }))
    }

    /// The v2 slot of warp `warp` of block `block_linear` (created, and so flushed,
    /// on first use; it replaces a v1 slot there); `None` if that warp has no slot.
    pub fn warp_v2(&mut self, block_linear: u32, warp: u32) -> Option<&mut EntrySlotBuilder> {
        let index = self.index(block_linear, warp)?;
        self.slots.remove(&index);
        Some(
            self.entry_slots
                .entry(index)
                .or_insert_with(|| EntrySlotBuilder {
                    cluster_rank: super::NO_CLUSTER,
                    ..EntrySlotBuilder::default()
                }),
        )
    }

    fn index(&self, block_linear: u32, warp: u32) -> Option<u32> {
        let h = &self.header;
        if warp >= h.warps_per_block {
            return None;
        }
        h.sampling
            .slot_of(block_linear, warp, h.warps_per_block)?
            .try_into()
            .ok()
            .filter(|&i: &u32| i < h.slot_count)
    }

    /// Writes the buffer. It decodes if the events of each slot were pushed in
    /// the order they end, are less than 2³² ns apart, and ranges are shorter.
    ///
    /// # Panics
    /// If the buffer's size overflows `usize` (no allocation could hold it anyway).
    pub fn finish(&self) -> Vec<u8> {
        let h = &self.header;
        let size = h.buffer_size().expect("buffer size overflows usize");
        let stride = super::slot_stride(h.slot_capacity);
        let mut out = vec![0u8; size];
        h.write_to(&mut out);
        let [gx, gy, _] = h.grid.map(|d| d.max(1));
        for (&i, s) in &self.slots {
            // Made by `warp`, so placed.
            let (bl, warp) = h.place(i).unwrap_or_default();
            let kept = s.events.len().min(h.slot_capacity as usize);
            let first = s
                .first_ts
                .unwrap_or_else(|| s.events.iter().map(|e| e.start_ns).min().unwrap_or(0));
            let last = s
                .last_ts
                .unwrap_or_else(|| s.events.iter().map(|e| e.end_ns).max().unwrap_or(first));
            let mut flags = 0;
            if s.sm.0 != s.sm.1 {
                flags |= super::SLOT_FLAG_MIGRATED;
            }
            if s.open_at_flush {
                flags |= super::SLOT_FLAG_OPEN_AT_FLUSH;
            }
            let off = h.size() + i as usize * stride;
            SlotHeader {
                magic: SLOT_MAGIC,
                flags,
                first_ts: first,
                last_ts: last,
                sm_first: s.sm.0,
                sm_last: s.sm.1,
                block_linear: bl,
                block: [bl % gx, bl / gx % gy, bl / gx / gy],
                warp,
                cluster_rank: s.cluster_rank,
                record_count: kept as u32,
                events_lost: u32::try_from(s.events.len() - kept).unwrap_or(u32::MAX),
            }
            .write_to(&mut out[off..]);
            for (n, e) in s.events[..kept].iter().enumerate() {
                Record {
                    end_lo: e.end_ns as u32,
                    duration: e.end_ns.wrapping_sub(e.start_ns) as u32,
                    event_id: e.id,
                    kind: match e.kind {
                        EventKind::Range => KIND_RANGE,
                        EventKind::Instant => KIND_INSTANT,
                    },
                    payload: e.payload,
                }
                .write_to(&mut out[off + SLOT_HEADER_SIZE + n * RECORD_SIZE..]);
            }
        }
        for (&i, s) in &self.entry_slots {
            s.write(
                i,
                h.slot_capacity,
                &mut out[h.size() + i as usize * stride..],
            );
        }
        out
    }
}

impl EntrySlotBuilder {
    fn push(&mut self, kind: u16, id: u16, t: u64) -> &mut Self {
        let entry = Entry {
            time_lo: t as u32,
            event_id: id,
            kind,
        };
        self.entries.push((entry, t));
        self
    }

    /// Pushes a begin of `id` at `t`.
    pub fn begin(&mut self, id: u16, t: u64) -> &mut Self {
        self.push(ENTRY_BEGIN, id, t)
    }

    /// Pushes an end of `id` at `t`.
    pub fn end(&mut self, id: u16, t: u64) -> &mut Self {
        self.push(ENTRY_END, id, t)
    }

    /// Pushes a switch to `id` at `t` (closes the innermost open range).
    pub fn switch(&mut self, id: u16, t: u64) -> &mut Self {
        self.push(ENTRY_SWITCH, id, t)
    }

    /// Pushes an instant of `id` at `t`.
    pub fn instant(&mut self, id: u16, t: u64) -> &mut Self {
        self.push(ENTRY_INSTANT, id, t)
    }

    /// Pushes a payload entry (for the event the previous entry ended).
    pub fn payload(&mut self, payload: u32) -> &mut Self {
        let t = self.entries.last().map_or(0, |&(_, t)| t);
        self.push(ENTRY_PAYLOAD, 0, t);
        if let Some((e, _)) = self.entries.last_mut() {
            e.time_lo = payload;
        }
        self
    }

    /// Sets `%smid` (v2 slots have one, read at flush).
    pub fn sm(&mut self, sm: u32) -> &mut Self {
        self.sm = sm;
        self
    }

    /// Sets the cluster rank (default `u32::MAX`: no cluster).
    pub fn cluster_rank(&mut self, rank: u32) -> &mut Self {
        self.cluster_rank = rank;
        self
    }

    /// Sets `last_ts` explicitly.
    pub fn last_ts(&mut self, t: u64) -> &mut Self {
        self.last_ts = Some(t);
        self
    }

    /// Writes the slot (its header and kept entries) at the start of `out`.
    fn write(&self, index: u32, capacity: u32, out: &mut [u8]) {
        let cap = (capacity as usize).saturating_mul(RECORD_SIZE / ENTRY_SIZE);
        let kept = self.entries.len().min(cap);
        let latest = self.entries.iter().map(|&(_, t)| t).max().unwrap_or(0);
        let last = self.last_ts.unwrap_or(latest);
        let anchor = match kept < self.entries.len() {
            true => self.entries[..kept].last().map_or(0, |&(_, t)| t),
            false => last,
        };
        let put = |out: &mut [u8], at: usize, v: &[u8]| out[at..at + v.len()].copy_from_slice(v);
        put(out, v2o::MAGIC, &SLOT_MAGIC_V2.to_le_bytes());
        put(out, v2o::ENTRY_COUNT, &(kept as u32).to_le_bytes());
        put(out, v2o::LAST_TS, &last.to_le_bytes());
        put(out, v2o::ANCHOR_TS, &anchor.to_le_bytes());
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let lost = &self.entries[kept..];
        put(out, v2o::ENTRIES_LOST, &count(lost.len()).to_le_bytes());
        let events = lost.iter().filter(|(e, _)| e.ends_event()).count();
        put(out, v2o::EVENTS_LOST, &count(events).to_le_bytes());
        put(out, v2o::SM, &self.sm.to_le_bytes());
        put(out, v2o::SLOT, &index.to_le_bytes());
        put(out, v2o::CLUSTER_RANK, &self.cluster_rank.to_le_bytes());
        for (n, (e, _)) in self.entries[..kept].iter().enumerate() {
            e.write_to(&mut out[SLOT_HEADER_SIZE + n * ENTRY_SIZE..]);
        }
    }
}

impl SlotBuilder {
    /// Pushes a range `[start_ns, end_ns]`.
    pub fn range(&mut self, id: u16, start_ns: u64, end_ns: u64, payload: u32) -> &mut Self {
        self.push(Event {
            id,
            kind: EventKind::Range,
            start_ns,
            end_ns,
            payload,
        })
    }

    /// Pushes an instant at `at_ns`.
    pub fn instant(&mut self, id: u16, at_ns: u64, payload: u32) -> &mut Self {
        self.push(Event {
            id,
            kind: EventKind::Instant,
            start_ns: at_ns,
            end_ns: at_ns,
            payload,
        })
    }

    /// Pushes an event.
    pub fn push(&mut self, e: Event) -> &mut Self {
        self.events.push(e);
        self
    }

    /// Sets `%smid` at the first event and at flush (they differ: migrated).
    pub fn sm(&mut self, first: u32, last: u32) -> &mut Self {
        self.sm = (first, last);
        self
    }

    /// Sets the cluster rank (default `u32::MAX`: no cluster).
    pub fn cluster_rank(&mut self, rank: u32) -> &mut Self {
        self.cluster_rank = rank;
        self
    }

    /// Sets `first_ts` explicitly.
    pub fn first_ts(&mut self, t: u64) -> &mut Self {
        self.first_ts = Some(t);
        self
    }

    /// Sets `last_ts` explicitly.
    pub fn last_ts(&mut self, t: u64) -> &mut Self {
        self.last_ts = Some(t);
        self
    }

    /// Marks that a range was open at flush.
    pub fn open_at_flush(&mut self, open: bool) -> &mut Self {
        self.open_at_flush = open;
        self
    }
}

/// The same buffer with its slots cut to the longest slot's records (the
/// collector's copy of a launch, `src/cuda/collector.rs`; a v2 slot's entries
/// count for half a record each): `bytes` is a buffer (its header may be zero) of `header`'s shape; the result is a valid v1
/// buffer, with `header` written into it, whose capacity is the largest
/// `record_count` of its slots. Nothing a reader sees changes (the records past a
/// slot's count are never read), but the copy holds only what the device wrote: a
/// launch that records 4 events per warp into slots of 256 keeps 128 bytes a warp,
/// not 4,160. A buffer whose slot headers do not fit its shape (a count past the
/// capacity, or too few bytes) is copied whole, for the reader to reject.
#[cfg(any(feature = "cuda", test))]
pub(crate) fn trimmed(bytes: &[u8], header: &BufferHeader) -> Vec<u8> {
    let head = header.size();
    let whole = || {
        let mut v = bytes.to_vec();
        if v.len() >= head {
            header.write_to(&mut v);
        }
        v
    };
    let (slots, capacity) = (header.slot_count as usize, header.slot_capacity);
    let Some(size) = header.buffer_size() else {
        return whole();
    };
    if bytes.len() < size {
        return whole();
    }
    let stride = super::slot_stride(capacity);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    // The room a slot's writes take, in records: a v2 slot's entries take half a record each.
    let count_at = |i: usize| {
        let slot = head + i * stride;
        if u32_at(slot) == SLOT_MAGIC_V2 {
            u32_at(slot + v2o::ENTRY_COUNT).div_ceil((RECORD_SIZE / ENTRY_SIZE) as u32)
        } else {
            u32_at(slot + super::slot_offsets::RECORD_COUNT)
        }
    };
    let longest = (0..slots).map(count_at).max().unwrap_or(0);
    if longest > capacity {
        return whole();
    }
    let keep = SLOT_HEADER_SIZE + longest as usize * RECORD_SIZE;
    let mut out = Vec::with_capacity(head + slots * keep);
    out.resize(head, 0);
    for i in 0..slots {
        let at = head + i * stride;
        out.extend_from_slice(&bytes[at..at + keep]);
    }
    BufferHeader {
        slot_capacity: longest,
        ..*header
    }
    .write_to(&mut out);
    out
}

#[cfg(test)]
mod trim_tests {
    use super::*;
    use crate::decode::Buffer;
    use crate::format::BUFFER_HEADER_SIZE;

    fn events(bytes: &[u8]) -> Vec<(u32, Vec<Event>, u32)> {
        let b = Buffer::decode(bytes, None).unwrap();
        b.slots()
            .map(|s| (s.index, s.events().collect(), s.events_lost()))
            .collect()
    }

    #[test]
    fn a_trimmed_buffer_decodes_to_the_same_events() {
        let mut b = BufferBuilder::new([3, 1, 1], [96, 1, 1], 64);
        b.warp(0, 1)
            .unwrap()
            .range(1, 100, 200, 7)
            .instant(2, 250, 0);
        b.warp(2, 2).unwrap().range(1, 300, 400, 0);
        let header = *b.header();
        let mut bytes = b.finish();
        let want = events(&bytes);
        // As the device leaves it: no buffer header.
        bytes[..BUFFER_HEADER_SIZE].fill(0);
        let t = trimmed(&bytes, &header);
        assert_eq!(
            t.len(),
            BUFFER_HEADER_SIZE + 9 * (SLOT_HEADER_SIZE + 2 * RECORD_SIZE)
        );
        assert_eq!(events(&t), want);
        let h = *Buffer::decode(&t, None).unwrap().header();
        assert_eq!((h.slot_capacity, h.slot_count), (2, 9));
    }

    #[test]
    fn drops_and_empty_buffers_survive_trimming() {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 2);
        b.warp(0, 0)
            .unwrap()
            .range(1, 100, 200, 0)
            .range(1, 200, 300, 0)
            .range(1, 300, 400, 0);
        let header = *b.header();
        let bytes = b.finish();
        assert_eq!(events(&trimmed(&bytes, &header)), events(&bytes));
        let empty = BufferBuilder::new([2, 1, 1], [32, 1, 1], 8);
        let h = *empty.header();
        let t = trimmed(&empty.finish(), &h);
        assert_eq!(t.len(), BUFFER_HEADER_SIZE + 2 * SLOT_HEADER_SIZE);
        assert_eq!(Buffer::decode(&t, None).unwrap().event_count(), 0);
    }

    #[test]
    fn a_count_past_the_capacity_is_left_for_the_reader_to_reject() {
        let b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 2);
        let header = *b.header();
        let mut bytes = b.finish();
        let at = BUFFER_HEADER_SIZE + super::super::slot_offsets::RECORD_COUNT;
        bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        let t = trimmed(&bytes, &header);
        assert_eq!(t.len(), bytes.len());
        assert!(Buffer::decode(&t, None).is_err());
    }
}
