//! One warp's streaming ring, read a chunk at a time (docs/format.md,
//! "Streaming slots"): [`WarpChunks`] keeps what carries from one chunk to the
//! next (the open ranges, the event a payload may still follow, the time) and
//! turns each complete chunk into events, checked as strictly as a v2 slot.
//!
//! The chunk arrives as 32 words the caller loaded from memory the device may
//! be writing; nothing here reads that memory.

use crate::format::{
    Entry, Event, EventKind, CHUNK_COUNT_MASK, CHUNK_ENTRIES, CHUNK_GAP, CHUNK_SM_MASK,
    CHUNK_SM_SHIFT, ENTRY_BEGIN, ENTRY_END, ENTRY_INSTANT, ENTRY_PAYLOAD, ENTRY_SWITCH, MAX_DEPTH,
    STREAM_MARK,
};

use super::error::DecodeError;
use super::v2::{refused, timed, Fail};

/// Bit 63 of a little-endian entry or meta word: [`STREAM_MARK`] in its top `u16`.
const MARK_BIT: u64 = (STREAM_MARK as u64) << 48;
const STAMP_BITS: u32 = 48;

/// A complete chunk's meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Bits 0-47 of the stamp taken when the chunk was stored.
    pub stamp48: u64,
    /// Entries in the chunk.
    pub count: usize,
    /// Entries of the warp were dropped before this chunk.
    pub gap: bool,
    /// `%smid` when the chunk was stored.
    pub sm: u32,
}

/// The chunk's meta, if the chunk is complete: its meta and its entries all
/// written (every one carries [`STREAM_MARK`]; the host zeroes chunks it has read).
pub(crate) fn complete(chunk: &[u64; 32]) -> Option<Meta> {
    let meta = chunk[CHUNK_ENTRIES];
    if meta & MARK_BIT == 0 {
        return None;
    }
    let info = (meta >> 48) as u16;
    let count = (info & CHUNK_COUNT_MASK) as usize;
    // Every entry's mark, AND-ed without a branch per word (the drain tests
    // every chunk it reads).
    let marked = chunk[..count.min(CHUNK_ENTRIES)]
        .iter()
        .fold(MARK_BIT, |m, w| m & w);
    if count == 0 || count > CHUNK_ENTRIES || marked == 0 {
        // A count of 0 (or of 32) is never written: it is read as not yet
        // complete, and the launch's last part reports the slot as unread.
        return None;
    }
    Some(Meta {
        stamp48: meta & ((1 << STAMP_BITS) - 1),
        count,
        gap: info & CHUNK_GAP != 0,
        sm: ((info >> CHUNK_SM_SHIFT) & CHUNK_SM_MASK) as u32,
    })
}

/// The smallest time at or after `lower` whose low 48 bits are `stamp48`.
fn unwrap48(stamp48: u64, lower: u64) -> u64 {
    let m = 1u64 << STAMP_BITS;
    let base = lower & !(m - 1);
    let t = base | stamp48;
    if t >= lower {
        t
    } else {
        t.wrapping_add(m)
    }
}

fn entry(w: u64) -> Entry {
    Entry {
        time_lo: w as u32,
        event_id: (w >> 32) as u16,
        kind: ((w >> 48) as u16) & !STREAM_MARK,
    }
}

/// What carries from one chunk of a warp's ring to the next.
#[derive(Debug, Clone)]
pub(crate) struct WarpChunks {
    /// The open ranges, innermost last: id and start.
    open: [(u16, u64); MAX_DEPTH],
    depth: usize,
    /// The last event ended: a payload entry may still follow it, in this chunk
    /// or the next.
    held: Option<Event>,
    /// The latest device time known of the warp: its last entry's, or at first
    /// a time known to be before its first chunk.
    known_ns: u64,
    /// Entries were dropped: ends that find nothing open are lost, not errors.
    resync: bool,
    /// Entries read so far (what the errors number entries by).
    entries: u64,
    /// Events lost to gaps that only the host sees: ranges whose end came
    /// after a gap that lost their begin (or took the stack it was on). A
    /// range open at a gap is not counted when it is forgotten: its end is
    /// either read later (counted here) or was dropped (counted by the warp,
    /// in the flushed header's `events_lost`), or never came (then it was no
    /// event). So each event lost is counted once, by one of the two.
    pub lost: u64,
    /// `%smid` of the warp's latest chunk.
    pub sm: u32,
}

impl WarpChunks {
    /// A warp that has stored nothing yet; `before_ns` is a device time known
    /// to come before its first chunk's stamp (within 2⁴⁸ ns).
    pub(crate) fn new(before_ns: u64) -> WarpChunks {
        WarpChunks {
            open: [(0, 0); MAX_DEPTH],
            depth: 0,
            held: None,
            known_ns: before_ns,
            resync: false,
            entries: 0,
            lost: 0,
            sm: 0,
        }
    }

    /// Reads one complete chunk (`meta` from [`complete`]) of slot `slot`, and
    /// appends the events it ends to `out`, in the order they ended. The last
    /// event stays held until the next entry shows whether a payload follows.
    ///
    /// What it appends is what a packed slot's decoder checks (the drain packs
    /// it without that check, `OwnedBuffer::from_drain`): every id is `known`,
    /// no event ends before the one before it (times never run backwards, from
    /// chunk to chunk too), a range starts at or before its end, and an instant
    /// starts at its end.
    pub(crate) fn take(
        &mut self,
        chunk: &[u64; 32],
        meta: Meta,
        slot: u32,
        known: impl Fn(u16) -> bool,
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        let first = self.entries;
        let number = |i: usize| (first + i as u64).min(u32::MAX as u64) as u32;
        let entries = &chunk[..meta.count];
        self.entries += meta.count as u64;
        self.sm = meta.sm;
        let stamp = unwrap48(meta.stamp48, self.known_ns);
        if meta.gap {
            self.forget(out);
        }
        // Times unwrap backwards from the stamp (v2's rule), then run forwards.
        let mut times = [0u64; 32];
        let mut next = stamp;
        for (i, &w) in entries.iter().enumerate().rev() {
            let e = entry(w);
            if !timed(e.kind) {
                continue;
            }
            let back = (next as u32).wrapping_sub(e.time_lo) as u64;
            if back >= 1 << 31 || back > next {
                return Err(if next == stamp {
                    DecodeError::EntryFarFromAnchor {
                        slot,
                        entry: number(i),
                        by_ns: back,
                    }
                } else {
                    refused(slot, number(i + 1), e, Fail::Backwards((1 << 32) - back))
                });
            }
            next -= back;
            times[i] = next;
        }
        // The held event goes into `out` now, where it would go next anyway, and
        // an event is pushed as it ends: a payload fills it in place, with no
        // copy through `held`. Each entry pushes at most one event.
        out.reserve(meta.count + 1);
        let mut held = match self.held.take() {
            Some(ev) => {
                out.push(ev);
                true
            }
            None => false,
        };
        let read = self.rebuild(entries, &times, &mut held, out, &known);
        if held {
            // Still waiting for its payload, in the next chunk.
            self.held = out.pop();
        }
        if let Err((i, e, f)) = read {
            return Err(refused(slot, number(i), e, f));
        }
        self.known_ns = self.known_ns.max(stamp);
        Ok(())
    }

    /// [`take`](Self::take)'s forward pass over a chunk's `entries`, at
    /// `times`: `held` says that `out`'s last event may still get a payload.
    /// On a refused entry, returns its position with why.
    fn rebuild(
        &mut self,
        entries: &[u64],
        times: &[u64; 32],
        held: &mut bool,
        out: &mut Vec<Event>,
        known: impl Fn(u16) -> bool,
    ) -> Result<(), (usize, Entry, Fail)> {
        for (i, &w) in entries.iter().enumerate() {
            let e = entry(w);
            let fail = |f| (i, e, f);
            if e.kind == ENTRY_PAYLOAD {
                if e.event_id == 0 {
                    if std::mem::take(held) {
                        let last = out.len() - 1;
                        out[last].payload = e.time_lo;
                        continue;
                    }
                    if self.resync {
                        continue;
                    }
                } else if std::mem::take(held) {
                    // A payload entry with an id: its event is dropped with it.
                    out.pop();
                }
                return Err(fail(Fail::Payload));
            }
            if e.kind > ENTRY_PAYLOAD {
                return Err(fail(Fail::Kind));
            }
            if !known(e.event_id) {
                return Err(fail(Fail::UnknownId));
            }
            let t = times[i];
            if t < self.known_ns {
                return Err(fail(Fail::Backwards(self.known_ns - t)));
            }
            self.known_ns = t;
            // The held event stays where it is: no payload follows it.
            *held = false;
            match e.kind {
                ENTRY_BEGIN => self.push(e.event_id, t).map_err(fail)?,
                ENTRY_END => *held = self.close(e.event_id, true, t, out).map_err(fail)?,
                ENTRY_SWITCH => {
                    *held = self.close(e.event_id, false, t, out).map_err(fail)?;
                    self.push(e.event_id, t).map_err(fail)?;
                }
                ENTRY_INSTANT => {
                    out.push(Event {
                        id: e.event_id,
                        kind: EventKind::Instant,
                        start_ns: t,
                        end_ns: t,
                        payload: 0,
                    });
                    *held = true;
                }
                _ => unreachable!("kinds above ENTRY_PAYLOAD are refused above"),
            }
        }
        Ok(())
    }

    /// The warp has flushed and its ring is read: the held event goes out.
    /// Returns how many ranges were left open.
    pub(crate) fn finish(&mut self, out: &mut Vec<Event>) -> usize {
        out.extend(self.held.take());
        self.depth
    }

    /// Entries were dropped: the held event goes out without its payload, and
    /// the open ranges are forgotten (not counted: see [`WarpChunks::lost`]).
    fn forget(&mut self, out: &mut Vec<Event>) {
        out.extend(self.held.take());
        self.depth = 0;
        self.resync = true;
    }

    fn push(&mut self, id: u16, t: u64) -> Result<(), Fail> {
        if self.open[..self.depth].iter().any(|&(o, _)| o == id) {
            return Err(Fail::AlreadyOpen);
        }
        if self.depth == MAX_DEPTH {
            return Err(Fail::TooDeep);
        }
        self.open[self.depth] = (id, t);
        self.depth += 1;
        Ok(())
    }

    /// Closes the innermost range (with `must_be`, it must be `id`'s) at `t`,
    /// and pushes it as an event; returns whether it did (its begin may have
    /// been dropped).
    fn close(
        &mut self,
        id: u16,
        must_be: bool,
        t: u64,
        out: &mut Vec<Event>,
    ) -> Result<bool, Fail> {
        let Some(top) = self.depth.checked_sub(1) else {
            if self.resync {
                // Its begin was dropped.
                self.lost += 1;
                return Ok(false);
            }
            return Err(Fail::NothingOpen);
        };
        let (open, start) = self.open[top];
        if must_be && open != id {
            return Err(Fail::NotInnermost(open));
        }
        self.depth = top;
        out.push(Event {
            id: open,
            kind: EventKind::Range,
            start_ns: start,
            end_ns: t,
            payload: 0,
        });
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK: u16 = STREAM_MARK;

    fn word(time_lo: u32, id: u16, kind: u16) -> u64 {
        time_lo as u64 | (id as u64) << 32 | ((kind | MARK) as u64) << 48
    }

    fn chunk(entries: &[u64], stamp: u64, gap: bool, sm: u32) -> [u64; 32] {
        let mut c = [0u64; 32];
        c[..entries.len()].copy_from_slice(entries);
        let info = MARK
            | (sm as u16) << CHUNK_SM_SHIFT
            | if gap { CHUNK_GAP } else { 0 }
            | entries.len() as u16;
        c[31] = (stamp & ((1 << 48) - 1)) | (info as u64) << 48;
        c
    }

    fn read(ws: &mut WarpChunks, c: &[u64; 32]) -> Result<Vec<Event>, DecodeError> {
        let meta = complete(c).expect("complete");
        let mut out = Vec::new();
        ws.take(c, meta, 3, |_| true, &mut out)?;
        Ok(out)
    }

    fn range(id: u16, start_ns: u64, end_ns: u64, payload: u32) -> Event {
        Event {
            id,
            kind: EventKind::Range,
            start_ns,
            end_ns,
            payload,
        }
    }

    #[test]
    fn incomplete_chunks_are_not_read() {
        let t = 5_000_000_000u64;
        let mut c = chunk(
            &[
                word(t as u32, 1, ENTRY_BEGIN),
                word(t as u32 + 5, 1, ENTRY_END),
            ],
            t + 9,
            false,
            7,
        );
        assert_eq!(complete(&c).unwrap().count, 2);
        assert_eq!(complete(&c).unwrap().sm, 7);
        c[1] = 0;
        assert!(complete(&c).is_none(), "an entry not written yet");
        assert!(complete(&[0; 32]).is_none(), "a zero chunk");
    }

    #[test]
    fn ranges_nest_and_carry_across_chunks_with_their_payload() {
        // Times past 2³² and 2⁴⁸ boundaries are rebuilt from the stamp.
        let t0 = (1u64 << 48) - 100;
        let mut ws = WarpChunks::new(t0 - 1_000);
        let lo = |t: u64| t as u32;
        let a = chunk(
            &[
                word(lo(t0), 1, ENTRY_BEGIN),
                word(lo(t0 + 10), 2, ENTRY_BEGIN),
                word(lo(t0 + 20), 2, ENTRY_END),
            ],
            t0 + 30,
            false,
            1,
        );
        // The end of 2 is held: its payload comes in the next chunk.
        assert_eq!(read(&mut ws, &a).unwrap(), vec![]);
        let b = chunk(
            &[
                word(42, 0, ENTRY_PAYLOAD),
                word(lo(t0 + 200), 3, ENTRY_SWITCH),
                word(lo(t0 + 300), 3, ENTRY_END),
            ],
            t0 + 301,
            false,
            1,
        );
        assert_eq!(
            read(&mut ws, &b).unwrap(),
            vec![range(2, t0 + 10, t0 + 20, 42), range(1, t0, t0 + 200, 0)]
        );
        let mut out = Vec::new();
        assert_eq!(ws.finish(&mut out), 0);
        assert_eq!(out, vec![range(3, t0 + 200, t0 + 300, 0)]);
        assert_eq!(ws.lost, 0);
    }

    #[test]
    fn a_gap_forgets_open_ranges_and_tolerates_their_ends() {
        let t = 10_000u64;
        let mut ws = WarpChunks::new(0);
        let a = chunk(
            &[
                word(t as u32, 1, ENTRY_BEGIN),
                word(t as u32 + 1, 2, ENTRY_BEGIN),
            ],
            t + 2,
            false,
            0,
        );
        assert!(read(&mut ws, &a).unwrap().is_empty());
        let b = chunk(
            &[
                word(t as u32 + 100, 2, ENTRY_END),
                word(7, 0, ENTRY_PAYLOAD),
                word(t as u32 + 110, 1, ENTRY_END),
                word(t as u32 + 120, 4, ENTRY_BEGIN),
                word(t as u32 + 130, 4, ENTRY_END),
            ],
            t + 131,
            true,
            0,
        );
        assert!(read(&mut ws, &b).unwrap().is_empty());
        // Two ranges forgotten at the gap, and their two ends found nothing:
        // two events lost, counted at their ends.
        assert_eq!(ws.lost, 2);
        let mut out = Vec::new();
        ws.finish(&mut out);
        assert_eq!(out, vec![range(4, t + 120, t + 130, 0)]);
    }

    /// A `switch_to` chain across a gap (the produced + 1 per gap): the
    /// range open at the gap is lost once, where its end is read, and the
    /// events whose entries were dropped are the warp's to count, not the
    /// reader's.
    #[test]
    fn a_switch_chain_across_a_gap_loses_each_range_once() {
        let t = 10_000u64;
        let lo = |d: u64| (t + d) as u32;
        let mut ws = WarpChunks::new(0);
        let a = chunk(
            &[word(lo(0), 1, ENTRY_BEGIN), word(lo(10), 2, ENTRY_SWITCH)],
            t + 11,
            false,
            0,
        );
        // Dropped by the warp (which counts its one event): switch to 1 at 20.
        let b = chunk(
            &[word(lo(30), 2, ENTRY_SWITCH), word(lo(40), 2, ENTRY_END)],
            t + 41,
            true,
            0,
        );
        assert!(read(&mut ws, &a).unwrap().is_empty());
        let got = read(&mut ws, &b).unwrap();
        let mut out = Vec::new();
        ws.finish(&mut out);
        // Made: 1 [0, 10], 2 [10, 20], 1 [20, 30], 2 [30, 40]. Delivered: the
        // first and the last; lost: 2 [10, 20] (the warp's count) and 1 [20, 30]
        // (its begin was dropped: the reader's), each once.
        assert_eq!(got, vec![range(1, t, t + 10, 0)]);
        assert_eq!(out, vec![range(2, t + 30, t + 40, 0)]);
        assert_eq!(ws.lost, 1);
    }

    #[test]
    fn a_refused_entry_leaves_the_held_event_as_it_was() {
        let t = 10_000u64;
        let lo = |d: u64| (t + d) as u32;
        let take = |ws: &mut WarpChunks, c: &[u64; 32], out: &mut Vec<Event>| {
            ws.take(c, complete(c).unwrap(), 3, |_| true, out)
        };
        // A payload entry with an id: refused, and the event it followed is lost.
        let mut ws = WarpChunks::new(0);
        let mut out = Vec::new();
        let c = chunk(
            &[
                word(lo(0), 1, ENTRY_BEGIN),
                word(lo(5), 1, ENTRY_END),
                word(9, 2, ENTRY_PAYLOAD),
            ],
            t + 6,
            false,
            0,
        );
        let e = take(&mut ws, &c, &mut out);
        assert!(matches!(e, Err(DecodeError::StrayPayload { entry: 2, .. })));
        assert_eq!(ws.finish(&mut out), 0);
        assert!(out.is_empty(), "{out:?}");
        // A switch to a range open further out: refused after closing the
        // innermost, which stays held (it goes out at the flush).
        let mut ws = WarpChunks::new(0);
        let mut out = Vec::new();
        let c = chunk(
            &[
                word(lo(0), 1, ENTRY_BEGIN),
                word(lo(1), 2, ENTRY_BEGIN),
                word(lo(3), 1, ENTRY_SWITCH),
            ],
            t + 4,
            false,
            0,
        );
        let e = take(&mut ws, &c, &mut out);
        assert!(matches!(e, Err(DecodeError::AlreadyOpen { entry: 2, .. })));
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(ws.finish(&mut out), 1);
        assert_eq!(out, vec![range(2, t + 1, t + 3, 0)]);
    }

    /// A warp silent for seconds (issue #32), its chunks ended before each
    /// silence as the recorder in watch mode ends them, each stamped at or just
    /// after its last entry: a range across the silence, a silence between two
    /// chunks and one before the flush's chunk decode whole.
    #[test]
    fn chunks_ended_before_a_silence_of_seconds_decode_whole() {
        for silence in [3_000_000_000u64, 10_000_000_000] {
            let t = (1u64 << 40) - 7;
            let lo = |t: u64| t as u32;
            let mut ws = WarpChunks::new(t - 1_000);
            // The begin, stamped with its own time.
            let a = chunk(&[word(lo(t), 1, ENTRY_BEGIN)], t, false, 0);
            assert_eq!(read(&mut ws, &a).unwrap(), vec![]);
            let end = t + silence;
            let b = chunk(
                &[
                    word(lo(end), 1, ENTRY_END),
                    word(7, 0, ENTRY_PAYLOAD),
                    word(lo(end + 5), 2, ENTRY_BEGIN),
                ],
                end + 6,
                false,
                0,
            );
            assert_eq!(
                read(&mut ws, &b).unwrap(),
                vec![range(1, t, end, 7)],
                "{silence} ns"
            );
            // Silent again between two chunks, and before the flush: the last
            // chunk stamped with its entry's time, not the flush's.
            let later = end + 5 + silence;
            let c = chunk(&[word(lo(later), 2, ENTRY_END)], later, false, 0);
            assert_eq!(read(&mut ws, &c).unwrap(), vec![]);
            let mut out = Vec::new();
            assert_eq!(ws.finish(&mut out), 0);
            assert_eq!(out, vec![range(2, end + 5, later, 0)], "{silence} ns");
            assert_eq!(ws.lost, 0);
        }
    }

    /// What a silence still breaks: entries 2³¹ ns or more apart in one chunk,
    /// or a chunk stamped that long after its last entry, are refused as before.
    #[test]
    fn a_silence_inside_a_chunk_is_still_refused() {
        let t = 1u64 << 40;
        let lo = |t: u64| t as u32;
        for silence in [1u64 << 31, 3_000_000_000] {
            let mut ws = WarpChunks::new(t - 1_000);
            let across = chunk(
                &[
                    word(lo(t), 1, ENTRY_BEGIN),
                    word(lo(t + silence), 1, ENTRY_END),
                ],
                t + silence + 1,
                false,
                0,
            );
            assert!(
                matches!(
                    read(&mut ws, &across),
                    Err(DecodeError::TimeBackwards { record: 1, .. })
                ),
                "{silence} ns"
            );
            let mut ws = WarpChunks::new(t - 1_000);
            let late = chunk(&[word(lo(t), 1, ENTRY_INSTANT)], t + silence, false, 0);
            assert!(
                matches!(
                    read(&mut ws, &late),
                    Err(DecodeError::EntryFarFromAnchor { entry: 0, .. })
                ),
                "{silence} ns"
            );
        }
        // Just under 2³¹ ns in one chunk is still read.
        let mut ws = WarpChunks::new(t - 1_000);
        let near = (1u64 << 31) - 1;
        let c = chunk(
            &[
                word(lo(t), 1, ENTRY_BEGIN),
                word(lo(t + near), 1, ENTRY_END),
            ],
            t + near + (1 << 31) - 1,
            false,
            0,
        );
        read(&mut ws, &c).unwrap();
        let mut out = Vec::new();
        ws.finish(&mut out);
        assert_eq!(out, vec![range(1, t, t + near, 0)]);
    }

    #[test]
    fn without_a_gap_the_v2_rules_hold() {
        let t = 10_000u64;
        let mut ws = WarpChunks::new(0);
        let end_first = chunk(&[word(t as u32, 1, ENTRY_END)], t + 1, false, 0);
        assert!(matches!(
            read(&mut ws, &end_first),
            Err(DecodeError::NothingOpen {
                slot: 3,
                entry: 0,
                id: 1
            })
        ));
        let mut ws = WarpChunks::new(0);
        let stray = chunk(&[word(5, 0, ENTRY_PAYLOAD)], t, false, 0);
        assert!(matches!(
            read(&mut ws, &stray),
            Err(DecodeError::StrayPayload { .. })
        ));
        let mut ws = WarpChunks::new(0);
        let twice = chunk(
            &[
                word(t as u32, 1, ENTRY_BEGIN),
                word(t as u32, 1, ENTRY_BEGIN),
            ],
            t,
            false,
            0,
        );
        assert!(matches!(
            read(&mut ws, &twice),
            Err(DecodeError::AlreadyOpen { entry: 1, .. })
        ));
        // An entry after the chunk's stamp.
        let mut ws = WarpChunks::new(0);
        let late = chunk(&[word(t as u32 + 50, 1, ENTRY_INSTANT)], t, false, 0);
        assert!(matches!(
            read(&mut ws, &late),
            Err(DecodeError::EntryFarFromAnchor { .. })
        ));
        // A chunk whose entries come before the previous chunk's.
        let mut ws = WarpChunks::new(0);
        let a = chunk(&[word(t as u32, 1, ENTRY_INSTANT)], t, false, 0);
        read(&mut ws, &a).unwrap();
        let b = chunk(&[word(t as u32 - 10, 1, ENTRY_INSTANT)], t + 5, false, 0);
        assert!(matches!(
            read(&mut ws, &b),
            Err(DecodeError::TimeBackwards { .. })
        ));
    }
}
