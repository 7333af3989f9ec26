//! An unpacked buffer read a slot at a time from a stream (a capture's trace
//! buffer, `src/capture/`), keeping only what its slots hold: an empty slot is
//! checked as its bytes pass and kept nowhere, a flushed one is kept from its
//! header to the end of what its header says it holds. So a buffer costs what
//! its contents take, whatever its header declares: a few flushed slots in a
//! buffer of a gigabyte of empty ones take a few kilobytes.
//!
//! Each slot is checked as it comes, as [`Buffer::decode`](super::Buffer::decode)
//! checks it, so that both accept the same bytes and refuse them with the same
//! error, at the same slot.

use super::bytes::u32_at;
use super::{read_buffer_header, DecodeError, Index, OwnedBuffer};
use crate::format::{
    self, buffer_offsets as bo, slot_offsets as so, slot_v2_offsets as v2o, BUFFER_FLAG_PACKED,
    BUFFER_FLAG_SAMPLED, BUFFER_HEADER_SIZE, ENTRY_SIZE, RECORD_SIZE, SAMPLED_HEADER_SIZE,
    SLOT_HEADER_SIZE, SLOT_MAGIC, SLOT_MAGIC_V2,
};

/// An unpacked buffer being read slot by slot.
#[derive(Debug)]
pub(crate) struct Sparse {
    bytes: Vec<u8>,
    index: Index,
    stride: usize,
}

impl Sparse {
    /// The bytes of the header that begins with `first`, the buffer's first
    /// [`BUFFER_HEADER_SIZE`] bytes: those, or a sampled buffer's
    /// [`SAMPLED_HEADER_SIZE`] (read them all before [`Sparse::begin`]).
    pub(crate) fn header_size(first: &[u8]) -> usize {
        let flags = first
            .get(bo::FLAGS..bo::FLAGS + 4)
            .map_or(0, |_| u32_at(first, bo::FLAGS));
        match flags & BUFFER_FLAG_SAMPLED {
            0 => BUFFER_HEADER_SIZE,
            _ => SAMPLED_HEADER_SIZE,
        }
    }

    /// Begins the buffer whose header is `head` ([`Sparse::header_size`] bytes),
    /// read from a field of `len` bytes; `None` for a packed buffer (every byte
    /// of it is content: decode it whole) or one shorter than its header.
    pub(crate) fn begin(head: &[u8], len: u64) -> Result<Option<Sparse>, DecodeError> {
        if head.len() < BUFFER_HEADER_SIZE || head.len() < Sparse::header_size(head) {
            return Ok(None);
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let (header, size) = read_buffer_header(head, len)?;
        if header.flags == BUFFER_FLAG_PACKED {
            return Ok(None);
        }
        let mut index = Index::empty(header, header.size());
        index.wire_size = size;
        Ok(Some(Sparse {
            bytes: head[..header.size()].to_vec(),
            index,
            stride: format::slot_stride(header.slot_capacity),
        }))
    }

    /// Slots the buffer declares.
    pub(crate) fn slot_count(&self) -> u32 {
        self.index.header.slot_count
    }

    /// Bytes of each slot, its header included.
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// Bytes the buffer occupies in the field: those after it are not read.
    pub(crate) fn wire_size(&self) -> usize {
        self.index.wire_size
    }

    /// Bytes after a flushed slot's header (`slot_header`, its first
    /// [`SLOT_HEADER_SIZE`] bytes) that the reader reads: what its count says
    /// it holds, at most the slot's room. The rest of the slot is not read.
    pub(crate) fn held(&self, slot_header: &[u8]) -> usize {
        let held = match u32_at(slot_header, so::MAGIC) {
            SLOT_MAGIC => u32_at(slot_header, so::RECORD_COUNT) as usize * RECORD_SIZE,
            SLOT_MAGIC_V2 => u32_at(slot_header, v2o::ENTRY_COUNT) as usize * ENTRY_SIZE,
            _ => 0,
        };
        held.min(self.stride - SLOT_HEADER_SIZE)
    }

    /// Checks flushed slot `i` (`slot`: its header and the [`held`](Self::held)
    /// bytes after it) and keeps it; slots come in increasing order.
    pub(crate) fn push(&mut self, i: u32, slot: &[u8]) -> Result<(), DecodeError> {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(slot);
        // A count past the slot's room was cut above: its check refuses it
        // before reading past what was kept.
        self.index.add_slot(i, &self.bytes[at..], None)?;
        self.index.offsets.push(at);
        Ok(())
    }

    /// The error for empty slot `i` (its magic zero) with a non-zero byte at
    /// `offset` in it.
    pub(crate) fn not_empty(i: u32, offset: usize) -> DecodeError {
        DecodeError::UnflushedSlotNotEmpty {
            slot: i,
            offset: offset / 16 * 16,
        }
    }

    /// The buffer, as [`OwnedBuffer::decode`] makes it of the same bytes but
    /// for the bytes it keeps.
    pub(crate) fn finish(mut self) -> OwnedBuffer {
        self.index.size = self.bytes.len();
        self.bytes.shrink_to_fit();
        self.index.flushed.shrink_to_fit();
        self.index.offsets.shrink_to_fit();
        OwnedBuffer {
            bytes: self.bytes,
            index: self.index,
        }
    }
}
