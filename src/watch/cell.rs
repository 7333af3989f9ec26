//! One warp's watch cell read while the device may be writing it
//! (docs/format.md, "Watch cells"): the head, then the records from depth 0 up
//! to the first that is not an open range.

use super::snapshot::{Last, Open, State, Warp};
use crate::format::{
    watch_head_offsets, ENTRY_BEGIN, ENTRY_SWITCH, WATCH_CELL_SIZE, WATCH_CLOSED, WATCH_KIND_MASK,
    WATCH_MAGIC, WATCH_MAGIC_DONE, WATCH_MARK, WATCH_PAYLOAD, WATCH_RECORDS, WATCH_RECORD_SIZE,
    WATCH_SEQ_MASK, WATCH_SEQ_SHIFT,
};

/// Reads of the memory that holds the cells: one aligned `u64` at a byte offset, read
/// whole (a volatile load of mapped memory; a plain one of bytes in a test or a file).
pub(crate) trait Words {
    /// The `u64` at `offset` (a multiple of 8).
    fn word(&self, offset: usize) -> u64;
}

impl Words for [u8] {
    fn word(&self, offset: usize) -> u64 {
        u64::from_le_bytes(self[offset..offset + 8].try_into().expect("8 bytes"))
    }
}

/// How often a record that changed between two reads is read again: the device
/// writes a record with one 16-byte store, which the host reads as two words.
const READS: usize = 4;

/// One record: its two words, read until two reads agree (a record being
/// rewritten now is taken as last read).
fn record(mem: &(impl Words + ?Sized), at: usize) -> (u64, u64) {
    let mut r = (mem.word(at), mem.word(at + 8));
    for _ in 1..READS {
        let again = (mem.word(at), mem.word(at + 8));
        if again == r {
            break;
        }
        r = again;
    }
    r
}

/// A 48-bit stamp made whole: the 64-bit time with those low bits nearest to
/// `reference` (the warp's start; its stamps are within 2⁴⁷ ns, 39 hours, of it).
fn unwrap48(t48: u64, reference: u64) -> u64 {
    const SPAN: u64 = 1 << 48;
    let t = (reference & !(SPAN - 1)) | (t48 & (SPAN - 1));
    if t.saturating_sub(reference) > SPAN / 2 && t >= SPAN {
        t - SPAN
    } else if reference.saturating_sub(t) > SPAN / 2 {
        t + SPAN
    } else {
        t
    }
}

/// One watch record, parsed.
struct Record {
    time: u64,
    seq: u16,
    kind: u16,
    event: u16,
    last: Option<Last>,
}

impl Record {
    /// Whether it was written after `other`: a later stamp, or the same stamp and a later
    /// entry (the counts differ by less than half their range: a timer tick holds far
    /// fewer than 512 entries).
    fn after(&self, other: &Record) -> bool {
        let ahead = self.seq.wrapping_sub(other.seq) & WATCH_SEQ_MASK;
        self.time > other.time
            || (self.time == other.time && ahead != 0 && ahead <= WATCH_SEQ_MASK / 2)
    }
}

/// The SM and state of the warp whose cell starts at `at`.
fn read_cell(mem: &(impl Words + ?Sized), at: usize) -> (u32, State) {
    let head = record(mem, at + watch_head_offsets::MAGIC);
    let (magic, sm, started) = (head.0 as u32, (head.0 >> 32) as u32, head.1);
    match magic {
        WATCH_MAGIC => {}
        WATCH_MAGIC_DONE => return (sm, State::Done { at_ns: started }),
        _ => return (0, State::NotStarted),
    }
    let mut open = Vec::new();
    // The latest record written: it tells what the warp closed last.
    let mut newest: Option<Record> = None;
    for depth in 0..WATCH_RECORDS {
        let (w0, w1) = record(mem, at + WATCH_RECORD_SIZE * (depth + 1));
        let flags = (w0 >> 48) as u16;
        if flags & WATCH_MARK == 0 {
            break;
        }
        let r = Record {
            time: unwrap48(w0 & ((1 << 48) - 1), started),
            seq: (flags >> WATCH_SEQ_SHIFT) & WATCH_SEQ_MASK,
            kind: flags & WATCH_KIND_MASK,
            event: w1 as u16,
            last: (flags & WATCH_CLOSED != 0).then_some(Last {
                id: (w1 >> 16) as u16,
                payload: (flags & WATCH_PAYLOAD != 0).then_some((w1 >> 32) as u32),
            }),
        };
        let opens = r.kind == ENTRY_BEGIN || r.kind == ENTRY_SWITCH;
        if opens {
            open.push(Open {
                id: r.event,
                since_ns: r.time,
            });
        }
        if newest.as_ref().is_none_or(|n| r.after(n)) {
            newest = Some(r);
        }
        // Above the open ranges: an end or an instant (or nothing) ends them.
        if !opens {
            break;
        }
    }
    (
        sm,
        State::Running {
            open,
            last: newest.as_ref().and_then(|n| n.last),
            last_entry_ns: newest.map(|n| n.time),
            started_ns: started,
        },
    )
}

/// Where a launch's watch cells are: `slots` cells from byte `at` of a memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cells {
    pub(crate) at: usize,
    pub(crate) slots: u32,
}

impl Cells {
    /// Every warp's cell, read now.
    pub(crate) fn read(&self, mem: &(impl Words + ?Sized)) -> Vec<Warp> {
        (0..self.slots)
            .map(|slot| {
                let (sm, state) = read_cell(mem, self.at + slot as usize * WATCH_CELL_SIZE);
                Warp { slot, sm, state }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_unwrap_near_the_reference() {
        let r = (5u64 << 48) + 100;
        assert_eq!(unwrap48(200, r), (5 << 48) + 200);
        // Just past a wrap of the low 48 bits.
        assert_eq!(unwrap48(3, (5 << 48) - 10), (5 << 48) + 3);
        // Just before the reference, across a wrap.
        assert_eq!(unwrap48((1 << 48) - 5, (5 << 48) + 10), (5 << 48) - 5);
        assert_eq!(unwrap48(7, 0), 7);
    }
}
