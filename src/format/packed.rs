//! Packed buffers (docs/format.md, "Packed buffers"): what the host makes of a
//! streamed launch's part. The device never writes one: the host has already
//! rebuilt the events from the rings, so each slot holds full events (no time
//! unwrapping, ranges of any length) and only the warps that have some.

#[cfg(any(feature = "cuda", test))]
pub(crate) use writer::PackedWriter;

/// What a packed buffer's slots hold: what the decoder learns by walking them,
/// and what the writer knows of the slots it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PackedIndex {
    /// Slot indices, increasing.
    pub flushed: Vec<u32>,
    /// Each slot's byte offset in the buffer.
    pub offsets: Vec<usize>,
    pub events: u64,
    pub events_lost: u64,
    /// Smallest `first_ts` and largest `last_ts` of the slots.
    pub time_range: Option<(u64, u64)>,
    /// Bytes the buffer occupies.
    pub size: usize,
}

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
    use super::{packed_offsets, PackedIndex, BUFFER_FLAG_PACKED, PACKED_RECORD_SIZE};
    use crate::format::{
        put_u16, put_u32, put_u64, BufferHeader, Event, EventKind, SlotHeader, KIND_INSTANT,
        KIND_RANGE, SLOT_HEADER_SIZE, SLOT_MAGIC,
    };

    /// Writes a packed buffer: the header, then each slot that has events, in
    /// increasing slot order. It grows one `Vec`, and allocates nothing per event.
    #[derive(Debug)]
    pub(crate) struct PackedWriter {
        bytes: Vec<u8>,
        header: BufferHeader,
        largest: u32,
        /// The slots written, as the decoder would index them.
        index: PackedIndex,
    }

    impl PackedWriter {
        /// A packed buffer for the launch `header` describes (its grid, block and
        /// launch id; its capacity, count and flags are set here).
        pub(crate) fn new(header: &BufferHeader) -> PackedWriter {
            PackedWriter {
                bytes: vec![0; header.size()],
                header: *header,
                largest: 0,
                index: PackedIndex {
                    flushed: Vec::new(),
                    offsets: Vec::new(),
                    events: 0,
                    events_lost: 0,
                    time_range: None,
                    size: header.size(),
                },
            }
        }

        /// Makes room for `slots` more slots holding `events` events in all: a
        /// part's buffer is megabytes, which growing by doubling would copy again
        /// and again.
        #[cfg(feature = "cuda")]
        pub(crate) fn reserve(&mut self, slots: usize, events: usize) {
            self.bytes
                .reserve(slots * SLOT_HEADER_SIZE + events * PACKED_RECORD_SIZE);
            self.index.flushed.reserve(slots);
            self.index.offsets.reserve(slots);
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
            self.bytes.resize(at + SLOT_HEADER_SIZE, 0);
            h.write_to(&mut self.bytes[at..]);
            // Each record built whole and appended: no zeroing of the bytes
            // first, and one bounds check per record.
            self.bytes.reserve(events.len() * PACKED_RECORD_SIZE);
            for e in events {
                let mut b = [0u8; PACKED_RECORD_SIZE];
                use packed_offsets as o;
                put_u64(&mut b, o::START_NS, e.start_ns);
                put_u64(&mut b, o::END_NS, e.end_ns);
                put_u16(&mut b, o::EVENT_ID, e.id);
                let kind = match e.kind {
                    EventKind::Range => KIND_RANGE,
                    EventKind::Instant => KIND_INSTANT,
                };
                put_u16(&mut b, o::KIND, kind);
                put_u32(&mut b, o::PAYLOAD, e.payload);
                self.bytes.extend_from_slice(&b);
            }
            self.largest = self.largest.max(h.record_count);
            // The index the decoder finds for this header.
            let wpb = self.header.warps_per_block as u64;
            let index = (h.block_linear as u64 * wpb + h.warp as u64).min(u32::MAX as u64) as u32;
            let x = &mut self.index;
            x.flushed.push(index);
            x.offsets.push(at);
            x.events += events.len() as u64;
            x.events_lost += h.events_lost as u64;
            x.time_range = Some(match x.time_range {
                Some((lo, hi)) => (lo.min(h.first_ts), hi.max(h.last_ts)),
                None => (h.first_ts, h.last_ts),
            });
        }

        /// Slots written so far.
        pub(crate) fn slot_count(&self) -> u32 {
            self.index.flushed.len() as u32
        }

        /// The buffer's bytes.
        pub(crate) fn finish(self) -> Vec<u8> {
            self.finish_indexed().0
        }

        /// The buffer's bytes, its header, and what its slots hold, as the
        /// decoder would find them in a buffer whose slots were written as
        /// [`slot`](Self::slot) asks.
        pub(crate) fn finish_indexed(mut self) -> (Vec<u8>, BufferHeader, PackedIndex) {
            self.header.flags = BUFFER_FLAG_PACKED;
            self.header.slot_count = self.slot_count();
            self.header.slot_capacity = self.largest;
            self.header.write_to(&mut self.bytes);
            put_u16(
                &mut self.bytes,
                crate::format::buffer_offsets::RECORD_SIZE,
                PACKED_RECORD_SIZE as u16,
            );
            self.index.size = self.bytes.len();
            (self.bytes, self.header, self.index)
        }
    }
}
