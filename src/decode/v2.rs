//! Slots of v2 entries (`docs/format.md`, "Slot format v2"): checked once, at
//! decode, into the [`SlotHeader`] a v1 slot would have; then read as events.
//!
//! The device writes one 8-byte entry per phase boundary, so the host rebuilds each
//! range from its begin and its end with a stack of the open ranges. The check walks
//! the entries once with that stack (ids only) and refuses anything that does not
//! rebuild into well-nested ranges; [`Events`] walks them again with the stack's start
//! times, trusting the check. Neither allocates: the stack is [`MAX_DEPTH`] deep.

use crate::format::{
    self, slot_v2_offsets as so, Entry, Event, EventKind, SlotHeader, ENTRY_BEGIN, ENTRY_END,
    ENTRY_INSTANT, ENTRY_PAYLOAD, ENTRY_SIZE, ENTRY_SWITCH, MAX_DEPTH, SLOT_HEADER_SIZE,
    SLOT_MAGIC_V2,
};

use super::bytes::{u32_at, u64_at};
use super::error::DecodeError;

/// Where a slot lies in its launch: what the checks need from the buffer header.
pub(super) struct Place {
    /// The slot's index.
    pub(super) index: u32,
    /// Records per slot (the slot holds twice as many entries).
    pub(super) capacity: u32,
    /// `block_linear`, `blockIdx` and the warp, from the index.
    pub(super) block_linear: u32,
    pub(super) block: [u32; 3],
    pub(super) warp: u32,
}

/// The first entry of `rest`, and what follows it.
#[inline]
fn first(rest: &[u8]) -> Option<(Entry, &[u8])> {
    let (e, rest) = rest.split_first_chunk::<ENTRY_SIZE>()?;
    Some((Entry::read(e), rest))
}

/// Whether an entry of this kind carries a time (all but payloads).
pub(super) fn timed(kind: u16) -> bool {
    kind != ENTRY_PAYLOAD
}

/// Why an entry was refused, as found by the hot loop; made into a [`DecodeError`]
/// only then ([`refused`]), so that the loop carries no large error.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fail {
    Kind,
    Payload,
    UnknownId,
    Backwards(u64),
    NothingOpen,
    NotInnermost(u16),
    AlreadyOpen,
    TooDeep,
}

#[cold]
#[inline(never)]
pub(super) fn refused(slot: u32, entry: u32, e: Entry, fail: Fail) -> DecodeError {
    let id = e.event_id;
    match fail {
        Fail::Kind => DecodeError::UnknownKind {
            slot,
            record: entry,
            kind: e.kind,
        },
        Fail::Payload => DecodeError::StrayPayload { slot, entry },
        Fail::UnknownId => DecodeError::UnknownEventId {
            slot,
            record: entry,
            id,
        },
        Fail::Backwards(by_ns) => DecodeError::TimeBackwards {
            slot,
            record: entry,
            by_ns,
        },
        Fail::NothingOpen => DecodeError::NothingOpen { slot, entry, id },
        Fail::NotInnermost(open) => DecodeError::NotInnermost {
            slot,
            entry,
            id,
            open,
        },
        Fail::AlreadyOpen => DecodeError::AlreadyOpen { slot, entry, id },
        Fail::TooDeep => DecodeError::TooDeep { slot, entry },
    }
}

/// The ids of the open ranges, innermost last.
struct Open {
    ids: [u16; MAX_DEPTH],
    depth: usize,
}

impl Open {
    #[inline]
    fn push(&mut self, id: u16) -> Result<(), Fail> {
        if self.ids[..self.depth].contains(&id) {
            return Err(Fail::AlreadyOpen);
        }
        if self.depth == MAX_DEPTH {
            return Err(Fail::TooDeep);
        }
        self.ids[self.depth] = id;
        self.depth += 1;
        Ok(())
    }

    /// Closes the innermost range; with `must_be`, it must be `id`'s.
    #[inline]
    fn pop(&mut self, id: u16, must_be: bool) -> Result<(), Fail> {
        let top = self.depth.checked_sub(1).ok_or(Fail::NothingOpen)?;
        if must_be && self.ids[top] != id {
            return Err(Fail::NotInnermost(self.ids[top]));
        }
        self.depth = top;
        Ok(())
    }
}

/// What one walk over a slot's entries found.
struct Walked {
    /// Sum of the gaps between consecutive timed entries.
    span: u64,
    events: u32,
    /// The last timed entry: its index and time.
    last: Option<(u32, u32)>,
    /// Ranges left open.
    depth: usize,
}

/// The hot loop: one pass over the entries, checking kinds, ids, payloads, times and
/// nesting.
#[inline(always)]
fn walk(entries: &[u8], known: impl Fn(u16) -> bool) -> Result<Walked, (u32, Entry, Fail)> {
    let mut open = Open {
        ids: [0; MAX_DEPTH],
        depth: 0,
    };
    let mut w = Walked {
        span: 0,
        events: 0,
        last: None,
        depth: 0,
    };
    // An event just ended (a payload may follow).
    let mut ended = false;
    let (mut rest, mut next) = (entries, 0u32);
    while let Some((e, tail)) = first(rest) {
        let n = next;
        (rest, next) = (tail, next + 1);
        let fail = |f| (n, e, f);
        if !timed(e.kind) {
            if e.event_id != 0 || !ended {
                return Err(fail(Fail::Payload));
            }
            ended = false;
            continue;
        }
        if e.kind > ENTRY_PAYLOAD {
            return Err(fail(Fail::Kind));
        }
        if !known(e.event_id) {
            return Err(fail(Fail::UnknownId));
        }
        if let Some((_, lo)) = w.last {
            let delta = e.time_lo.wrapping_sub(lo) as u64;
            if delta >= 1 << 31 {
                return Err(fail(Fail::Backwards((1 << 32) - delta)));
            }
            w.span += delta;
        }
        w.last = Some((n, e.time_lo));
        match e.kind {
            ENTRY_BEGIN => open.push(e.event_id),
            ENTRY_END => open.pop(e.event_id, true),
            ENTRY_SWITCH => open
                .pop(e.event_id, false)
                .and_then(|()| open.push(e.event_id)),
            _ => Ok(()),
        }
        .map_err(fail)?;
        ended = e.ends_event();
        w.events += u32::from(ended);
    }
    w.depth = open.depth;
    Ok(w)
}

/// Checks a flushed v2 slot (its bytes, header first, as long as the stride) and
/// returns the header a reader sees: `first_ts` is the first entry's time (the
/// flush's when there is none), `record_count` the events the entries rebuild into,
/// `events_lost` the device's count of events whose closing entry did not fit (the
/// kept entries are a prefix, so an event is rebuilt exactly when its closing entry
/// was kept: nothing to add), and the open-at-flush flag is set when a range was
/// left open.
pub(super) fn check(
    slot: &[u8],
    at: &Place,
    known: impl Fn(u16) -> bool,
) -> Result<SlotHeader, DecodeError> {
    let i = at.index;
    debug_assert_eq!(u32_at(slot, so::MAGIC), SLOT_MAGIC_V2);
    if let Some(k) = slot[so::RESERVED..SLOT_HEADER_SIZE]
        .iter()
        .position(|&b| b != 0)
    {
        return Err(DecodeError::ReservedNotZero {
            slot: i,
            offset: so::RESERVED + k,
        });
    }
    let count = u32_at(slot, so::ENTRY_COUNT);
    let cap = at.capacity as u64 * 2;
    if count as u64 > cap {
        return Err(DecodeError::CountOverCapacity {
            slot: i,
            count,
            capacity: u32::try_from(cap).unwrap_or(u32::MAX),
        });
    }
    let found = u32_at(slot, so::SLOT);
    if found != i {
        return Err(DecodeError::WrongSlot { slot: i, found });
    }
    let (events_lost, entries_lost) = (
        u32_at(slot, so::EVENTS_LOST),
        u32_at(slot, so::ENTRIES_LOST),
    );
    if events_lost > entries_lost {
        return Err(DecodeError::EventsLostOverEntries {
            slot: i,
            events: events_lost,
            entries: entries_lost,
        });
    }
    let (last_ts, anchor_ts) = (u64_at(slot, so::LAST_TS), u64_at(slot, so::ANCHOR_TS));
    if anchor_ts > last_ts {
        return Err(DecodeError::AnchorAfterLast {
            slot: i,
            anchor_ts,
            last_ts,
        });
    }
    let entries = &slot[SLOT_HEADER_SIZE..SLOT_HEADER_SIZE + count as usize * ENTRY_SIZE];
    let Walked {
        mut span,
        events,
        last,
        depth,
    } = walk(entries, known).map_err(|(n, e, f)| refused(i, n, e, f))?;
    let first_ts = match last {
        Some((entry, lo)) => {
            let tail = (anchor_ts as u32).wrapping_sub(lo) as u64;
            if tail >= 1 << 31 {
                return Err(DecodeError::EntryFarFromAnchor {
                    slot: i,
                    entry,
                    by_ns: tail,
                });
            }
            span += tail;
            anchor_ts
                .checked_sub(span)
                .ok_or(DecodeError::SpanBeforeZero {
                    slot: i,
                    span_ns: span,
                    anchor_ts,
                })?
        }
        None => last_ts,
    };
    let sm = u32_at(slot, so::SM);
    Ok(SlotHeader {
        magic: SLOT_MAGIC_V2,
        flags: if depth != 0 {
            format::SLOT_FLAG_OPEN_AT_FLUSH
        } else {
            0
        },
        first_ts,
        last_ts,
        sm_first: sm,
        sm_last: sm,
        block_linear: at.block_linear,
        block: at.block,
        warp: at.warp,
        cluster_rank: u32_at(slot, so::CLUSTER_RANK),
        record_count: events,
        events_lost,
    })
}

/// A v2 slot's events, rebuilt from its entries ([`super::Events`] for a v2 slot).
#[derive(Debug, Clone)]
pub(super) struct Events<'a> {
    /// The entries not read yet.
    rest: &'a [u8],
    /// Full time of the previous timed entry (the first entry's, before it).
    prev: u64,
    ids: [u16; MAX_DEPTH],
    starts: [u64; MAX_DEPTH],
    depth: usize,
    /// Events not yet returned.
    left: u32,
}

impl<'a> Events<'a> {
    /// Over the entries of a slot that [`check`] accepted, with the header it returned.
    pub(super) fn new(entries: &'a [u8], header: &SlotHeader) -> Self {
        Events {
            rest: entries,
            prev: header.first_ts,
            ids: [0; MAX_DEPTH],
            starts: [0; MAX_DEPTH],
            depth: 0,
            left: header.record_count,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.left as usize
    }

    /// The payload entry after the current one, if there is one (consumed).
    #[inline]
    fn payload(&mut self) -> u32 {
        match first(self.rest) {
            Some((e, rest)) if e.kind == ENTRY_PAYLOAD => {
                self.rest = rest;
                e.time_lo
            }
            _ => 0,
        }
    }
}

impl Iterator for Events<'_> {
    type Item = Event;

    #[inline]
    fn next(&mut self) -> Option<Event> {
        // The check accepted these entries: the stack neither under- nor overflows
        // (the `get`s only keep a wrong slice from panicking), and no time wraps.
        while self.left != 0 {
            let (e, rest) = first(self.rest)?;
            self.rest = rest;
            let t = self
                .prev
                .wrapping_add(e.time_lo.wrapping_sub(self.prev as u32) as u64);
            let (id, kind, start) = match e.kind {
                ENTRY_BEGIN => {
                    *self.ids.get_mut(self.depth)? = e.event_id;
                    self.starts[self.depth] = t;
                    self.depth += 1;
                    self.prev = t;
                    continue;
                }
                ENTRY_END | ENTRY_SWITCH => {
                    self.depth = self.depth.checked_sub(1)?;
                    let closed = (
                        self.ids[self.depth],
                        EventKind::Range,
                        self.starts[self.depth],
                    );
                    if e.kind == ENTRY_SWITCH {
                        self.ids[self.depth] = e.event_id;
                        self.starts[self.depth] = t;
                        self.depth += 1;
                    }
                    closed
                }
                ENTRY_INSTANT => (e.event_id, EventKind::Instant, t),
                _ => continue,
            };
            self.prev = t;
            self.left -= 1;
            return Some(Event {
                id,
                kind,
                start_ns: start,
                end_ns: t,
                payload: self.payload(),
            });
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len(), Some(self.len()))
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::{Buffer, DecodeError as E};
    use crate::format::{
        slot_v2_offsets as so, BufferBuilder, Event, EventKind, BUFFER_HEADER_SIZE, ENTRY_PAYLOAD,
        ENTRY_SIZE, SLOT_FLAG_OPEN_AT_FLUSH, SLOT_HEADER_SIZE,
    };
    use crate::registry::EventRegistry;
    use proptest::prelude::*;

    fn range(id: u16, start_ns: u64, end_ns: u64, payload: u32) -> Event {
        Event {
            id,
            kind: EventKind::Range,
            start_ns,
            end_ns,
            payload,
        }
    }

    fn instant(id: u16, at: u64, payload: u32) -> Event {
        Event {
            id,
            kind: EventKind::Instant,
            start_ns: at,
            end_ns: at,
            payload,
        }
    }

    /// A k-loop as the CUDA recorder writes it: an outer range, load → mma phases by
    /// switch_to with the k-tile as payload, an instant, and times across a 2³² wrap.
    #[test]
    fn nested_phases_rebuild_in_the_order_they_end() {
        let t0 = (1u64 << 32) - 150;
        let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 8);
        b.warp_v2(1, 1)
            .unwrap()
            .sm(7)
            .begin(9, t0)
            .begin(1, t0 + 10)
            .switch(2, t0 + 100)
            .payload(0)
            .switch(1, t0 + 200)
            .payload(0)
            .instant(5, t0 + 210)
            .switch(2, t0 + 300)
            .payload(1)
            .end(2, t0 + 400)
            .payload(1)
            .end(9, t0 + 410)
            .last_ts(t0 + 500);
        let bytes = b.finish();
        let cap = Buffer::decode(&bytes, None).unwrap();
        let s = cap.slot(3).unwrap();
        assert_eq!(s.format(), 2);
        let got: Vec<Event> = s.events().collect();
        assert_eq!(
            got,
            [
                range(1, t0 + 10, t0 + 100, 0),
                range(2, t0 + 100, t0 + 200, 0),
                instant(5, t0 + 210, 0),
                range(1, t0 + 200, t0 + 300, 1),
                range(2, t0 + 300, t0 + 400, 1),
                range(9, t0, t0 + 410, 0),
            ]
        );
        assert_eq!(s.events().len(), 6);
        let h = s.header;
        assert_eq!((h.first_ts, h.last_ts), (t0, t0 + 500));
        assert_eq!((h.record_count, h.events_lost, h.flags), (6, 0, 0));
        assert_eq!(
            (h.sm_first, h.sm_last, h.block_linear, h.warp),
            (7, 7, 1, 1)
        );
        assert_eq!(s.records().len(), 0);
        assert_eq!(cap.event_count(), 6);
        assert_eq!(cap.time_range(), Some((t0, t0 + 500)));
    }

    #[test]
    fn dropped_entries_leave_ranges_open_and_are_counted() {
        // Capacity 2 records: 4 entries kept of 6.
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 2);
        b.warp_v2(0, 0)
            .unwrap()
            .begin(1, 100)
            .begin(2, 110)
            .end(2, 120)
            .payload(3)
            .end(1, 130)
            .instant(4, 140)
            .last_ts(900);
        let bytes = b.finish();
        let cap = Buffer::decode(&bytes, None).unwrap();
        let s = cap.slot(0).unwrap();
        assert_eq!(s.events().collect::<Vec<_>>(), [range(2, 110, 120, 3)]);
        assert_eq!((s.events_lost(), s.event_count()), (2, 1));
        assert!(s.open_at_flush());
        // Kept entries unwrap back from the last kept one, not from the flush.
        assert_eq!(
            u64::from_le_bytes(bytes[64 + 16..64 + 24].try_into().unwrap()),
            120
        );
        assert_eq!(s.header.first_ts, 100);
    }

    /// Written from the tables of docs/format.md ("Slot format v2") with literal offsets.
    #[test]
    fn decodes_a_v2_slot_written_by_hand_from_the_doc() {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 2).finish();
        let s = 64;
        let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(&mut b, s, b"SLT2");
        put(&mut b, s + 4, &3u32.to_le_bytes()); // entry_count
        put(&mut b, s + 8, &5000u64.to_le_bytes()); // last_ts
        put(&mut b, s + 16, &4000u64.to_le_bytes()); // anchor_ts
        put(&mut b, s + 28, &3u32.to_le_bytes()); // sm
        put(&mut b, s + 36, &u32::MAX.to_le_bytes()); // cluster_rank
        let e = s + 64;
        put(&mut b, e, &3000u32.to_le_bytes()); // begin 6 at 3000
        put(&mut b, e + 4, &6u16.to_le_bytes());
        put(&mut b, e + 8, &3500u32.to_le_bytes()); // end 6 at 3500
        put(&mut b, e + 12, &6u16.to_le_bytes());
        put(&mut b, e + 14, &1u16.to_le_bytes());
        put(&mut b, e + 16, &42u32.to_le_bytes()); // its payload
        put(&mut b, e + 22, &4u16.to_le_bytes());
        let cap = Buffer::decode(&b, None).unwrap();
        let s = cap.slot(0).unwrap();
        assert_eq!(s.events().collect::<Vec<_>>(), [range(6, 3000, 3500, 42)]);
        assert_eq!(
            (s.header.first_ts, s.header.last_ts, s.header.sm_last),
            (3000, 5000, 3)
        );
    }

    #[test]
    fn v1_and_v2_slots_share_a_buffer_and_survive_trimming() {
        let mut b = BufferBuilder::new([3, 1, 1], [32, 1, 1], 16);
        b.warp(0, 0).unwrap().range(1, 100, 200, 7);
        b.warp_v2(2, 0)
            .unwrap()
            .begin(1, 100)
            .end(1, 200)
            .payload(7);
        let header = *b.header();
        let bytes = b.finish();
        let events = |bytes: &[u8]| -> Vec<Vec<Event>> {
            let cap = Buffer::decode(bytes, None).unwrap();
            cap.slots().map(|s| s.events().collect()).collect()
        };
        let want = events(&bytes);
        assert_eq!(want.len(), 2);
        assert_eq!(want[0], want[1]);
        let t = crate::format::trimmed(&bytes, &header);
        // The v1 slot's one record is the longest: 3 entries take 2 records.
        assert_eq!(
            t.len(),
            BUFFER_HEADER_SIZE + 3 * (SLOT_HEADER_SIZE + 2 * 16)
        );
        assert_eq!(events(&t), want);
    }

    /// A valid slot 0 of 4 records (8 entries) in a one-warp launch, then `f` applied.
    fn rejected(f: impl FnOnce(&mut Vec<u8>)) -> E {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 4);
        b.warp_v2(0, 0)
            .unwrap()
            .begin(1, 1000)
            .begin(2, 1100)
            .end(2, 1200)
            .payload(5)
            .instant(3, 1250)
            .end(1, 1300)
            .last_ts(1400);
        let mut bytes = b.finish();
        let reg = EventRegistry::from_pairs([(1, "a"), (2, "b"), (3, "c")]).unwrap();
        Buffer::decode(&bytes, Some(&reg)).unwrap();
        f(&mut bytes);
        Buffer::decode(&bytes, Some(&reg)).unwrap_err()
    }

    const S: usize = 64;
    const EN: usize = S + 64;

    fn set32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn set16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    /// Entry `n`: its time (or payload), id and kind.
    fn entry(b: &mut [u8], n: usize, t: u32, id: u16, kind: u16) {
        set32(b, EN + n * ENTRY_SIZE, t);
        set16(b, EN + n * ENTRY_SIZE + 4, id);
        set16(b, EN + n * ENTRY_SIZE + 6, kind);
    }

    #[test]
    fn every_way_a_v2_slot_can_be_wrong_is_refused() {
        assert_eq!(
            rejected(|b| b[S + 50] = 1),
            E::ReservedNotZero {
                slot: 0,
                offset: 50
            }
        );
        assert_eq!(
            rejected(|b| set32(b, S + so::ENTRY_COUNT, 9)),
            E::CountOverCapacity {
                slot: 0,
                count: 9,
                capacity: 8
            }
        );
        assert_eq!(
            rejected(|b| set32(b, S + so::SLOT, 1)),
            E::WrongSlot { slot: 0, found: 1 }
        );
        // An event lost without its closing entry lost: the counts lie.
        assert_eq!(
            rejected(|b| set32(b, S + so::EVENTS_LOST, 1)),
            E::EventsLostOverEntries {
                slot: 0,
                events: 1,
                entries: 0
            }
        );
        assert_eq!(
            rejected(|b| b[S + so::RESERVED] = 1),
            E::ReservedNotZero {
                slot: 0,
                offset: so::RESERVED
            }
        );
        assert_eq!(
            rejected(|b| b[S + so::ANCHOR_TS..S + so::ANCHOR_TS + 8]
                .copy_from_slice(&1401u64.to_le_bytes())),
            E::AnchorAfterLast {
                slot: 0,
                anchor_ts: 1401,
                last_ts: 1400
            }
        );
        // Entry 1 (begin 2) 1 ns before entry 0.
        assert_eq!(
            rejected(|b| set32(b, EN + ENTRY_SIZE, 999)),
            E::TimeBackwards {
                slot: 0,
                record: 1,
                by_ns: 1
            }
        );
        // The last entry after the anchor (1400).
        assert_eq!(
            rejected(|b| set32(b, EN + 5 * ENTRY_SIZE, 1401)),
            E::EntryFarFromAnchor {
                slot: 0,
                entry: 5,
                by_ns: (1 << 32) - 1
            }
        );
        // Entries that span more than the anchor: the anchor at 100.
        assert_eq!(
            rejected(|b| {
                b[S + so::ANCHOR_TS..S + so::ANCHOR_TS + 8].copy_from_slice(&100u64.to_le_bytes());
                for n in [0, 1, 2, 4, 5] {
                    let at = EN + n * ENTRY_SIZE;
                    let t = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
                    set32(b, at, t.wrapping_sub(1200));
                }
            }),
            E::SpanBeforeZero {
                slot: 0,
                span_ns: 300,
                anchor_ts: 100
            }
        );
        assert_eq!(
            rejected(|b| set16(b, EN + 6, 9)),
            E::UnknownKind {
                slot: 0,
                record: 0,
                kind: 9
            }
        );
        assert_eq!(
            rejected(|b| set16(b, EN + 4, 4)),
            E::UnknownEventId {
                slot: 0,
                record: 0,
                id: 4
            }
        );
        // A payload first, after a begin, after a payload, or with an event id.
        assert_eq!(
            rejected(|b| entry(b, 0, 7, 0, ENTRY_PAYLOAD)),
            E::StrayPayload { slot: 0, entry: 0 }
        );
        assert_eq!(
            rejected(|b| entry(b, 2, 7, 0, ENTRY_PAYLOAD)),
            E::StrayPayload { slot: 0, entry: 2 }
        );
        assert_eq!(
            rejected(|b| entry(b, 4, 7, 0, ENTRY_PAYLOAD)),
            E::StrayPayload { slot: 0, entry: 4 }
        );
        assert_eq!(
            rejected(|b| set16(b, EN + 3 * ENTRY_SIZE + 4, 2)),
            E::StrayPayload { slot: 0, entry: 3 }
        );
        // The outer range ended first: end 1 while 2 is innermost.
        assert_eq!(
            rejected(|b| set16(b, EN + 2 * ENTRY_SIZE + 4, 1)),
            E::NotInnermost {
                slot: 0,
                entry: 2,
                id: 1,
                open: 2
            }
        );
        // No begin at all: entry 0 a switch, or an end.
        assert_eq!(
            rejected(|b| set16(b, EN + 6, 2)),
            E::NothingOpen {
                slot: 0,
                entry: 0,
                id: 1
            }
        );
        assert_eq!(
            rejected(|b| set16(b, EN + 6, 1)),
            E::NothingOpen {
                slot: 0,
                entry: 0,
                id: 1
            }
        );
        // Begin 1 inside 1, and a switch to the open outer range.
        assert_eq!(
            rejected(|b| set16(b, EN + ENTRY_SIZE + 4, 1)),
            E::AlreadyOpen {
                slot: 0,
                entry: 1,
                id: 1
            }
        );
        assert_eq!(
            rejected(|b| {
                set16(b, EN + 2 * ENTRY_SIZE + 4, 1);
                set16(b, EN + 2 * ENTRY_SIZE + 6, 2);
            }),
            E::AlreadyOpen {
                slot: 0,
                entry: 2,
                id: 1
            }
        );
        let e = rejected(|b| b[S] = b'X');
        assert!(e.to_string().contains("\"SLT2\""), "{e}");
        assert_eq!(
            rejected(|b| set16(b, EN + 2 * ENTRY_SIZE + 4, 1)).to_string(),
            "slot 0 entry 2: ends event 1, but the innermost open range is event 2: ranges must nest"
        );
    }

    #[test]
    fn deeper_than_max_depth_is_refused_and_max_depth_is_not() {
        let decode = |depth: u16| {
            let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 64);
            let w = b.warp_v2(0, 0).unwrap();
            for id in 0..depth {
                w.begin(id, 10 + id as u64);
            }
            let bytes = b.finish();
            Buffer::decode(&bytes, None).map(|c| c.slot(0).unwrap().open_at_flush())
        };
        assert_eq!(decode(32), Ok(true));
        assert_eq!(decode(33), Err(E::TooDeep { slot: 0, entry: 32 }));
    }

    #[test]
    fn a_v2_slot_past_the_grid_is_refused() {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 1);
        b.warp_v2(0, 0).unwrap().instant(1, 5);
        let mut bytes = b.finish();
        let slot0 = bytes[64..64 + 80].to_vec();
        bytes[16..20].copy_from_slice(&2u32.to_le_bytes()); // slot_count 2, one warp
        bytes.extend_from_slice(&slot0);
        set32(&mut bytes, 64 + 80 + so::SLOT, 1);
        assert_eq!(
            Buffer::decode(&bytes, None).unwrap_err(),
            E::SlotOutsideGrid { slot: 1, warps: 1 }
        );
    }

    /// One step of a random warp: what the recorder's calls write.
    #[derive(Debug, Clone)]
    enum Op {
        Begin(u16),
        End,
        Switch(u16),
        Instant(u16),
    }

    fn ops() -> impl Strategy<Value = Vec<(Op, u64, Option<u32>)>> {
        let op = prop_oneof![
            (0u16..6).prop_map(Op::Begin),
            Just(Op::End),
            (0u16..6).prop_map(Op::Switch),
            (0u16..6).prop_map(Op::Instant),
        ];
        let gap = prop_oneof![0u64..100, 0u64..(1 << 31) - 1];
        prop::collection::vec((op, gap, prop::option::of(any::<u32>())), 0..40)
    }

    /// Writes the ops that keep the stream well nested (the others are skipped) and
    /// returns the buffer, the events a reader must see and the events made.
    fn build(first: u64, ops: &[(Op, u64, Option<u32>)], cap: u32) -> (Vec<u8>, Vec<Event>, u64) {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], cap);
        let w = b.warp_v2(0, 0).unwrap();
        let mut open: Vec<(u16, u64)> = Vec::new();
        let (mut t, mut want, mut written, mut made) = (first, Vec::new(), 0usize, 0u64);
        let kept = 2 * cap as usize;
        for (op, gap, payload) in ops {
            let last = t;
            t += gap;
            let ev = match *op {
                Op::Begin(id) if !open.iter().any(|&(o, _)| o == id) => {
                    w.begin(id, t);
                    open.push((id, t));
                    None
                }
                Op::End if !open.is_empty() => {
                    let (id, s) = open.pop().unwrap();
                    w.end(id, t);
                    Some(range(id, s, t, 0))
                }
                Op::Switch(id)
                    if !open.is_empty()
                        && !open[..open.len() - 1].iter().any(|&(o, _)| o == id) =>
                {
                    let (old, s) = open.pop().unwrap();
                    w.switch(id, t);
                    open.push((id, t));
                    Some(range(old, s, t, 0))
                }
                Op::Instant(id) => {
                    w.instant(id, t);
                    Some(instant(id, t, 0))
                }
                _ => {
                    t = last;
                    continue;
                }
            };
            written += 1;
            if let Some(mut ev) = ev {
                made += 1;
                if let Some(p) = payload {
                    w.payload(*p);
                    written += 1;
                    if written <= kept {
                        ev.payload = *p;
                    }
                }
                if written - usize::from(payload.is_some()) <= kept {
                    want.push(ev);
                }
            }
        }
        w.last_ts(t + 7);
        (b.finish(), want, made)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn well_nested_streams_round_trip(
            first in prop_oneof![0u64..1 << 40, (u64::MAX >> 1)..(u64::MAX >> 1) + (1 << 40)],
            ops in ops(),
            cap in prop_oneof![Just(64u32), 0u32..8],
        ) {
            let (bytes, want, made) = build(first, &ops, cap);
            let c = Buffer::decode(&bytes, None).unwrap();
            let s = c.slot(0).unwrap();
            prop_assert_eq!(s.events().len(), want.len());
            // Whatever did not fit: delivered + lost = made, in events.
            prop_assert_eq!(s.events().len() as u64 + u64::from(s.events_lost()), made);
            prop_assert_eq!(s.events().collect::<Vec<_>>(), want);
            for e in s.events() {
                prop_assert!(s.header.first_ts <= e.start_ns && e.end_ns <= s.header.last_ts);
            }
        }

        #[test]
        fn mutated_v2_slots_never_panic(
            ops in ops(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let (mut bytes, _, _) = build(1 << 33, &ops, 16);
            for (at, x) in flips {
                let i = BUFFER_HEADER_SIZE + at.index(bytes.len() - BUFFER_HEADER_SIZE);
                bytes[i] ^= x;
            }
            if let Ok(c) = Buffer::decode(&bytes, None) {
                for s in c.slots() {
                    let h = s.header;
                    let mut n = 0;
                    for e in s.events() {
                        prop_assert!(h.first_ts <= e.start_ns && e.start_ns <= e.end_ns && e.end_ns <= h.last_ts);
                        n += 1;
                    }
                    prop_assert_eq!(n, h.record_count);
                    prop_assert_eq!(h.flags & !SLOT_FLAG_OPEN_AT_FLUSH, 0);
                }
            }
        }
    }
}
