//! Streaming rings (docs/format.md, "Streaming slots"): a warp's slot as a ring
//! of 256-byte chunks in host memory that the host drains while the kernel runs.

/// [`crate::format::KernelArg::capacity`] with this bit set: `base` is a
/// streaming buffer in mapped host memory, each slot a ring of chunks.
pub const TRACE_STREAM: u32 = 0x4000_0000;
/// `"STM2"` read as a little-endian `u32`: a flushed streaming slot.
pub const SLOT_MAGIC_STREAM: u32 = u32::from_le_bytes(*b"STM2");
/// Bytes of one chunk.
pub const CHUNK_SIZE: usize = 256;
/// Entries a chunk holds at most (the 32nd place is its meta).
pub const CHUNK_ENTRIES: usize = 31;
/// Records (of 16 bytes) per chunk: a streaming slot's capacity is a multiple of it.
pub const CHUNK_RECORDS: u32 = (CHUNK_SIZE / super::RECORD_SIZE) as u32;
/// Bit 15 of a streamed entry's `kind`, and of a chunk meta's `info`: set in
/// every word the device writes, so that a written word is never zero.
pub const STREAM_MARK: u16 = 0x8000;
/// Bit of a chunk meta's `info`: entries were dropped since the warp's previous chunk.
pub const CHUNK_GAP: u16 = 0x20;
/// Bits of a chunk meta's `info` that hold the entry count.
pub const CHUNK_COUNT_MASK: u16 = 0x1F;
/// Where a chunk meta's `info` holds `%smid` (9 bits): a live part must name
/// the warp's SM before the warp flushes.
pub const CHUNK_SM_SHIFT: u16 = 6;
/// The `%smid` bits of a chunk meta's `info`, shifted down.
pub const CHUNK_SM_MASK: u16 = 0x1FF;

/// Byte offsets in a streaming slot header.
pub mod stream_slot_offsets {
    /// `u32` [`super::SLOT_MAGIC_STREAM`], written at flush.
    pub const MAGIC: usize = 0;
    /// `u32` chunks stored in all.
    pub const CHUNKS: usize = 4;
    /// `u64` `%globaltimer` at flush.
    pub const LAST_TS: usize = 8;
    /// `u32` entries stored in chunks.
    pub const ENTRY_COUNT: usize = 16;
    /// `u32` entries dropped because the ring was full.
    pub const DROP_COUNT: usize = 20;
    /// `u32` `%smid` at flush.
    pub const SM: usize = 24;
    /// `u32` the slot's own index.
    pub const SLOT: usize = 28;
    /// `u32` `%cluster_ctarank`, or [`crate::format::NO_CLUSTER`].
    pub const CLUSTER_RANK: usize = 32;
    /// `u32` chunks the host has consumed: the one word the host writes.
    pub const READ: usize = 48;
}

/// Byte offsets in a chunk's meta, the chunk's last 8 bytes.
pub mod chunk_meta_offsets {
    /// `u32` bits 0-31 of the stamp taken when the chunk was stored.
    pub const STAMP_LO: usize = 248;
    /// `u16` bits 32-47 of the stamp.
    pub const STAMP_MID: usize = 252;
    /// `u16` [`super::STREAM_MARK`] | `%smid` << [`super::CHUNK_SM_SHIFT`] |
    /// [`super::CHUNK_GAP`] | the entry count.
    pub const INFO: usize = 254;
}
