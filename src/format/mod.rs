//! The wire format: the bytes the device recorder writes, and nothing else. The
//! buffer is laid out one way; each flushed slot holds v1 records (magic
//! `"SLOT"`) or v2 entries (`"SLT2"`), and says which in its magic.
//!
//! For users: the [`KernelArg`] a kernel takes, the headers and [`Event`]s a
//! decoded buffer yields, and [`BufferBuilder`], which writes valid buffers on the
//! host. `docs/format.md` describes the bytes for authors of other writers (CuTe
//! DSL, Triton, hand-written PTX). The numbers themselves (magics, sizes, field
//! offsets) are in `format::wire`, the one mirror of
//! `kernels/include/tracing_gpu.cuh` on the Rust side, which a test
//! (`tests/header_constants.rs`) checks against the header; it is hidden, as it
//! is for the tests, the fuzzers and the benchmarks.
//!
//! Layout of one trace buffer (all integers little-endian):
//!
//! ```text
//! offset 0                     BufferHeader (64 B, written by the host before launch)
//! offset 64                    slot 0: SlotHeader (64 B) + capacity × Record (16 B)
//! offset 64 + stride           slot 1 ...
//! stride = SLOT_HEADER_SIZE + capacity × RECORD_SIZE
//! ```
//!
//! One slot belongs to one (block, warp): `slot = block_linear × warps_per_block + warp`.
//! Only lane 0 of the warp writes it, so no atomics are needed.

mod builder;
mod packed;
mod sampling;
#[cfg(any(feature = "cuda", test))]
pub(crate) use builder::trimmed;
pub use builder::{BufferBuilder, EntrySlotBuilder, SlotBuilder};
pub(crate) use packed::PackedIndex;
#[cfg(any(feature = "cuda", test))]
pub(crate) use packed::PackedWriter;
pub use sampling::Sampling;
#[doc(hidden)]
pub mod wire;
pub(crate) use wire::*;

/// The kernel argument that carries a trace buffer: passed by value, so the
/// device reads it from the parameter bank and never from global memory.
///
/// Mirrors `tgpu::Trace` in the header (32 bytes, 8-aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelArg {
    /// Device address 64 bytes before slot 0: the buffer's [`BufferHeader`], or in
    /// a sampled buffer its sampling; zero disables recording.
    pub base: u64,
    /// Records per slot.
    pub capacity: u32,
    /// Number of slots, one per sampled warp; a warp whose slot would be past it
    /// records nothing.
    pub slot_count: u32,
    /// Which blocks and warps record (read by each warp once, when its recorder
    /// is made); the default records every one.
    pub sampling: Sampling,
}

/// The host-written header at offset 0 of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferHeader {
    /// Wire format version.
    pub version: u16,
    /// Records per slot.
    pub slot_capacity: u32,
    /// Number of slots.
    pub slot_count: u32,
    /// Warps per block.
    pub warps_per_block: u32,
    /// Host-assigned launch id.
    pub launch_id: u64,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Flags: zero as the device's buffers have them, 1 (packed) for a packed
    /// buffer (a streamed launch's part, made by the host). The sampled flag
    /// (2) is not kept here: it is written and read with `sampling`.
    pub flags: u32,
    /// What the launch's slots cover: every warp, or the warps sampled (then
    /// the header is [`wire::SAMPLED_HEADER_SIZE`] bytes and slot `i` is the
    /// warp [`Sampling::place`] names).
    pub sampling: Sampling,
}

/// The device-written header at the start of each slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotHeader {
    /// `"SLOT"` read as a little-endian `u32` if flushed, else zero.
    pub magic: u32,
    /// Slot flags.
    pub flags: u32,
    /// First timer read of the warp (device ns).
    pub first_ts: u64,
    /// Last timer read of the warp (device ns).
    pub last_ts: u64,
    /// `%smid` at the first event.
    pub sm_first: u32,
    /// `%smid` at flush.
    pub sm_last: u32,
    /// Linear block index.
    pub block_linear: u32,
    /// `blockIdx`.
    pub block: [u32; 3],
    /// Warp index within the block.
    pub warp: u32,
    /// Cluster rank, or `u32::MAX` on devices without thread-block clusters.
    pub cluster_rank: u32,
    /// Records written.
    pub record_count: u32,
    /// Events lost: ranges and instants the warp made that are not in the slot
    /// (v1: records that did not fit; `docs/format.md` says what each slot
    /// format counts).
    pub events_lost: u32,
}

/// One 16-byte record as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    /// Low 32 bits of the end timestamp.
    pub end_lo: u32,
    /// Duration in ns.
    pub duration: u32,
    /// Event type id.
    pub event_id: u16,
    /// 0 for a range, 1 for an instant.
    pub kind: u16,
    /// User payload.
    pub payload: u32,
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

impl BufferHeader {
    /// Whether the buffer is sampled (its slots cover the warps its
    /// [`Sampling`] names, or its launch was one of every few).
    pub fn is_sampled(&self) -> bool {
        !self.sampling.is_all()
    }

    /// The header's size: 64 bytes, or [`wire::SAMPLED_HEADER_SIZE`] when sampled.
    /// Slot 0 follows it.
    pub fn size(&self) -> usize {
        match self.is_sampled() {
            true => SAMPLED_HEADER_SIZE,
            false => BUFFER_HEADER_SIZE,
        }
    }

    /// The buffer's size: the header and `slot_count` slots of `slot_capacity`
    /// records; `None` on overflow.
    pub fn buffer_size(&self) -> Option<usize> {
        (self.slot_count as usize)
            .checked_mul(slot_stride(self.slot_capacity))?
            .checked_add(self.size())
    }

    /// The block (linear index) and warp that slot `slot` belongs to; `None`
    /// past the grid.
    pub fn place(&self, slot: u32) -> Option<(u32, u32)> {
        let (block, warp) = self.sampling.place(slot, self.warps_per_block)?;
        let blocks: u64 = self.grid.iter().map(|&d| u64::from(d)).product();
        (u64::from(block) < blocks).then_some((block, warp))
    }

    /// Writes the header into the first [`BufferHeader::size`] bytes of `out`,
    /// as the host does before a launch.
    ///
    /// # Panics
    /// If `out` is shorter than that.
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..self.size()];
        b.fill(0);
        use buffer_offsets as o;
        if self.is_sampled() {
            use sampling_offsets as so;
            put_u32(b, so::WARP_MASK, self.sampling.warp_mask);
            put_u32(b, so::BLOCK_STRIDE, self.sampling.block_stride);
            put_u32(b, so::BLOCK_OFFSET, self.sampling.block_offset);
            put_u32(b, so::LAUNCH_EVERY, self.sampling.launch_every);
        }
        put_u32(b, o::MAGIC, BUFFER_MAGIC);
        put_u16(b, o::VERSION, self.version);
        put_u16(b, o::HEADER_SIZE, self.size() as u16);
        put_u16(b, o::SLOT_HEADER_SIZE, SLOT_HEADER_SIZE as u16);
        put_u16(b, o::RECORD_SIZE, RECORD_SIZE as u16);
        put_u32(b, o::SLOT_CAPACITY, self.slot_capacity);
        put_u32(b, o::SLOT_COUNT, self.slot_count);
        put_u32(b, o::WARPS_PER_BLOCK, self.warps_per_block);
        put_u64(b, o::LAUNCH_ID, self.launch_id);
        for i in 0..3 {
            put_u32(b, o::GRID + 4 * i, self.grid[i]);
            put_u32(b, o::BLOCK + 4 * i, self.block[i]);
        }
        let sampled = match self.is_sampled() {
            true => BUFFER_FLAG_SAMPLED,
            false => 0,
        };
        put_u32(b, o::FLAGS, self.flags | sampled);
    }
}

impl SlotHeader {
    /// Writes the slot header into the first 64 bytes of `out`,
    /// as the device does at flush. Used by tests and by host-side writers.
    ///
    /// # Panics
    /// If `out` is shorter than 64 bytes.
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..SLOT_HEADER_SIZE];
        use slot_offsets as o;
        put_u32(b, o::MAGIC, self.magic);
        put_u32(b, o::FLAGS, self.flags);
        put_u64(b, o::FIRST_TS, self.first_ts);
        put_u64(b, o::LAST_TS, self.last_ts);
        put_u32(b, o::SM_FIRST, self.sm_first);
        put_u32(b, o::SM_LAST, self.sm_last);
        put_u32(b, o::BLOCK_LINEAR, self.block_linear);
        for i in 0..3 {
            put_u32(b, o::BLOCK_XYZ + 4 * i, self.block[i]);
        }
        put_u32(b, o::WARP, self.warp);
        put_u32(b, o::CLUSTER_RANK, self.cluster_rank);
        put_u32(b, o::RECORD_COUNT, self.record_count);
        put_u32(b, o::EVENTS_LOST, self.events_lost);
    }
}

impl Record {
    /// Writes the record into the first 16 bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than 16 bytes.
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..RECORD_SIZE];
        use record_offsets as o;
        put_u32(b, o::END_LO, self.end_lo);
        put_u32(b, o::DURATION, self.duration);
        put_u16(b, o::EVENT_ID, self.event_id);
        put_u16(b, o::KIND, self.kind);
        put_u32(b, o::PAYLOAD, self.payload);
    }

    /// Reads a record from exactly 16 bytes.
    #[inline]
    pub fn read(b: &[u8; RECORD_SIZE]) -> Record {
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        use record_offsets as o;
        Record {
            end_lo: u32_at(o::END_LO),
            duration: u32_at(o::DURATION),
            event_id: u16_at(o::EVENT_ID),
            kind: u16_at(o::KIND),
            payload: u32_at(o::PAYLOAD),
        }
    }
}

/// One 8-byte v2 entry as stored: a phase boundary, an instant, or a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Entry {
    /// Low 32 bits of the time, or the payload of a payload entry.
    pub time_lo: u32,
    /// Event type id (zero in a payload entry).
    pub event_id: u16,
    /// One of the `ENTRY_*` kinds.
    pub kind: u16,
}

impl Entry {
    /// Writes the entry into the first [`ENTRY_SIZE`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`ENTRY_SIZE`].
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..ENTRY_SIZE];
        use entry_offsets as o;
        put_u32(b, o::TIME_LO, self.time_lo);
        put_u16(b, o::EVENT_ID, self.event_id);
        put_u16(b, o::KIND, self.kind);
    }

    /// Whether an event ends at this entry: an end, a switch or an instant (a
    /// payload entry may follow it). Each event ends at exactly one entry, so
    /// the entries lost that end an event count the events lost with them.
    #[inline]
    pub fn ends_event(&self) -> bool {
        matches!(self.kind, ENTRY_END | ENTRY_SWITCH | ENTRY_INSTANT)
    }

    /// Reads an entry from exactly [`ENTRY_SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8; ENTRY_SIZE]) -> Entry {
        use entry_offsets as o;
        Entry {
            time_lo: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            event_id: u16::from_le_bytes([b[o::EVENT_ID], b[o::EVENT_ID + 1]]),
            kind: u16::from_le_bytes([b[o::KIND], b[o::KIND + 1]]),
        }
    }
}

/// Range or instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// A closed range `[start_ns, end_ns]`.
    Range,
    /// An instant at `end_ns` (`start_ns == end_ns`).
    Instant,
}

/// One decoded event, in device nanoseconds (`%globaltimer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// The user's event type id (see [`EventRegistry`](crate::registry::EventRegistry)).
    pub id: u16,
    /// Range or instant.
    pub kind: EventKind,
    /// Start (equals `end_ns` for an instant).
    pub start_ns: u64,
    /// End, or the instant's time.
    pub end_ns: u64,
    /// User payload.
    pub payload: u32,
}

impl Event {
    /// `end_ns − start_ns`.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_their_names() {
        assert_eq!(&BUFFER_MAGIC.to_le_bytes(), b"TGPU");
        assert_eq!(&SLOT_MAGIC.to_le_bytes(), b"SLOT");
    }

    #[test]
    fn kernel_arg_is_32_bytes() {
        assert_eq!(std::mem::size_of::<KernelArg>(), 32);
        assert_eq!(std::mem::align_of::<KernelArg>(), 8);
    }

    #[test]
    fn record_round_trips() {
        let r = Record {
            end_lo: 0xdead_beef,
            duration: 1234,
            event_id: 7,
            kind: KIND_INSTANT,
            payload: 99,
        };
        let mut b = [0u8; RECORD_SIZE];
        r.write_to(&mut b);
        assert_eq!(Record::read(&b), r);
    }

    #[test]
    fn entry_round_trips() {
        let e = Entry {
            time_lo: 0xdead_beef,
            event_id: 7,
            kind: ENTRY_SWITCH,
        };
        let mut b = [0u8; ENTRY_SIZE];
        e.write_to(&mut b);
        assert_eq!(Entry::read(&b), e);
        assert_eq!(b, [0xef, 0xbe, 0xad, 0xde, 7, 0, 2, 0]);
        assert_eq!(&SLOT_MAGIC_V2.to_le_bytes(), b"SLT2");
    }

    #[test]
    fn sizes_do_not_overflow() {
        assert_eq!(buffer_size(2, 3), Some(64 + 2 * (64 + 48)));
        assert_eq!(buffer_size(u32::MAX, u32::MAX), None);
    }
}
