//! The wire format's numbers: magics, sizes, kinds, flags and field offsets, the
//! Rust mirror of `kernels/include/tracing_gpu.cuh`. Not API: it is here for the
//! test that checks every constant against the header
//! (`tests/header_constants.rs`, which reads this file), the fuzzers and the
//! benchmarks, which build and corrupt buffers byte by byte. Writers in other
//! languages follow `docs/format.md`; Rust users build buffers with
//! [`BufferBuilder`](super::BufferBuilder) and read them with
//! [`Buffer`](crate::decode::Buffer).
//!
//! Every `pub const` of this file, in a `pub mod` or not, must be in the
//! header; the packed layout and a sampled buffer's sampling (host-made, not
//! in the header) are re-exported from `packed.rs` and `sampling.rs`.

pub use super::packed::{packed_offsets, BUFFER_FLAG_PACKED, PACKED_RECORD_SIZE};
pub use super::sampling::{sampling_offsets, BUFFER_FLAG_SAMPLED, SAMPLED_HEADER_SIZE};

/// `"TGPU"` read as a little-endian `u32`: the first four bytes of every buffer.
pub const BUFFER_MAGIC: u32 = u32::from_le_bytes(*b"TGPU");
/// `"SLOT"` read as a little-endian `u32`: written by the device when a slot is flushed.
/// A slot that still holds zero here was never flushed (its warp did not run the
/// recorder, or the kernel exited before the flush).
pub const SLOT_MAGIC: u32 = u32::from_le_bytes(*b"SLOT");
/// The wire format version this crate reads and writes.
pub const VERSION: u16 = 1;
/// Size of [`BufferHeader`](super::BufferHeader) in bytes.
pub const BUFFER_HEADER_SIZE: usize = 64;
/// Size of [`SlotHeader`](super::SlotHeader) in bytes.
pub const SLOT_HEADER_SIZE: usize = 64;
/// Size of one [`Record`](super::Record) in bytes.
pub const RECORD_SIZE: usize = 16;
/// Record kind: a closed range `[end − duration, end]`.
pub const KIND_RANGE: u16 = 0;
/// Record kind: an instant at `end` (duration is zero).
pub const KIND_INSTANT: u16 = 1;
/// Slot flag (in [`SlotHeader::flags`](super::SlotHeader::flags)): the warp ran on more than one SM
/// (`sm_first != sm_last`).
pub const SLOT_FLAG_MIGRATED: u32 = 1;
/// Slot flag: a range was still open when the slot was flushed (it is not recorded).
pub const SLOT_FLAG_OPEN_AT_FLUSH: u32 = 2;
/// Cluster rank written by devices without thread-block clusters (before sm_90).
pub const NO_CLUSTER: u32 = u32::MAX;
/// [`KernelArg::capacity`](super::KernelArg::capacity) with this bit set: `base` is the device address of a
/// `u64` holding the buffer's address (0: record nothing), which a captured
/// graph's prologue writes before each replay's kernel nodes run.
pub const TRACE_INDIRECT: u32 = 0x8000_0000;

/// `"SLT2"` read as a little-endian `u32`: the magic of a flushed slot of v2 entries
/// (`docs/format.md`, "Slot format v2").
pub const SLOT_MAGIC_V2: u32 = u32::from_le_bytes(*b"SLT2");
/// Size of one v2 `Entry` in bytes: a slot of `capacity` records holds twice as many.
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

/// [`KernelArg::capacity`](super::KernelArg::capacity) with this bit set: streaming (`docs/format.md`, "Streaming
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

/// `"WTCH"` read as a little-endian `u32`: a watch cell's head once its warp has started
/// (`docs/format.md`, "Watch cells").
pub const WATCH_MAGIC: u32 = u32::from_le_bytes(*b"WTCH");
/// `"WEND"` read as a little-endian `u32`: a watch cell's head once its warp has flushed.
pub const WATCH_MAGIC_DONE: u32 = u32::from_le_bytes(*b"WEND");
/// Size of a watch cell's head and of each of its records.
pub const WATCH_RECORD_SIZE: usize = 16;
/// Records per watch cell: one per depth of open ranges, and one above the deepest.
pub const WATCH_RECORDS: usize = MAX_DEPTH + 1;
/// Size of one warp's watch cell: the head, then [`WATCH_RECORDS`] records.
pub const WATCH_CELL_SIZE: usize = WATCH_RECORD_SIZE * (WATCH_RECORDS + 1);
/// Watch record flags: set in every record, so that a written record is never zero.
pub const WATCH_MARK: u16 = 0x8000;
/// The watch record flags' bits that hold the entry's kind (`ENTRY_BEGIN` to `ENTRY_INSTANT`).
pub const WATCH_KIND_MASK: u16 = 0x7;
/// Watch record flag: the warp had closed a range (or made an instant) by this entry;
/// [`watch_offsets::CLOSED_ID`] says which, the latest.
pub const WATCH_CLOSED: u16 = 0x8;
/// Watch record flag: that range was closed with a payload, [`watch_offsets::PAYLOAD`].
pub const WATCH_PAYLOAD: u16 = 0x10;
/// Where the watch record flags hold the warp's entry count modulo 1024, which orders
/// two records stamped at one timer value.
pub const WATCH_SEQ_SHIFT: u16 = 5;
/// The entry count's bits of the flags, shifted down.
pub const WATCH_SEQ_MASK: u16 = 0x3FF;

/// Field offsets of the buffer header, as the header file and `docs/format.md` give them.
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
    /// `u32` events lost: records that did not fit, each an event.
    pub const EVENTS_LOST: usize = 60;
}

/// Field offsets of a v2 slot header (bytes from [`RESERVED`](slot_v2_offsets::RESERVED)
/// to the end are zero). The warp adds to
/// [`EVENTS_LOST`](slot_v2_offsets::EVENTS_LOST) where it drops entries; lane 0
/// writes the rest at flush.
pub mod slot_v2_offsets {
    /// `u32` [`super::SLOT_MAGIC_V2`].
    pub const MAGIC: usize = 0;
    /// `u32` entries written, at most twice the slot capacity.
    pub const ENTRY_COUNT: usize = 4;
    /// `u64` `%globaltimer` at flush.
    pub const LAST_TS: usize = 8;
    /// `u64` `%globaltimer` just after the last written entry: the times unwrap back from it.
    pub const ANCHOR_TS: usize = 16;
    /// `u32` entries lost: entries that did not fit (payloads and begins among them).
    pub const ENTRIES_LOST: usize = 24;
    /// `u32` `%smid` at flush.
    pub const SM: usize = 28;
    /// `u32` the slot's own index, as the warp computed it.
    pub const SLOT: usize = 32;
    /// `u32` `%cluster_ctarank`, or [`super::NO_CLUSTER`].
    pub const CLUSTER_RANK: usize = 36;
    /// `u32` events lost: the entries that did not fit and ended an event (an end, a
    /// switch or an instant).
    pub const EVENTS_LOST: usize = 40;
    /// Zero to the end of the header.
    pub const RESERVED: usize = 44;
}

/// Field offsets of a v2 entry.
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
pub mod slot_stream_offsets {
    /// `u32` [`super::SLOT_MAGIC_STREAM`] once flushed, else zero.
    pub const MAGIC: usize = 0;
    /// `u32` chunks stored in all, the flush's included.
    pub const CHUNKS: usize = 4;
    /// `u64` `%globaltimer` at flush.
    pub const LAST_TS: usize = 8;
    /// `u32` entries stored in chunks, in all.
    pub const ENTRY_COUNT: usize = 16;
    /// `u32` events lost: entries dropped because the ring was full that ended an
    /// event (an end, a switch or an instant).
    pub const EVENTS_LOST: usize = 20;
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
pub mod chunk_offsets {
    /// `u32` bits 0-31 of the `%globaltimer` stamp taken when the chunk was stored.
    pub const STAMP_LO: usize = 248;
    /// `u16` bits 32-47 of the same stamp.
    pub const STAMP_MID: usize = 252;
    /// `u16` [`super::STREAM_MARK`] | [`super::CHUNK_GAP`] if set | the entry count.
    pub const INFO: usize = 254;
}

/// Field offsets of a watch cell's head (written by the warp's first lane when it starts
/// and when it flushes).
pub mod watch_head_offsets {
    /// `u32` [`super::WATCH_MAGIC`], [`super::WATCH_MAGIC_DONE`], or zero before the warp starts.
    pub const MAGIC: usize = 0;
    /// `u32` `%smid` when written.
    pub const SM: usize = 4;
    /// `u64` `%globaltimer` when written.
    pub const TIME: usize = 8;
}

/// Field offsets of a watch record (one 16-byte store by the lane that stamped the entry).
pub mod watch_offsets {
    /// `u32` bits 0-31 of the entry's `%globaltimer` stamp.
    pub const TIME_LO: usize = 0;
    /// `u16` bits 32-47 of the same stamp.
    pub const TIME_MID: usize = 4;
    /// `u16` [`super::WATCH_MARK`] | the entry count << [`super::WATCH_SEQ_SHIFT`] |
    /// [`super::WATCH_PAYLOAD`] | [`super::WATCH_CLOSED`] | the entry's kind.
    pub const FLAGS: usize = 6;
    /// `u16` the event the entry opens (a begin, a switch), closes (an end) or marks (an instant).
    pub const EVENT_ID: usize = 8;
    /// `u16` the event the warp closed last, this entry included (with [`super::WATCH_CLOSED`]).
    pub const CLOSED_ID: usize = 10;
    /// `u32` its payload (with [`super::WATCH_PAYLOAD`]).
    pub const PAYLOAD: usize = 12;
}

/// Field offsets of a record.
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
