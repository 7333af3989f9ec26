//! Bytes → [`Buffer`]: the strict reader of the wire format (`docs/format.md`),
//! slots of v1 records and of v2 entries alike (each slot's magic says which).
//!
//! [`Buffer::decode`] validates everything the format promises in one pass over
//! the buffer and allocates only the list of flushed slots (and the headers it
//! rebuilt for v2 slots); afterwards nothing is checked again, and
//! [`Slot::events`] rebuilds full 64-bit times (and, for v2, the ranges from their
//! boundaries) on the fly with no allocation. Every way the bytes can be wrong is a [`DecodeError`] variant
//! that names the slot and record, so the message pinpoints the fault.
//!
//! Slots whose header is still zero were never flushed (their warp did not run the
//! recorder, or a slot past the grid): such a slot must be zero throughout and is
//! simply absent from [`Buffer::slots`]. A zero header over non-zero record
//! bytes means a warp wrote records but never flushed, and is an error
//! ([`DecodeError::UnflushedSlotNotEmpty`]): its records cannot be placed in time.
//!
//! [`OwnedBuffer`] owns its bytes and crosses threads; [`BufferBuilder`](crate::format::BufferBuilder) writes
//! valid buffers on the host, for tests and for producers that are not the CUDA
//! header.

use std::borrow::Cow;
use std::fmt;

use crate::format::{
    self, slot_offsets as so, BufferHeader, Event, EventKind, Record, SlotHeader,
    BUFFER_FLAG_PACKED, KIND_INSTANT, KIND_RANGE, PACKED_RECORD_SIZE, RECORD_SIZE,
    SLOT_HEADER_SIZE, SLOT_MAGIC, SLOT_MAGIC_V2,
};
use crate::registry::EventRegistry;

mod bytes;
#[cfg(any(feature = "cuda", test))]
pub(crate) mod chunk;
mod error;
mod header;
mod packed;
pub(crate) mod sparse;
mod v1;
mod v2;
use bytes::u32_at;
pub use error::DecodeError;
use header::read_buffer_header;
use v1::{check_v1_slot, read_slot_header};

/// What [`Buffer::decode`] learned, kept so that [`OwnedBuffer::view`] need not
/// validate again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Index {
    header: BufferHeader,
    /// Bytes the buffer occupies (`header + slot_count × stride`; of a packed buffer,
    /// its slots' sizes; of a sparse one, its header and its flushed slots cut
    /// after what they hold).
    size: usize,
    /// Bytes the buffer occupies in the wire format: `size` but for a sparse
    /// buffer, whose empty slots and unused slot bytes come back as zeros.
    wire_size: usize,
    /// Indices of the flushed slots, increasing.
    flushed: Vec<u32>,
    /// The v2 slots among them, with the headers their checks rebuilt, increasing.
    rebuilt: Vec<(u32, SlotHeader)>,
    /// A packed or sparse buffer's slots' offsets, one per flushed slot; empty
    /// otherwise (each slot is then at its index's stride).
    offsets: Vec<usize>,
    events: u64,
    events_lost: u64,
    /// Smallest `first_ts` and largest `last_ts` of the flushed slots.
    time_range: Option<(u64, u64)>,
}

impl Index {
    /// The index of an unpacked buffer of `size` bytes before its slots are added.
    fn empty(header: BufferHeader, size: usize) -> Index {
        Index {
            header,
            size,
            wire_size: size,
            flushed: Vec::new(),
            rebuilt: Vec::new(),
            offsets: Vec::new(),
            events: 0,
            events_lost: 0,
            time_range: None,
        }
    }

    /// Checks flushed slot `i` of an unpacked buffer and adds it: `slot` is its
    /// bytes from its header on, at least as many as its header says it holds
    /// (a whole stride, or cut after them: [`sparse`]).
    fn add_slot(
        &mut self,
        i: u32,
        slot: &[u8],
        registry: Option<&EventRegistry>,
    ) -> Result<(), DecodeError> {
        let header = &self.header;
        let capacity = header.slot_capacity;
        let wpb = header.warps_per_block;
        let [gx, gy, gz] = header.grid;
        // The slots the grid has: one per warp, or per sampled warp. Up to 2¹²⁸
        // blocks in principle; slot indices are u32, so saturate.
        let blocks = u64::try_from(gx as u128 * gy as u128 * gz as u128).unwrap_or(u64::MAX);
        let warps = header.sampling.slots(blocks, wpb);
        let magic = u32_at(slot, so::MAGIC);
        if magic != SLOT_MAGIC && magic != SLOT_MAGIC_V2 {
            return Err(DecodeError::BadSlotMagic {
                slot: i,
                found: magic,
            });
        }
        if i as u64 >= warps {
            return Err(DecodeError::SlotOutsideGrid { slot: i, warps });
        }
        // Inside the grid (above), so placed; gx, gy ≥ 1: read_buffer_header refused
        // empty launches.
        let (bl, warp) = header.place(i).unwrap_or_default();
        let xyz = [bl % gx, bl / gx % gy, bl / gx / gy];
        let h = if magic == SLOT_MAGIC_V2 {
            let at = v2::Place {
                index: i,
                capacity,
                block_linear: bl,
                block: xyz,
                warp,
            };
            let h = match registry {
                Some(reg) => v2::check(slot, &at, |id| reg.contains(id))?,
                None => v2::check(slot, &at, |_| true)?,
            };
            self.rebuilt.push((i, h));
            h
        } else {
            let h = read_slot_header(slot);
            check_v1_slot(i, &h, capacity, [bl, xyz[0], xyz[1], xyz[2], warp])?;
            let records = &slot[SLOT_HEADER_SIZE..SLOT_HEADER_SIZE + h.record_count as usize * 16];
            match registry {
                Some(reg) => check_records(i, &h, records, |id| reg.contains(id))?,
                None => check_records(i, &h, records, |_| true)?,
            }
            h
        };
        self.events += h.record_count as u64;
        self.events_lost += h.events_lost as u64;
        self.time_range = Some(match self.time_range {
            Some((lo, hi)) => (lo.min(h.first_ts), hi.max(h.last_ts)),
            None => (h.first_ts, h.last_ts),
        });
        self.flushed.push(i);
        Ok(())
    }
}

/// A validated trace buffer, borrowed: zero-copy over the bytes it was decoded from.
#[derive(Clone)]
pub struct Buffer<'a> {
    bytes: &'a [u8],
    index: Cow<'a, Index>,
}

impl fmt::Debug for Buffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("header", &self.index.header)
            .field("flushed_slots", &self.index.flushed.len())
            .field("events", &self.index.events)
            .field("events_lost", &self.index.events_lost)
            .finish()
    }
}

fn record_array(c: &[u8]) -> [u8; RECORD_SIZE] {
    let mut a = [0u8; RECORD_SIZE];
    a.copy_from_slice(c);
    a
}

/// Offset of the first non-zero 16-byte group of `b` (a multiple of 16 long).
fn first_nonzero(b: &[u8]) -> Option<usize> {
    b.chunks_exact(16)
        .position(|c| u128::from_ne_bytes(record_array(c)) != 0)
        .map(|i| i * 16)
}

impl<'a> Buffer<'a> {
    /// Decodes and validates a whole buffer (see `docs/format.md`, "What a strict
    /// reader rejects"). With a registry, every record's event id must be in it.
    /// Bytes past the buffer's size (`64 + slot_count × stride`) are not read.
    pub fn decode(
        bytes: &'a [u8],
        registry: Option<&EventRegistry>,
    ) -> Result<Buffer<'a>, DecodeError> {
        let (header, size) = read_buffer_header(bytes, bytes.len())?;
        if header.flags == BUFFER_FLAG_PACKED {
            let w = match registry {
                Some(reg) => packed::walk(bytes, &header, |id| reg.contains(id))?,
                None => packed::walk(bytes, &header, |_| true)?,
            };
            return Ok(Buffer {
                bytes: &bytes[..w.size],
                index: Cow::Owned(Index {
                    header,
                    size: w.size,
                    wire_size: w.size,
                    flushed: w.flushed,
                    rebuilt: Vec::new(),
                    offsets: w.offsets,
                    events: w.events,
                    events_lost: w.events_lost,
                    time_range: w.time_range,
                }),
            });
        }
        let stride = format::slot_stride(header.slot_capacity);
        let mut index = Index::empty(header, size);
        let body = &bytes[header.size()..size];
        for (i, slot) in body.chunks_exact(stride).enumerate() {
            let i = i as u32;
            if u32_at(slot, so::MAGIC) == 0 {
                if let Some(offset) = first_nonzero(slot) {
                    return Err(DecodeError::UnflushedSlotNotEmpty { slot: i, offset });
                }
                continue;
            }
            index.add_slot(i, slot, registry)?;
        }
        Ok(Buffer {
            bytes: &bytes[..size],
            index: Cow::Owned(index),
        })
    }

    /// The buffer header.
    pub fn header(&self) -> &BufferHeader {
        &self.index.header
    }

    /// The bytes of the buffer (exactly its size, without any trailing bytes).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The flushed slots, in increasing index order.
    pub fn slots(&self) -> impl ExactSizeIterator<Item = Slot<'a>> + '_ {
        let (bytes, index) = (self.bytes, &*self.index);
        (0..index.flushed.len()).map(move |k| slot_at(bytes, index, k))
    }

    /// The slot at `index`, if it was flushed.
    pub fn slot(&self, index: u32) -> Option<Slot<'a>> {
        let k = self.index.flushed.binary_search(&index).ok()?;
        Some(slot_at(self.bytes, &self.index, k))
    }

    /// Number of flushed slots.
    pub fn flushed_slot_count(&self) -> usize {
        self.index.flushed.len()
    }

    /// Records in all slots (events that were written).
    pub fn event_count(&self) -> u64 {
        self.index.events
    }

    /// Events lost in all slots: events the warps made that are not here
    /// (a full slot or ring dropped them; [`Slot::events_lost`]).
    pub fn events_lost(&self) -> u64 {
        self.index.events_lost
    }

    /// The device time the flushed slots cover: the smallest `first_ts` and the
    /// largest `last_ts` (every event lies inside); `None` if no slot was flushed.
    /// The clock mapping needs calibration around this interval.
    pub fn time_range(&self) -> Option<(u64, u64)> {
        self.index.time_range
    }

    /// Copies the buffer into an [`OwnedBuffer`] (no re-validation).
    pub fn to_owned_capture(&self) -> OwnedBuffer {
        OwnedBuffer {
            bytes: self.bytes.to_vec(),
            index: self.index.clone().into_owned(),
        }
    }
}

/// The `k`-th flushed slot of a validated buffer: a v1 (or packed) slot's header as
/// stored, a v2 slot's as its check rebuilt it.
fn slot_at<'a>(bytes: &'a [u8], at: &Index, k: usize) -> Slot<'a> {
    let index = at.flushed[k];
    // A packed buffer's slots, and a sparse one's, are where its offsets say.
    let stride = format::slot_stride(at.header.slot_capacity);
    let off = match at.offsets.get(k) {
        Some(&off) => off,
        None => at.header.size() + index as usize * stride,
    };
    if at.header.flags == BUFFER_FLAG_PACKED {
        let header = read_slot_header(&bytes[off..]);
        let start = off + SLOT_HEADER_SIZE;
        return Slot {
            header,
            index,
            form: Form::Packed,
            records: &bytes[start..start + header.record_count as usize * PACKED_RECORD_SIZE],
        };
    }
    let start = off + SLOT_HEADER_SIZE;
    let v2 = at
        .rebuilt
        .binary_search_by_key(&index, |&(i, _)| i)
        .ok()
        .map(|k| at.rebuilt[k].1);
    let (header, len) = match v2 {
        Some(h) => (
            h,
            u32_at(bytes, off + format::slot_v2_offsets::ENTRY_COUNT) as usize * format::ENTRY_SIZE,
        ),
        None => {
            let h = read_slot_header(&bytes[off..]);
            (h, h.record_count as usize * RECORD_SIZE)
        }
    };
    Slot {
        header,
        index,
        form: if v2.is_some() { Form::V2 } else { Form::V1 },
        records: &bytes[start..start + len],
    }
}

#[cold]
#[inline(never)]
fn time_error(slot: u32, record: u32, h: &SlotHeader, prev: u64, delta: u64) -> DecodeError {
    // The unwrap rule reads every end as at or after `prev`, so a record that
    // really went back by a little looks like a jump forward by almost 2³² ns.
    // When the low bits moved back by less than half the circle, that is the
    // likelier reading, and the message says so.
    let back = (1u64 << 32) - delta;
    if delta > 1 << 31 {
        DecodeError::TimeBackwards {
            slot,
            record,
            by_ns: back,
        }
    } else {
        DecodeError::EndAfterLast {
            slot,
            record,
            end: prev as u128 + delta as u128,
            last_ts: h.last_ts,
        }
    }
}

#[cold]
#[inline(never)]
fn record_error(slot: u32, record: u32, r: &Record, known: bool) -> DecodeError {
    if r.kind > KIND_INSTANT {
        DecodeError::UnknownKind {
            slot,
            record,
            kind: r.kind,
        }
    } else if !known {
        DecodeError::UnknownEventId {
            slot,
            record,
            id: r.event_id,
        }
    } else {
        DecodeError::InstantWithDuration {
            slot,
            record,
            duration: r.duration,
        }
    }
}

/// The hot loop: one pass over a slot's records, checking kind, id and time.
#[inline(always)]
fn check_records(
    slot: u32,
    h: &SlotHeader,
    records: &[u8],
    known: impl Fn(u16) -> bool,
) -> Result<(), DecodeError> {
    let mut prev = h.first_ts;
    for (n, c) in records.chunks_exact(RECORD_SIZE).enumerate() {
        let r = Record::read(&record_array(c));
        let kind_ok = r.kind == KIND_RANGE || (r.kind == KIND_INSTANT && r.duration == 0);
        let id_ok = known(r.event_id);
        if !(kind_ok && id_ok) {
            return Err(record_error(slot, n as u32, &r, id_ok));
        }
        let delta = r.end_lo.wrapping_sub(prev as u32) as u64;
        let end = prev.wrapping_add(delta);
        if end < prev || end > h.last_ts {
            return Err(time_error(slot, n as u32, h, prev, delta));
        }
        if r.duration as u64 > end - h.first_ts {
            return Err(DecodeError::StartBeforeFirst {
                slot,
                record: n as u32,
                end,
                duration: r.duration,
                first_ts: h.first_ts,
            });
        }
        prev = end;
    }
    Ok(())
}

/// One flushed slot: one (block, warp)'s header and records.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a> {
    /// The slot header as the device wrote it at flush.
    pub header: SlotHeader,
    /// The slot's index (`block_linear × warps_per_block + warp`).
    pub index: u32,
    /// What its bytes hold.
    form: Form,
    /// The records or entries written.
    records: &'a [u8],
}

impl<'a> Slot<'a> {
    /// The events, in the order they ended, with full 64-bit device times.
    pub fn events(&self) -> Events<'a> {
        Events(match self.form {
            Form::V2 => Walk::V2(v2::Events::new(self.records, &self.header)),
            Form::V1 => Walk::V1 {
                records: self.records.chunks_exact(RECORD_SIZE),
                prev: self.header.first_ts,
            },
            Form::Packed => Walk::Packed(self.records.chunks_exact(PACKED_RECORD_SIZE)),
        })
    }

    /// The raw records of a v1 slot, as stored (none for a v2 slot, whose events
    /// are rebuilt from entries, nor for a packed one: see [`Slot::events`]).
    pub fn records(&self) -> impl ExactSizeIterator<Item = Record> + 'a {
        let records: &[u8] = if self.form == Form::V1 {
            self.records
        } else {
            &[]
        };
        records
            .chunks_exact(RECORD_SIZE)
            .map(|c| Record::read(&record_array(c)))
    }

    /// Which record format the slot holds: 1 or 2.
    pub fn format(&self) -> u8 {
        match self.form {
            Form::V1 => 1,
            Form::V2 => 2,
            Form::Packed => 0,
        }
    }

    /// Events written (v1: records; v2: the events its entries rebuild into).
    pub fn event_count(&self) -> u32 {
        self.header.record_count
    }

    /// Events the warp made that are not in the slot: a range or an instant
    /// whose record (v1) or closing entry (v2) did not fit, and, in a
    /// streamed launch's part, a range whose begin was lost with entries the
    /// warp dropped. Events delivered plus events lost are the events the warp
    /// made (ranges still open at its flush are not events).
    pub fn events_lost(&self) -> u32 {
        self.header.events_lost
    }

    /// Whether the warp ran on more than one SM.
    pub fn migrated(&self) -> bool {
        self.header.flags & format::SLOT_FLAG_MIGRATED != 0
    }

    /// Whether a range was still open at flush (and so not recorded).
    pub fn open_at_flush(&self) -> bool {
        self.header.flags & format::SLOT_FLAG_OPEN_AT_FLUSH != 0
    }
}

/// Iterator over a slot's events ([`Slot::events`]): applies the unwrap rule of
/// `docs/format.md` to each record, or rebuilds a v2 slot's ranges from its entries.
#[derive(Debug, Clone)]
pub struct Events<'a>(Walk<'a>);

// The v2 walk holds its stack of open ranges inline (about 400 bytes): an iterator made
// once per slot, on the stack; boxing it would allocate for every slot read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Walk<'a> {
    V1 {
        records: std::slice::ChunksExact<'a, u8>,
        prev: u64,
    },
    V2(v2::Events<'a>),
    Packed(std::slice::ChunksExact<'a, u8>),
}

/// What a slot's bytes hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// v1 records.
    V1,
    /// v2 entries.
    V2,
    /// Full events, in a packed buffer.
    Packed,
}

impl Iterator for Events<'_> {
    type Item = Event;

    #[inline]
    fn next(&mut self) -> Option<Event> {
        let (records, prev) = match &mut self.0 {
            Walk::V1 { records, prev } => (records, prev),
            Walk::V2(entries) => return entries.next(),
            Walk::Packed(records) => return records.next().map(packed::read),
        };
        let r = Record::read(&record_array(records.next()?));
        // Validated at decode: no overflow, start ≥ first_ts. Wrapping ops keep
        // this branch-free.
        let end = prev.wrapping_add(r.end_lo.wrapping_sub(*prev as u32) as u64);
        *prev = end;
        Some(Event {
            id: r.event_id,
            kind: if r.kind == KIND_RANGE {
                EventKind::Range
            } else {
                EventKind::Instant
            },
            start_ns: end.wrapping_sub(r.duration as u64),
            end_ns: end,
            payload: r.payload,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            Walk::V1 { records, .. } => records.size_hint(),
            Walk::V2(entries) => entries.size_hint(),
            Walk::Packed(records) => records.size_hint(),
        }
    }
}

impl ExactSizeIterator for Events<'_> {}

/// A validated capture that owns its bytes: `Send + Sync`, what crosses threads
/// (inside [`crate::batch::Batch`]).
///
/// Two buffers are equal when they hold the same header and the same flushed
/// slots, whatever bytes they keep of them: one read from a capture file keeps
/// only its flushed slots ([`OwnedBuffer::bytes`]).
#[derive(Clone)]
pub struct OwnedBuffer {
    bytes: Vec<u8>,
    index: Index,
}

impl PartialEq for OwnedBuffer {
    fn eq(&self, other: &OwnedBuffer) -> bool {
        let (a, b) = (self.view(), other.view());
        let same_slot = |(x, y): (Slot<'_>, Slot<'_>)| {
            x.index == y.index && x.header == y.header && x.form == y.form && x.records == y.records
        };
        a.index.header == b.index.header
            && a.index.wire_size == b.index.wire_size
            && a.slots().len() == b.slots().len()
            && a.slots().zip(b.slots()).all(same_slot)
    }
}

impl Eq for OwnedBuffer {}

impl fmt::Debug for OwnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.view().fmt(f)
    }
}

impl OwnedBuffer {
    /// Decodes and validates `bytes` as [`Buffer::decode`] does, keeping them.
    /// Trailing bytes past the buffer's size are cut off.
    pub fn decode(
        mut bytes: Vec<u8>,
        registry: Option<&EventRegistry>,
    ) -> Result<OwnedBuffer, DecodeError> {
        let index = Buffer::decode(&bytes, registry)?.index.into_owned();
        bytes.truncate(index.size);
        Ok(OwnedBuffer { bytes, index })
    }

    /// The packed buffer a drain thread wrote (`PackedWriter::finish_indexed`:
    /// its bytes, header and index), taken without reading it again: the
    /// drain's events pass [`decode`](Self::decode)'s checks by construction.
    /// [`chunk::WarpChunks::take`] checks every id against `registry` and
    /// gives each warp's events in the order they end, never before the time
    /// before them, so that a range starts before it ends and an instant has no
    /// duration; the drain writes the slots in increasing order, each in its
    /// place, its times the smallest start and the largest end (or later). A
    /// buffer from anywhere else goes through [`decode`](Self::decode). Debug
    /// builds (the tests) decode it all the same and compare.
    #[cfg(feature = "cuda")]
    pub(crate) fn from_drain(
        bytes: Vec<u8>,
        header: BufferHeader,
        packed: format::PackedIndex,
        registry: &EventRegistry,
    ) -> OwnedBuffer {
        let b = OwnedBuffer {
            index: Index {
                header,
                size: packed.size,
                wire_size: packed.size,
                flushed: packed.flushed,
                rebuilt: Vec::new(),
                offsets: packed.offsets,
                events: packed.events,
                events_lost: packed.events_lost,
                time_range: packed.time_range,
            },
            bytes,
        };
        if cfg!(debug_assertions) {
            assert_eq!(
                OwnedBuffer::decode(b.bytes.clone(), Some(registry)).as_ref(),
                Ok(&b),
                "a drained part that the decoder refuses or reads otherwise"
            );
        }
        b
    }

    /// A borrowed view; nothing is validated again.
    pub fn view(&self) -> Buffer<'_> {
        Buffer {
            bytes: &self.bytes,
            index: Cow::Borrowed(&self.index),
        }
    }

    /// The buffer header.
    pub fn header(&self) -> &BufferHeader {
        &self.index.header
    }

    /// The bytes kept: the buffer as decoded, or, for one read from a capture
    /// file (`docs/capture.md`), its header and its flushed slots only, each cut
    /// after what it holds ([`OwnedBuffer::wire`] gives the wire format back).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The buffer in the wire format (`docs/format.md`): its bytes, or, when
    /// they were kept without its empty slots, with those put back as zeros.
    pub fn wire(&self) -> Cow<'_, [u8]> {
        let index = &self.index;
        if index.wire_size == index.size {
            return Cow::Borrowed(&self.bytes);
        }
        let stride = format::slot_stride(index.header.slot_capacity);
        let mut wire = vec![0; index.wire_size];
        let head = index.header.size();
        wire[..head].copy_from_slice(&self.bytes[..head]);
        let ends = index.offsets.iter().skip(1).copied().chain([index.size]);
        for ((&slot, &from), to) in index.flushed.iter().zip(&index.offsets).zip(ends) {
            let at = head + slot as usize * stride;
            wire[at..at + (to - from)].copy_from_slice(&self.bytes[from..to]);
        }
        Cow::Owned(wire)
    }

    /// Gives the bytes back.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Records in all slots.
    pub fn event_count(&self) -> u64 {
        self.index.events
    }

    /// Events lost in all slots ([`Buffer::events_lost`]).
    pub fn events_lost(&self) -> u64 {
        self.index.events_lost
    }

    /// See [`Buffer::time_range`].
    pub fn time_range(&self) -> Option<(u64, u64)> {
        self.index.time_range
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BufferBuilder;
    use crate::format::{buffer_offsets, record_offsets, slot_offsets};
    use std::collections::BTreeMap;

    fn put(b: &mut [u8], at: usize, v: &[u8]) {
        b[at..at + v.len()].copy_from_slice(v);
    }

    /// Written byte by byte from the tables of docs/format.md, with literal
    /// offsets and not through format.rs, so that the document itself is tested.
    #[test]
    fn decodes_a_buffer_written_by_hand_from_the_doc() {
        // grid 1×1×1, block 64 threads → 2 warps per block, 2 slots of 2 records.
        // size = 64 + 2 · (64 + 2·16) = 256; slot 0 at 64, slot 1 at 160.
        let mut b = vec![0u8; 256];
        put(&mut b, 0, b"TGPU");
        put(&mut b, 4, &1u16.to_le_bytes());
        put(&mut b, 6, &64u16.to_le_bytes());
        put(&mut b, 8, &64u16.to_le_bytes());
        put(&mut b, 10, &16u16.to_le_bytes());
        put(&mut b, 12, &2u32.to_le_bytes()); // slot_capacity
        put(&mut b, 16, &2u32.to_le_bytes()); // slot_count
        put(&mut b, 20, &2u32.to_le_bytes()); // warps_per_block
        put(&mut b, 24, &77u64.to_le_bytes()); // launch_id
        for (k, v) in [1u32, 1, 1, 64, 1, 1].iter().enumerate() {
            put(&mut b, 32 + 4 * k, &v.to_le_bytes()); // grid then block
        }
        // Slot 1 (block 0, warp 1); slot 0 stays zero: never flushed.
        let s = 160;
        put(&mut b, s, b"SLOT");
        put(&mut b, s + 8, &0x1_FFFF_FF00u64.to_le_bytes()); // first_ts, just before a 2³² wrap
        put(&mut b, s + 16, &0x2_0000_0200u64.to_le_bytes()); // last_ts
        put(&mut b, s + 24, &5u32.to_le_bytes()); // sm_first
        put(&mut b, s + 28, &5u32.to_le_bytes()); // sm_last
        put(&mut b, s + 48, &1u32.to_le_bytes()); // warp
        put(&mut b, s + 52, &u32::MAX.to_le_bytes()); // cluster_rank
        put(&mut b, s + 56, &2u32.to_le_bytes()); // record_count
        put(&mut b, s + 60, &3u32.to_le_bytes()); // events_lost
        let r = s + 64;
        put(&mut b, r, &0xFFFF_FF80u32.to_le_bytes()); // end_lo
        put(&mut b, r + 4, &0x40u32.to_le_bytes()); // duration
        put(&mut b, r + 8, &3u16.to_le_bytes()); // event_id
        put(&mut b, r + 10, &0u16.to_le_bytes()); // kind: range
        put(&mut b, r + 12, &9u32.to_le_bytes()); // payload
        let r = s + 80;
        put(&mut b, r, &0x100u32.to_le_bytes()); // end_lo, after the wrap
        put(&mut b, r + 8, &4u16.to_le_bytes());
        put(&mut b, r + 10, &1u16.to_le_bytes()); // kind: instant
        put(&mut b, r + 12, &0xABCDu32.to_le_bytes());

        let reg = EventRegistry::from_pairs([(3, "load"), (4, "mark")]).unwrap();
        let cap = Buffer::decode(&b, Some(&reg)).unwrap();
        assert_eq!(cap.header().launch_id, 77);
        assert_eq!(cap.header().grid, [1, 1, 1]);
        assert_eq!((cap.event_count(), cap.events_lost()), (2, 3));
        assert_eq!(cap.flushed_slot_count(), 1);
        assert!(cap.slot(0).is_none());
        let slot = cap.slot(1).unwrap();
        assert_eq!(
            (slot.index, slot.header.warp, slot.header.sm_first),
            (1, 1, 5)
        );
        assert_eq!(slot.header.cluster_rank, format::NO_CLUSTER);
        let events: Vec<Event> = slot.events().collect();
        assert_eq!(
            events,
            [
                Event {
                    id: 3,
                    kind: EventKind::Range,
                    start_ns: 0x1_FFFF_FF40,
                    end_ns: 0x1_FFFF_FF80,
                    payload: 9
                },
                Event {
                    id: 4,
                    kind: EventKind::Instant,
                    start_ns: 0x2_0000_0100,
                    end_ns: 0x2_0000_0100,
                    payload: 0xABCD
                },
            ]
        );
        // The same bytes through the builder.
        let mut builder = BufferBuilder::new([1, 1, 1], [64, 1, 1], 2);
        builder.launch_id(77);
        let w = builder.warp(0, 1).unwrap();
        w.sm(5, 5).first_ts(0x1_FFFF_FF00).last_ts(0x2_0000_0200);
        for e in &events {
            w.push(*e);
        }
        for _ in 0..3 {
            w.instant(4, 0x2_0000_0200, 0); // dropped: the slot is full
        }
        assert_eq!(builder.finish(), b);
        // Unknown id with a registry; fine without.
        let small = EventRegistry::from_pairs([(3, "load")]).unwrap();
        assert_eq!(
            Buffer::decode(&b, Some(&small)).unwrap_err(),
            DecodeError::UnknownEventId {
                slot: 1,
                record: 1,
                id: 4
            }
        );
    }

    /// A valid buffer: grid 2×1×1, 96 threads (3 warps), capacity 4, slots 1 and 4 flushed.
    fn sample() -> Vec<u8> {
        let mut b = BufferBuilder::new([2, 1, 1], [96, 1, 1], 4);
        b.warp(0, 1)
            .unwrap()
            .first_ts(1000)
            .range(1, 1000, 1100, 0)
            .range(2, 1050, 1200, 1)
            .instant(3, 1200, 2)
            .last_ts(1300);
        b.warp(1, 1).unwrap().range(1, 5000, 6000, 7);
        b.finish()
    }

    const S1: usize = 64 + 128; // slot 1 (stride 64 + 4·16)
    const S4: usize = 64 + 4 * 128; // slot 4

    fn with(f: impl FnOnce(&mut Vec<u8>)) -> DecodeError {
        let mut b = sample();
        f(&mut b);
        Buffer::decode(&b, None).unwrap_err()
    }

    fn set32(b: &mut [u8], at: usize, v: u32) {
        put(b, at, &v.to_le_bytes());
    }

    #[test]
    fn sample_is_valid() {
        let b = sample();
        let cap = Buffer::decode(&b, None).unwrap();
        let idx: Vec<u32> = cap.slots().map(|s| s.index).collect();
        assert_eq!(idx, [1, 4]);
        assert_eq!(cap.event_count(), 4);
        assert_eq!(cap.time_range(), Some((1000, 6000)));
        let s = cap.slot(4).unwrap();
        assert_eq!(s.header.block_linear, 1);
        assert_eq!(s.header.block, [1, 0, 0]);
        // Trailing bytes are not read, and OwnedBuffer drops them.
        let mut longer = b.clone();
        longer.extend_from_slice(&[0xFF; 7]);
        assert_eq!(Buffer::decode(&longer, None).unwrap().bytes(), &b[..]);
        let owned = OwnedBuffer::decode(longer, None).unwrap();
        assert_eq!(owned.bytes(), &b[..]);
        assert_eq!(owned, cap.to_owned_capture());
        let a: Vec<Event> = owned.view().slots().flat_map(|s| s.events()).collect();
        let c: Vec<Event> = cap.slots().flat_map(|s| s.events()).collect();
        assert_eq!(a, c);
    }

    #[test]
    fn every_error_is_typed() {
        use buffer_offsets as bo;
        use record_offsets as ro;
        use slot_offsets as so;
        use DecodeError as E;
        let e = with(|b| b.truncate(63));
        assert_eq!(
            e,
            E::Truncated {
                len: 63,
                needed: 64
            }
        );
        let e = with(|b| b.truncate(b.len() - 1));
        assert!(matches!(e, E::Truncated { needed: 832, .. }), "{e}");
        assert!(matches!(with(|b| b[0] = b'X'), E::BadMagic { .. }));
        assert_eq!(
            with(|b| b[bo::VERSION] = 2),
            E::UnsupportedVersion { found: 2 }
        );
        for (at, name) in [
            (bo::HEADER_SIZE, "header_size"),
            (bo::SLOT_HEADER_SIZE, "slot_header_size"),
            (bo::RECORD_SIZE, "record_size"),
        ] {
            assert!(
                matches!(with(|b| b[at] = 32), E::BadHeaderField { field, found: 32, .. } if field == name)
            );
        }
        // Bit 0 says "packed" (and then the record size is wrong); no other is known.
        assert!(matches!(
            with(|b| b[bo::FLAGS] = 1),
            E::BadHeaderField {
                field: "record_size",
                found: 16,
                expected: 24
            }
        ));
        assert!(matches!(
            with(|b| b[bo::FLAGS] = 4),
            E::BadHeaderField { field: "flags", .. }
        ));
        // Sampled: a 128-byte header.
        assert!(matches!(
            with(|b| b[bo::FLAGS] = 2),
            E::BadHeaderField {
                field: "header_size",
                found: 64,
                expected: 128
            }
        ));
        assert!(matches!(
            with(|b| b[bo::RESERVED] = 1),
            E::BadHeaderField {
                field: "reserved",
                ..
            }
        ));
        assert!(matches!(
            with(|b| set32(b, bo::WARPS_PER_BLOCK, 4)),
            E::BadHeaderField {
                field: "warps_per_block",
                found: 4,
                expected: 3
            }
        ));
        assert!(matches!(
            with(|b| set32(b, bo::GRID + 4, 0)),
            E::EmptyLaunch { .. }
        ));
        assert!(matches!(
            with(|b| set32(b, bo::BLOCK + 8, 0)),
            E::EmptyLaunch { .. }
        ));
        assert!(matches!(
            with(|b| {
                set32(b, bo::SLOT_COUNT, u32::MAX);
                set32(b, bo::SLOT_CAPACITY, u32::MAX)
            }),
            E::SizeOverflow { .. } | E::Truncated { .. }
        ));
        assert_eq!(
            with(|b| b[S1] = b'X'),
            E::BadSlotMagic {
                slot: 1,
                found: u32::from_le_bytes(*b"XLOT")
            }
        );
        assert_eq!(
            with(|b| b[64 + 2 * 128 + 100] = 1),
            E::UnflushedSlotNotEmpty {
                slot: 2,
                offset: 96
            }
        );
        assert_eq!(
            with(|b| set32(b, S1 + so::RECORD_COUNT, 5)),
            E::CountOverCapacity {
                slot: 1,
                count: 5,
                capacity: 4
            }
        );
        assert!(matches!(
            with(|b| set32(b, S1 + so::WARP, 2)),
            E::Misplaced {
                slot: 1,
                expected_warp: 1,
                found_warp: 2,
                ..
            }
        ));
        assert!(matches!(
            with(|b| set32(b, S4 + so::BLOCK_LINEAR, 0)),
            E::Misplaced {
                slot: 4,
                expected_block: 1,
                found_block: 0,
                ..
            }
        ));
        assert!(matches!(
            with(|b| set32(b, S4 + so::BLOCK_XYZ + 4, 1)),
            E::Misplaced {
                slot: 4,
                expected_xyz: [1, 0, 0],
                found_xyz: [1, 1, 0],
                ..
            }
        ));
        // A flushed slot past the grid: 6 warps, so slot 6 of 7.
        let e = with(|b| {
            set32(b, bo::SLOT_COUNT, 7);
            let s6 = b[S4..S4 + 128].to_vec();
            b.extend_from_slice(&s6);
        });
        assert_eq!(e, E::SlotOutsideGrid { slot: 6, warps: 6 });
        assert_eq!(
            with(|b| put(b, S1 + so::LAST_TS, &999u64.to_le_bytes())),
            E::SlotTimesBackwards {
                slot: 1,
                first_ts: 1000,
                last_ts: 999
            }
        );
        let r = S1 + 64 + 16; // slot 1, record 1
        assert_eq!(
            with(|b| b[r + ro::KIND] = 2),
            E::UnknownKind {
                slot: 1,
                record: 1,
                kind: 2
            }
        );
        assert_eq!(
            with(|b| set32(b, r + 16 + ro::DURATION, 5)),
            E::InstantWithDuration {
                slot: 1,
                record: 2,
                duration: 5
            }
        );
        // Record 1 ends at 1200 after 150 ns; 201 ns means it began at 999 < first_ts.
        assert_eq!(
            with(|b| set32(b, r + ro::DURATION, 201)),
            E::StartBeforeFirst {
                slot: 1,
                record: 1,
                end: 1200,
                duration: 201,
                first_ts: 1000
            }
        );
        // Record 1 ends at 1099, before record 0's 1100.
        assert_eq!(
            with(|b| set32(b, r + ro::END_LO, 1099)),
            E::TimeBackwards {
                slot: 1,
                record: 1,
                by_ns: 1
            }
        );
        // Record 0 ends at 999, before first_ts.
        assert_eq!(
            with(|b| set32(b, S1 + 64 + ro::END_LO, 999)),
            E::TimeBackwards {
                slot: 1,
                record: 0,
                by_ns: 1
            }
        );
        assert_eq!(
            with(|b| set32(b, r + ro::END_LO, 1301)),
            E::EndAfterLast {
                slot: 1,
                record: 1,
                end: 1301,
                last_ts: 1300
            }
        );
        // Exactly half the circle back reads as a jump forward past last_ts.
        let e = with(|b| set32(b, r + ro::END_LO, 1100u32.wrapping_sub(1 << 31)));
        assert!(
            matches!(
                e,
                E::EndAfterLast {
                    slot: 1,
                    record: 1,
                    ..
                }
            ),
            "{e}"
        );
        // Messages name the slot and record.
        assert_eq!(
            with(|b| b[r + ro::KIND] = 2).to_string(),
            "slot 1 record 1: unknown kind 2"
        );
    }

    #[test]
    fn end_overflowing_u64_is_an_error_not_a_panic() {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 1);
        b.warp(0, 0)
            .unwrap()
            .first_ts(u64::MAX - 10)
            .last_ts(u64::MAX)
            .instant(0, u64::MAX - 5, 0);
        let mut bytes = b.finish();
        assert!(Buffer::decode(&bytes, None).is_ok());
        // end_lo 3 past first_ts's low bits would wrap u64.
        put(&mut bytes, 64 + 64, &3u32.to_le_bytes());
        assert!(matches!(
            Buffer::decode(&bytes, None),
            Err(DecodeError::EndAfterLast { .. })
        ));
    }

    #[test]
    fn huge_launch_shapes_do_not_overflow() {
        // Found by the fuzz target: block dimensions whose product overflows u64.
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 0).finish();
        for (k, v) in [u32::MAX, u32::MAX, u32::MAX].iter().enumerate() {
            put(&mut b, buffer_offsets::BLOCK + 4 * k, &v.to_le_bytes());
        }
        assert!(matches!(
            Buffer::decode(&b, None),
            Err(DecodeError::BadHeaderField {
                field: "warps_per_block",
                expected: u64::MAX,
                ..
            })
        ));
        let b = BufferBuilder::new([u32::MAX; 3], [u32::MAX; 3], 0);
        assert_eq!(b.header().slot_count, u32::MAX);
    }

    #[test]
    fn drops_and_empty_slots() {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 0);
        b.warp(0, 0).unwrap().instant(1, 10, 0).instant(1, 20, 0);
        let bytes = b.finish();
        let cap = Buffer::decode(&bytes, None).unwrap();
        assert_eq!((cap.event_count(), cap.events_lost()), (0, 2));
        assert_eq!(cap.slots().next().unwrap().header.last_ts, 20);
        // A launch where nothing flushed.
        let bytes = BufferBuilder::new([3, 2, 1], [33, 2, 1], 3).finish();
        let cap = Buffer::decode(&bytes, None).unwrap();
        assert_eq!(cap.header().warps_per_block, 3);
        assert_eq!(cap.header().slot_count, 18);
        assert_eq!(cap.slots().count(), 0);
        assert_eq!(cap.time_range(), None);
    }

    #[test]
    fn builder_refuses_warps_without_slots() {
        let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 1);
        assert!(b.warp(0, 2).is_none());
        assert!(b.warp(2, 0).is_none());
        b.slot_count(3);
        assert!(b.warp(1, 1).is_none());
        assert!(b.warp(1, 0).is_some());
    }

    #[test]
    fn owned_capture_is_send_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<OwnedBuffer>();
        check::<Buffer<'static>>();
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        struct SlotSpec {
            block: u32,
            warp: u32,
            first: u64,
            // (gap to the previous end, duration seed, id, instant?, payload)
            events: Vec<(u64, u64, u16, bool, u32)>,
            tail: u64,
        }

        fn gap() -> impl Strategy<Value = u64> {
            prop_oneof![0u64..100, 0u64..1 << 20, 0u64..(1 << 32) - 1]
        }

        fn launch() -> impl Strategy<Value = ([u32; 3], [u32; 3], u32, Vec<SlotSpec>)> {
            (
                (1u32..4, 1u32..3, 1u32..3),
                1u32..140,
                0u32..6,
                prop::collection::vec(
                    (
                        0u32..20,
                        0u32..5,
                        prop_oneof![0u64..1 << 40, (u64::MAX >> 1)..u64::MAX - (1 << 36)],
                        prop::collection::vec(
                            (gap(), any::<u64>(), 0u16..8, any::<bool>(), any::<u32>()),
                            0..9,
                        ),
                        gap(),
                    ),
                    0..6,
                ),
            )
                .prop_map(|((gx, gy, gz), threads, cap, slots)| {
                    let slots = slots
                        .into_iter()
                        .map(|(block, warp, first, events, tail)| SlotSpec {
                            block,
                            warp,
                            first,
                            events,
                            tail,
                        })
                        .collect();
                    ([gx, gy, gz], [threads, 1, 1], cap, slots)
                })
        }

        /// Builds the buffer and returns, per written slot index, the events pushed.
        fn build(
            grid: [u32; 3],
            block: [u32; 3],
            cap: u32,
            specs: &[SlotSpec],
        ) -> (Vec<u8>, BTreeMap<u32, Vec<Event>>) {
            let mut b = BufferBuilder::new(grid, block, cap);
            let wpb = b.header().warps_per_block;
            let mut want = BTreeMap::new();
            for s in specs {
                let Some(w) = b.warp(s.block, s.warp) else {
                    continue;
                };
                let index = s.block * wpb + s.warp;
                if want.contains_key(&index) {
                    continue;
                }
                let mut evs = Vec::new();
                let mut prev = s.first;
                for &(gap, dur, id, instant, payload) in &s.events {
                    let end = prev + gap;
                    let dur = if instant {
                        0
                    } else {
                        dur % ((end - s.first).min(u32::MAX as u64) + 1)
                    };
                    evs.push(Event {
                        id,
                        kind: if instant {
                            EventKind::Instant
                        } else {
                            EventKind::Range
                        },
                        start_ns: end - dur,
                        end_ns: end,
                        payload,
                    });
                    prev = end;
                }
                w.first_ts(s.first).last_ts(prev + s.tail);
                for e in &evs {
                    w.push(*e);
                }
                want.insert(index, evs);
            }
            (b.finish(), want)
        }

        /// Everything a decoded capture promises, checked by iterating it all.
        fn check_invariants(cap: &Buffer<'_>) {
            let mut events = 0;
            let mut drops = 0;
            for s in cap.slots() {
                let h = s.header;
                assert!(h.first_ts <= h.last_ts);
                let mut prev = h.first_ts;
                for e in s.events() {
                    assert!(h.first_ts <= e.start_ns && e.start_ns <= e.end_ns);
                    assert!(prev <= e.end_ns && e.end_ns <= h.last_ts);
                    if e.kind == EventKind::Instant {
                        assert_eq!(e.start_ns, e.end_ns);
                    }
                    prev = e.end_ns;
                    events += 1;
                }
                drops += s.events_lost() as u64;
            }
            assert_eq!((events, drops), (cap.event_count(), cap.events_lost()));
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn valid_buffers_round_trip((grid, block, cap, specs) in launch()) {
                let (bytes, want) = build(grid, block, cap, &specs);
                let reg = EventRegistry::from_pairs((0..8).map(|i| (i, "e"))).unwrap();
                let c = Buffer::decode(&bytes, Some(&reg)).unwrap();
                check_invariants(&c);
                let got: BTreeMap<u32, Vec<Event>> =
                    c.slots().map(|s| (s.index, s.events().collect())).collect();
                let kept: BTreeMap<u32, Vec<Event>> = want
                    .iter()
                    .map(|(&i, e)| (i, e[..e.len().min(cap as usize)].to_vec()))
                    .collect();
                prop_assert_eq!(got, kept);
                let drops: u64 = want.values().map(|e| e.len().saturating_sub(cap as usize) as u64).sum();
                prop_assert_eq!(c.events_lost(), drops);
            }

            #[test]
            fn mutated_buffers_never_panic(
                (grid, block, cap, specs) in launch(),
                flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
                words in prop::collection::vec(
                    (any::<prop::sample::Index>(), prop_oneof![
                        Just(0u32), Just(1), Just(u32::MAX), Just(u32::MAX - 1), Just(1 << 31), any::<u32>()
                    ]),
                    0..4,
                ),
                cut in prop::option::weighted(0.2, any::<prop::sample::Index>()),
            ) {
                let (mut bytes, _) = build(grid, block, cap, &specs);
                for (at, x) in flips {
                    let i = at.index(bytes.len());
                    bytes[i] ^= x;
                }
                for (at, v) in words {
                    let i = at.index(bytes.len() / 4) * 4;
                    put(&mut bytes, i, &v.to_le_bytes());
                }
                if let Some(c) = cut {
                    bytes.truncate(c.index(bytes.len() + 1));
                }
                let reg = EventRegistry::from_pairs((0..5).map(|i| (i, "e"))).unwrap();
                for r in [None, Some(&reg)] {
                    if let Ok(c) = Buffer::decode(&bytes, r) {
                        check_invariants(&c);
                        let _ = c.to_owned_capture();
                    }
                }
            }

            #[test]
            fn random_bytes_never_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..600),
                header in any::<bool>(),
                cap in 0u32..4,
                slots in 0u32..5,
            ) {
                let mut bytes = bytes;
                if header && bytes.len() >= 64 {
                    // Give random bodies a valid header so the slot checks are reached.
                    let mut b = BufferBuilder::new([1, 1, 1], [32 * slots.max(1), 1, 1], cap);
                    b.slot_count(slots);
                    b.header().write_to(&mut bytes);
                }
                if let Ok(c) = Buffer::decode(&bytes, None) {
                    check_invariants(&c);
                }
            }
        }
    }
}
