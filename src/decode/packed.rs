//! Packed buffers (docs/format.md, "Packed buffers"): slots one after the
//! other, only those with events, each a v1 slot header and full events. The
//! host makes them from a streamed launch's rings; they are checked as
//! strictly as the device's buffers.

use super::bytes::{u16_at, u32_at, u64_at};
use super::error::DecodeError;
use super::v1::{check_v1_slot, read_slot_header};
use crate::format::{
    packed_offsets as po, BufferHeader, Event, EventKind, PackedIndex, SlotHeader, KIND_INSTANT,
    KIND_RANGE, PACKED_RECORD_SIZE, SLOT_HEADER_SIZE, SLOT_MAGIC,
};

/// Checks every slot and record of a packed buffer whose header is `header`.
pub(super) fn walk(
    bytes: &[u8],
    header: &BufferHeader,
    known: impl Fn(u16) -> bool,
) -> Result<PackedIndex, DecodeError> {
    let wpb = header.warps_per_block;
    let [gx, gy, gz] = header.grid;
    let warps =
        u64::try_from(gx as u128 * gy as u128 * gz as u128 * wpb as u128).unwrap_or(u64::MAX);
    let mut w = PackedIndex {
        flushed: Vec::with_capacity(header.slot_count.min(1 << 16) as usize),
        offsets: Vec::with_capacity(header.slot_count.min(1 << 16) as usize),
        events: 0,
        events_lost: 0,
        time_range: None,
        size: header.size(),
    };
    // Slot indices are the grid's (block × warps per block + warp), sampled or not:
    // a packed slot names its block and warp.
    let mut at = header.size();
    for _ in 0..header.slot_count {
        let truncated = |needed: usize| DecodeError::Truncated {
            len: bytes.len(),
            needed: needed as u64,
        };
        let head = bytes
            .get(at..at + SLOT_HEADER_SIZE)
            .ok_or(truncated(at + SLOT_HEADER_SIZE))?;
        let h = read_slot_header(head);
        // The index the header claims; its place is checked against it below.
        let index =
            (h.block_linear as u64 * wpb as u64 + h.warp as u64).min(u32::MAX as u64) as u32;
        if h.magic != SLOT_MAGIC {
            return Err(DecodeError::BadSlotMagic {
                slot: index,
                found: h.magic,
            });
        }
        if let Some(&previous) = w.flushed.last() {
            if index <= previous {
                return Err(DecodeError::PackedOutOfOrder {
                    slot: index,
                    previous,
                });
            }
        }
        let bl = index / wpb;
        let place = [bl, bl % gx, bl / gx % gy, bl / gx / gy, index % wpb];
        if index as u64 >= warps {
            return Err(DecodeError::SlotOutsideGrid { slot: index, warps });
        }
        check_v1_slot(index, &h, header.slot_capacity, place)?;
        let len = h.record_count as usize * PACKED_RECORD_SIZE;
        let start = at + SLOT_HEADER_SIZE;
        let records = bytes
            .get(start..start + len)
            .ok_or(truncated(start + len))?;
        check_records(index, &h, records, &known)?;
        w.events += h.record_count as u64;
        w.events_lost += h.events_lost as u64;
        w.time_range = Some(match w.time_range {
            Some((lo, hi)) => (lo.min(h.first_ts), hi.max(h.last_ts)),
            None => (h.first_ts, h.last_ts),
        });
        w.flushed.push(index);
        w.offsets.push(at);
        at = start + len;
    }
    w.size = at;
    Ok(w)
}

fn check_records(
    slot: u32,
    h: &SlotHeader,
    records: &[u8],
    known: impl Fn(u16) -> bool,
) -> Result<(), DecodeError> {
    let mut prev_end = h.first_ts;
    for (i, r) in records.chunks_exact(PACKED_RECORD_SIZE).enumerate() {
        let record = i as u32;
        let e = read(r);
        let kind = u16_at(r, po::KIND);
        if kind != KIND_RANGE && kind != KIND_INSTANT {
            return Err(DecodeError::UnknownKind { slot, record, kind });
        }
        if !known(e.id) {
            return Err(DecodeError::UnknownEventId {
                slot,
                record,
                id: e.id,
            });
        }
        if kind == KIND_INSTANT && e.start_ns != e.end_ns {
            return Err(DecodeError::InstantWithDuration {
                slot,
                record,
                duration: (e.end_ns.wrapping_sub(e.start_ns)).min(u32::MAX as u64) as u32,
            });
        }
        if e.end_ns < prev_end {
            return Err(DecodeError::TimeBackwards {
                slot,
                record,
                by_ns: prev_end - e.end_ns,
            });
        }
        if e.start_ns > e.end_ns || e.start_ns < h.first_ts {
            return Err(DecodeError::PackedStartOutside {
                slot,
                record,
                start: e.start_ns,
                end: e.end_ns,
                first_ts: h.first_ts,
            });
        }
        if e.end_ns > h.last_ts {
            return Err(DecodeError::EndAfterLast {
                slot,
                record,
                end: e.end_ns as u128,
                last_ts: h.last_ts,
            });
        }
        prev_end = e.end_ns;
    }
    Ok(())
}

/// One packed record (checked or not).
#[inline]
pub(super) fn read(r: &[u8]) -> Event {
    Event {
        id: u16_at(r, po::EVENT_ID),
        kind: if u16_at(r, po::KIND) == KIND_RANGE {
            EventKind::Range
        } else {
            EventKind::Instant
        },
        start_ns: u64_at(r, po::START_NS),
        end_ns: u64_at(r, po::END_NS),
        payload: u32_at(r, po::PAYLOAD),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Buffer, DecodeError as E};
    use crate::format::{PackedWriter, NO_CLUSTER};
    use crate::registry::EventRegistry;

    fn range(id: u16, start_ns: u64, end_ns: u64, payload: u32) -> Event {
        Event {
            id,
            kind: EventKind::Range,
            start_ns,
            end_ns,
            payload,
        }
    }

    fn slot(block_linear: u32, warp: u32, first_ts: u64, last_ts: u64) -> SlotHeader {
        SlotHeader {
            first_ts,
            last_ts,
            block_linear,
            block: [block_linear % 4, block_linear / 4, 0],
            warp,
            cluster_rank: NO_CLUSTER,
            ..SlotHeader::default()
        }
    }

    fn header() -> BufferHeader {
        BufferHeader {
            version: crate::format::VERSION,
            warps_per_block: 2,
            launch_id: 9,
            grid: [4, 2, 1],
            block: [64, 1, 1],
            ..BufferHeader::default()
        }
    }

    /// A part with a range longer than 2³² ns (which no device slot can hold)
    /// and an instant, on two warps; slot 4 of 16.
    fn sample() -> Vec<u8> {
        let mut w = PackedWriter::new(&header());
        let long = range(1, 1_000, 10_000_000_000, 3);
        w.slot(&slot(0, 1, 1_000, 10_000_000_000), &[long]);
        let instant = Event {
            id: 2,
            kind: EventKind::Instant,
            start_ns: 50,
            end_ns: 50,
            payload: 0,
        };
        w.slot(&slot(2, 0, 40, 60), &[range(1, 40, 45, 0), instant]);
        assert_eq!(w.slot_count(), 2);
        w.finish()
    }

    #[test]
    fn a_packed_part_round_trips_with_its_long_ranges() {
        let bytes = sample();
        let reg = EventRegistry::from_pairs([(1, "a"), (2, "b")]).unwrap();
        let b = Buffer::decode(&bytes, Some(&reg)).unwrap();
        assert_eq!(b.flushed_slot_count(), 2);
        assert_eq!(b.event_count(), 3);
        assert_eq!(b.bytes().len(), bytes.len());
        let slots: Vec<_> = b.slots().collect();
        assert_eq!((slots[0].index, slots[1].index), (1, 4));
        assert_eq!(slots[0].format(), 0);
        assert_eq!(
            slots[0].events().collect::<Vec<_>>(),
            vec![range(1, 1_000, 10_000_000_000, 3)]
        );
        assert_eq!(slots[1].events().count(), 2);
        assert_eq!(b.slot(4).unwrap().header.first_ts, 40);
        assert!(b.slot(2).is_none());
        assert_eq!(b.time_range(), Some((40, 10_000_000_000)));
    }

    #[test]
    fn a_packed_buffer_is_checked_strictly() {
        let reg = EventRegistry::from_pairs([(1, "a")]).unwrap();
        let bytes = sample();
        assert!(matches!(
            Buffer::decode(&bytes, Some(&reg)),
            Err(E::UnknownEventId {
                slot: 4,
                record: 1,
                id: 2
            })
        ));
        assert!(matches!(
            Buffer::decode(&bytes[..bytes.len() - 1], None),
            Err(E::Truncated { .. })
        ));
        let mut w = PackedWriter::new(&header());
        w.slot(&slot(2, 0, 0, 100), &[range(1, 0, 10, 0)]);
        w.slot(&slot(0, 1, 0, 100), &[range(1, 0, 10, 0)]);
        assert!(matches!(
            Buffer::decode(&w.finish(), None),
            Err(E::PackedOutOfOrder {
                slot: 1,
                previous: 4
            })
        ));
        let mut w = PackedWriter::new(&header());
        w.slot(&slot(0, 0, 20, 100), &[range(1, 10, 30, 0)]);
        assert!(matches!(
            Buffer::decode(&w.finish(), None),
            Err(E::PackedStartOutside { start: 10, .. })
        ));
        let mut w = PackedWriter::new(&header());
        w.slot(
            &slot(0, 0, 0, 100),
            &[range(1, 0, 30, 0), range(1, 0, 20, 0)],
        );
        assert!(matches!(
            Buffer::decode(&w.finish(), None),
            Err(E::TimeBackwards {
                record: 1,
                by_ns: 10,
                ..
            })
        ));
        let mut w = PackedWriter::new(&header());
        w.slot(&slot(0, 2, 0, 100), &[]);
        assert!(matches!(
            Buffer::decode(&w.finish(), None),
            Err(E::Misplaced { .. })
        ));
    }
}
