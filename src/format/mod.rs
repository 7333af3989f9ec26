//! The wire format: the bytes the device recorder writes, and nothing else. The
//! buffer is laid out one way; each flushed slot holds v1 records ([`SLOT_MAGIC`])
//! or v2 entries ([`SLOT_MAGIC_V2`]), and says which in its magic.
//!
//! This module is the one mirror, on the Rust side, of
//! `kernels/include/tracing_gpu.cuh`; `docs/format.md` is the prose version
//! for authors of other writers (CuTe DSL, Triton, hand-written PTX). A test
//! (`tests/header_constants.rs`) checks every constant here against the header.
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
#[cfg(any(feature = "cuda", test))]
pub(crate) use builder::trimmed;
pub use builder::{BufferBuilder, EntrySlotBuilder, SlotBuilder};
pub(crate) use packed::PackedIndex;
#[cfg(any(feature = "cuda", test))]
pub(crate) use packed::PackedWriter;
pub use packed::{packed_offsets, BUFFER_FLAG_PACKED, PACKED_RECORD_SIZE};

/// `"TGPU"` read as a little-endian `u32`: the first four bytes of every buffer.
pub const BUFFER_MAGIC: u32 = u32::from_le_bytes(*b"TGPU");
/// `"SLOT"` read as a little-endian `u32`: written by the device when a slot is flushed.
/// A slot that still holds zero here was never flushed (its warp did not run the
/// recorder, or the kernel exited before the flush).
pub const SLOT_MAGIC: u32 = u32::from_le_bytes(*b"SLOT");
/// The wire format version this crate reads and writes.
pub const VERSION: u16 = 1;
/// Size of [`BufferHeader`] in bytes.
pub const BUFFER_HEADER_SIZE: usize = 64;
/// Size of [`SlotHeader`] in bytes.
pub const SLOT_HEADER_SIZE: usize = 64;
/// Size of one [`Record`] in bytes.
pub const RECORD_SIZE: usize = 16;
/// Record kind: a closed range `[end − duration, end]`.
pub const KIND_RANGE: u16 = 0;
/// Record kind: an instant at `end` (duration is zero).
pub const KIND_INSTANT: u16 = 1;
/// Slot flag (in [`SlotHeader::flags`]): the warp ran on more than one SM
/// (`sm_first != sm_last`).
pub const SLOT_FLAG_MIGRATED: u32 = 1;
/// Slot flag: a range was still open when the slot was flushed (it is not recorded).
pub const SLOT_FLAG_OPEN_AT_FLUSH: u32 = 2;
/// Cluster rank written by devices without thread-block clusters (before sm_90).
pub const NO_CLUSTER: u32 = u32::MAX;
/// [`KernelArg::capacity`] with this bit set: `base` is the device address of a
/// `u64` holding the buffer's address (0: record nothing), which a captured
/// graph's prologue writes before each replay's kernel nodes run.
pub const TRACE_INDIRECT: u32 = 0x8000_0000;

/// `"SLT2"` read as a little-endian `u32`: the magic of a flushed slot of v2 entries
/// (`docs/format.md`, "Slot format v2").
pub const SLOT_MAGIC_V2: u32 = u32::from_le_bytes(*b"SLT2");
/// Size of one v2 [`Entry`] in bytes: a slot of `capacity` records holds twice as many.
pub const ENTRY_SIZE: usize = 8;
/// Entry kind: a range of `event_id` opens, nested in those open.
pub const ENTRY_BEGIN: u16 = 0;
/// Entry kind: the innermost open range closes; it must be `event_id`'s.
pub const ENTRY_END: u16 = 1;
/// Entry kind: the innermost open range closes and one of `event_id` opens at the same time.
pub const ENTRY_SWITCH: u16 = 2;
/// Entry kind: an instant of `event_id`.
pub const ENTRY_INSTANT: u16 = 3;
/// Entry kind: `time_lo` holds the payload of the event the previous entry ended
/// (an end, a switch or an instant); `event_id` is zero.
pub const ENTRY_PAYLOAD: u16 = 4;
/// The deepest nesting of open ranges a v2 slot may hold.
pub const MAX_DEPTH: usize = 32;

/// [`KernelArg::capacity`] with this bit set: streaming (`docs/format.md`, "Streaming
/// slots"). `base` is a buffer in host memory mapped into the device, and each slot a
/// ring of `capacity / 16` chunks that the host drains while the kernel runs (v2 only,
/// never with [`TRACE_INDIRECT`]).
pub const TRACE_STREAM: u32 = 0x4000_0000;
/// `"STM2"` read as a little-endian `u32`: the magic of a flushed streaming slot.
pub const SLOT_MAGIC_STREAM: u32 = u32::from_le_bytes(*b"STM2");
/// Size of one chunk of a streaming ring: [`CHUNK_ENTRIES`] entries, then the meta.
pub const CHUNK_SIZE: usize = 256;
/// Entries a chunk holds at most (positions 0-30; the meta is at position 31).
pub const CHUNK_ENTRIES: usize = 31;
/// Set in the `kind` of every entry of a chunk, and in its meta's `info`, so that no
/// stored word is zero: a chunk is complete when its meta and its `n` entries have it.
pub const STREAM_MARK: u16 = 0x8000;
/// Meta `info` flag: entries of this warp were dropped since its previous chunk.
pub const CHUNK_GAP: u16 = 0x20;
/// Meta `info` bits that hold `n`, the chunk's entry count (1 to [`CHUNK_ENTRIES`]).
pub const CHUNK_COUNT_MASK: u16 = 0x1F;
/// Where a meta's `info` holds the low bits of `%smid`: a part names a warp's SM
/// before the warp flushes.
pub const CHUNK_SM_SHIFT: u16 = 6;
/// The `%smid` bits of a meta's `info`, shifted down.
pub const CHUNK_SM_MASK: u16 = 0x1FF;

/// Field offsets of the buffer header, as the header file and `docs/format.md` give them.
#[doc(hidden)]
pub mod buffer_offsets {
    /// `u32` magic, [`super::BUFFER_MAGIC`].
    pub const MAGIC: usize = 0;
    /// `u16` version, [`super::VERSION`].
    pub const VERSION: usize = 4;
    /// `u16` size of the buffer header.
    pub const HEADER_SIZE: usize = 6;
    /// `u16` size of a slot header.
    pub const SLOT_HEADER_SIZE: usize = 8;
    /// `u16` size of a record.
    pub const RECORD_SIZE: usize = 10;
    /// `u32` records per slot.
    pub const SLOT_CAPACITY: usize = 12;
    /// `u32` number of slots.
    pub const SLOT_COUNT: usize = 16;
    /// `u32` warps per block of the launch.
    pub const WARPS_PER_BLOCK: usize = 20;
    /// `u64` the host's id for this launch.
    pub const LAUNCH_ID: usize = 24;
    /// `u32 × 3` grid dimensions in blocks.
    pub const GRID: usize = 32;
    /// `u32 × 3` block dimensions in threads.
    pub const BLOCK: usize = 44;
    /// `u32` flags, zero in v1.
    pub const FLAGS: usize = 56;
    /// `u32` reserved, zero.
    pub const RESERVED: usize = 60;
}

/// Field offsets of a slot header.
#[doc(hidden)]
pub mod slot_offsets {
    /// `u32` [`super::SLOT_MAGIC`] once flushed, else zero.
    pub const MAGIC: usize = 0;
    /// `u32` slot flags ([`super::SLOT_FLAG_MIGRATED`], [`super::SLOT_FLAG_OPEN_AT_FLUSH`]).
    pub const FLAGS: usize = 4;
    /// `u64` `%globaltimer` at the warp's first timer read.
    pub const FIRST_TS: usize = 8;
    /// `u64` `%globaltimer` at the warp's last timer read.
    pub const LAST_TS: usize = 16;
    /// `u32` `%smid` at the first event.
    pub const SM_FIRST: usize = 24;
    /// `u32` `%smid` at flush.
    pub const SM_LAST: usize = 28;
    /// `u32` linear block index (`x + y·gx + z·gx·gy`).
    pub const BLOCK_LINEAR: usize = 32;
    /// `u32 × 3` `blockIdx`.
    pub const BLOCK_XYZ: usize = 36;
    /// `u32` warp index within the block, from `threadIdx`.
    pub const WARP: usize = 48;
    /// `u32` `%cluster_ctarank`, or [`super::NO_CLUSTER`].
    pub const CLUSTER_RANK: usize = 52;
    /// `u32` records written.
    pub const RECORD_COUNT: usize = 56;
    /// `u32` records dropped because the slot was full.
    pub const DROP_COUNT: usize = 60;
}

/// Field offsets of a v2 slot header (bytes from [`RESERVED`](slot_v2_offsets::RESERVED)
/// to the end are zero).
#[doc(hidden)]
pub mod slot_v2_offsets {
    /// `u32` [`super::SLOT_MAGIC_V2`].
    pub const MAGIC: usize = 0;
    /// `u32` entries written, at most twice the slot capacity.
    pub const ENTRY_COUNT: usize = 4;
    /// `u64` `%globaltimer` at flush.
    pub const LAST_TS: usize = 8;
    /// `u64` `%globaltimer` just after the last written entry: the times unwrap back from it.
    pub const ANCHOR_TS: usize = 16;
    /// `u32` entries that did not fit and were dropped.
    pub const DROP_COUNT: usize = 24;
    /// `u32` `%smid` at flush.
    pub const SM: usize = 28;
    /// `u32` the slot's own index, as the warp computed it.
    pub const SLOT: usize = 32;
    /// `u32` `%cluster_ctarank`, or [`super::NO_CLUSTER`].
    pub const CLUSTER_RANK: usize = 36;
    /// Zero to the end of the header.
    pub const RESERVED: usize = 40;
}

/// Field offsets of a v2 entry.
#[doc(hidden)]
pub mod entry_offsets {
    /// `u32` low 32 bits of `%globaltimer` (a payload, in a payload entry).
    pub const TIME_LO: usize = 0;
    /// `u16` the user's event type id (zero in a payload entry).
    pub const EVENT_ID: usize = 4;
    /// `u16` one of the `ENTRY_*` kinds.
    pub const KIND: usize = 6;
}

/// Field offsets of a streaming slot header: the device writes bytes 0 to
/// [`RESERVED`](slot_stream_offsets::RESERVED) at flush, the host writes
/// [`READ`](slot_stream_offsets::READ) while the kernel runs, the rest stays zero.
#[doc(hidden)]
pub mod slot_stream_offsets {
    /// `u32` [`super::SLOT_MAGIC_STREAM`] once flushed, else zero.
    pub const MAGIC: usize = 0;
    /// `u32` chunks stored in all, the flush's included.
    pub const CHUNKS: usize = 4;
    /// `u64` `%globaltimer` at flush.
    pub const LAST_TS: usize = 8;
    /// `u32` entries stored in chunks, in all.
    pub const ENTRY_COUNT: usize = 16;
    /// `u32` entries dropped because the ring was full.
    pub const DROP_COUNT: usize = 20;
    /// `u32` `%smid` at flush.
    pub const SM: usize = 24;
    /// `u32` the slot's own index, as the warp computed it.
    pub const SLOT: usize = 28;
    /// `u32` `%cluster_ctarank`, or [`super::NO_CLUSTER`].
    pub const CLUSTER_RANK: usize = 32;
    /// 12 bytes, zero.
    pub const RESERVED: usize = 36;
    /// `u32` host-written: the chunks the host has consumed.
    pub const READ: usize = 48;
    /// 12 bytes, zero.
    pub const RESERVED_AFTER_READ: usize = 52;
}

/// Field offsets of a chunk's meta, in the chunk (entries are at `8 × position` before it).
#[doc(hidden)]
pub mod chunk_offsets {
    /// `u32` bits 0-31 of the `%globaltimer` stamp taken when the chunk was stored.
    pub const STAMP_LO: usize = 248;
    /// `u16` bits 32-47 of the same stamp.
    pub const STAMP_MID: usize = 252;
    /// `u16` [`super::STREAM_MARK`] | [`super::CHUNK_GAP`] if set | the entry count.
    pub const INFO: usize = 254;
}

/// Field offsets of a record.
#[doc(hidden)]
pub mod record_offsets {
    /// `u32` low 32 bits of the `%globaltimer` value at the end (or the instant).
    pub const END_LO: usize = 0;
    /// `u32` duration in ns (`end − start`, modulo 2³²).
    pub const DURATION: usize = 4;
    /// `u16` the user's event type id.
    pub const EVENT_ID: usize = 8;
    /// `u16` [`super::KIND_RANGE`] or [`super::KIND_INSTANT`].
    pub const KIND: usize = 10;
    /// `u32` user payload (a k-tile index, a byte count...).
    pub const PAYLOAD: usize = 12;
}

/// The kernel argument that carries a trace buffer: passed by value, so the
/// device reads it from the parameter bank and never from global memory.
///
/// Mirrors `tgpu::Trace` in the header (16 bytes, 8-aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelArg {
    /// Device address of the buffer (its [`BufferHeader`]); zero disables recording.
    pub base: u64,
    /// Records per slot.
    pub capacity: u32,
    /// Number of slots; a warp whose slot index is past it records nothing.
    pub slot_count: u32,
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
    /// Flags: zero as the device's buffers have them, [`BUFFER_FLAG_PACKED`]
    /// for a packed buffer (a streamed launch's part, made by the host).
    pub flags: u32,
}

/// The device-written header at the start of each slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotHeader {
    /// [`SLOT_MAGIC`] if flushed.
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
    /// Cluster rank, or [`NO_CLUSTER`].
    pub cluster_rank: u32,
    /// Records written.
    pub record_count: u32,
    /// Records dropped.
    pub drop_count: u32,
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
    /// [`KIND_RANGE`] or [`KIND_INSTANT`].
    pub kind: u16,
    /// User payload.
    pub payload: u32,
}

/// Bytes between the starts of two consecutive slots for a given capacity.
pub const fn slot_stride(capacity: u32) -> usize {
    SLOT_HEADER_SIZE + capacity as usize * RECORD_SIZE
}

/// Total buffer size for `slot_count` slots of `capacity` records, or `None` on overflow.
pub fn buffer_size(slot_count: u32, capacity: u32) -> Option<usize> {
    (slot_count as usize)
        .checked_mul(slot_stride(capacity))?
        .checked_add(BUFFER_HEADER_SIZE)
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
    /// Writes the header into the first [`BUFFER_HEADER_SIZE`] bytes of `out`,
    /// as the host does before a launch.
    ///
    /// # Panics
    /// If `out` is shorter than [`BUFFER_HEADER_SIZE`].
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..BUFFER_HEADER_SIZE];
        b.fill(0);
        use buffer_offsets as o;
        put_u32(b, o::MAGIC, BUFFER_MAGIC);
        put_u16(b, o::VERSION, self.version);
        put_u16(b, o::HEADER_SIZE, BUFFER_HEADER_SIZE as u16);
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
        put_u32(b, o::FLAGS, self.flags);
    }
}

impl SlotHeader {
    /// Writes the slot header into the first [`SLOT_HEADER_SIZE`] bytes of `out`,
    /// as the device does at flush. Used by tests and by host-side writers.
    ///
    /// # Panics
    /// If `out` is shorter than [`SLOT_HEADER_SIZE`].
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
        put_u32(b, o::DROP_COUNT, self.drop_count);
    }
}

impl Record {
    /// Writes the record into the first [`RECORD_SIZE`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`RECORD_SIZE`].
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..RECORD_SIZE];
        use record_offsets as o;
        put_u32(b, o::END_LO, self.end_lo);
        put_u32(b, o::DURATION, self.duration);
        put_u16(b, o::EVENT_ID, self.event_id);
        put_u16(b, o::KIND, self.kind);
        put_u32(b, o::PAYLOAD, self.payload);
    }

    /// Reads a record from exactly [`RECORD_SIZE`] bytes.
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
pub struct Entry {
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
    fn kernel_arg_is_16_bytes() {
        assert_eq!(std::mem::size_of::<KernelArg>(), 16);
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
