//! Packed buffers (docs/format.md, "Packed buffers"): what the host makes of a
//! streamed launch's part. The device never writes one: the host has already
//! rebuilt the events from the rings, so each slot holds full events (no time
//! unwrapping, ranges of any length) and only the warps that have some.

#[cfg(any(feature = "cuda", test))]
pub(crate) use writer::PackedWriter;

/// [`super::BufferHeader::flags`] bit: the buffer is packed.
pub const BUFFER_FLAG_PACKED: u32 = 1;
/// Size of one record of a packed slot: an event with full device times.
pub const PACKED_RECORD_SIZE: usize = 24;

/// Byte offsets in a packed record.
pub mod packed_offsets {
    /// `u64` start, device ns (the end for an instant).
    pub const START_NS: usize = 0;
    /// `u64` end, device ns.
    pub const END_NS: usize = 8;
    /// `u16` event type id.
    pub const EVENT_ID: usize = 16;
    /// `u16` [`crate::format::KIND_RANGE`] or [`crate::format::KIND_INSTANT`].
    pub const KIND: usize = 18;
    /// `u32` payload.
    pub const PAYLOAD: usize = 20;
}

/// The writer: the collector's, and the tests'.
#[cfg(any(feature = "cuda", test))]
mod writer {
    use super::{packed_offsets, BUFFER_FLAG_PACKED, PACKED_RECORD_SIZE};
    use crate::format::{
        put_u16, put_u32, put_u64, BufferHeader, Event, EventKind, SlotHeader, BUFFER_HEADER_SIZE,
        KIND_INSTANT, KIND_RANGE, SLOT_HEADER_SIZE, SLOT_MAGIC,
    };

    /// Writes a packed buffer: the header, then each slot that has events, in
    /// increasing slot order. It grows one `Vec`, and allocates nothing per event.
    #[derive(Debug)]
    pub(crate) struct PackedWriter {
        bytes: Vec<u8>,
        header: BufferHeader,
        slots: u32,
        largest: u32,
    }

    impl PackedWriter {
        /// A packed buffer for the launch `header` describes (its grid, block and
        /// launch id; its capacity, count and flags are set here).
        pub(crate) fn new(header: &BufferHeader) -> PackedWriter {
            PackedWriter {
                bytes: vec![0; BUFFER_HEADER_SIZE],
                header: *header,
                slots: 0,
                largest: 0,
            }
        }

        /// Appends one warp's slot. `h` gives its place and times; its magic and
        /// record count are set here. The caller keeps slots in increasing order
        /// and events as the decoder checks them (ends in order, inside the slot's
        /// times).
        pub(crate) fn slot(&mut self, h: &SlotHeader, events: &[Event]) {
            let mut h = *h;
            h.magic = SLOT_MAGIC;
            h.record_count = events.len() as u32;
            let at = self.bytes.len();
            self.bytes
                .resize(at + SLOT_HEADER_SIZE + events.len() * PACKED_RECORD_SIZE, 0);
            h.write_to(&mut self.bytes[at..]);
            let mut r = at + SLOT_HEADER_SIZE;
            for e in events {
                let b = &mut self.bytes[r..r + PACKED_RECORD_SIZE];
                use packed_offsets as o;
                put_u64(b, o::START_NS, e.start_ns);
                put_u64(b, o::END_NS, e.end_ns);
                put_u16(b, o::EVENT_ID, e.id);
                let kind = match e.kind {
                    EventKind::Range => KIND_RANGE,
                    EventKind::Instant => KIND_INSTANT,
                };
                put_u16(b, o::KIND, kind);
                put_u32(b, o::PAYLOAD, e.payload);
                r += PACKED_RECORD_SIZE;
            }
            self.slots += 1;
            self.largest = self.largest.max(h.record_count);
        }

        /// Slots written so far.
        pub(crate) fn slot_count(&self) -> u32 {
            self.slots
        }

        /// The buffer's bytes.
        pub(crate) fn finish(mut self) -> Vec<u8> {
            self.header.flags = BUFFER_FLAG_PACKED;
            self.header.slot_count = self.slots;
            self.header.slot_capacity = self.largest;
            self.header.write_to(&mut self.bytes);
            put_u16(
                &mut self.bytes,
                crate::format::buffer_offsets::RECORD_SIZE,
                PACKED_RECORD_SIZE as u16,
            );
            self.bytes
        }
    }
}
