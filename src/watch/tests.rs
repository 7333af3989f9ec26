//! The watch cells as the device writes them (`WarpSim`, which the collector's
//! simulated device uses too), read back and told.

use super::snapshot::{Last, Open, State};
use super::summary::MAX_GROUPS;
use super::{Cells, Snapshot};
use crate::format::{
    ENTRY_BEGIN, ENTRY_END, ENTRY_INSTANT, ENTRY_SWITCH, WATCH_CELL_SIZE, WATCH_CLOSED,
    WATCH_MAGIC, WATCH_MAGIC_DONE, WATCH_MARK, WATCH_PAYLOAD, WATCH_RECORD_SIZE, WATCH_SEQ_MASK,
    WATCH_SEQ_SHIFT,
};
use crate::registry::EventRegistry;

/// One warp's recorder in watch mode, as the header's v2 recorder writes its cell (see
/// `watch_next` and `watch_stamp_if` there): the head at the start and at the flush, and
/// a record per entry at the depth its kind says, carrying the entry count and what the
/// warp closed last. Each write is a word given to `store` (offset, value).
pub(crate) struct WarpSim {
    at: usize,
    depth: usize,
    seq: u16,
    /// What the warp closed last: its id and payload.
    last: Option<(u16, Option<u32>)>,
}

/// Where the simulated device writes: one `u64` at a byte offset.
pub(crate) type Store<'a> = &'a mut dyn FnMut(usize, u64);

impl WarpSim {
    /// The warp of slot `slot` starts on `sm` at `t`: its head, in the cells at `cells`.
    pub(crate) fn start(cells: usize, slot: u32, sm: u32, t: u64, store: Store) -> WarpSim {
        let at = cells + slot as usize * WATCH_CELL_SIZE;
        store(at, WATCH_MAGIC as u64 | (sm as u64) << 32);
        store(at + 8, t);
        WarpSim {
            at,
            depth: 0,
            seq: 0,
            last: None,
        }
    }

    /// The entry's record at `depth`; a closing entry (`closed`) is the warp's last close
    /// from its own record on.
    fn entry(
        &mut self,
        depth: usize,
        kind: u16,
        event: u16,
        closed: Option<(u16, Option<u32>)>,
        t: u64,
        store: Store,
    ) {
        if closed.is_some() {
            self.last = closed;
        }
        let (closed_id, payload) = self.last.unwrap_or((0, None));
        let flags = WATCH_MARK
            | kind
            | (self.seq & WATCH_SEQ_MASK) << WATCH_SEQ_SHIFT
            | if self.last.is_some() { WATCH_CLOSED } else { 0 }
            | if payload.is_some() { WATCH_PAYLOAD } else { 0 };
        self.seq = self.seq.wrapping_add(1);
        let at = self.at + WATCH_RECORD_SIZE * (depth + 1);
        store(at, (t & ((1 << 48) - 1)) | (flags as u64) << 48);
        store(
            at + 8,
            event as u64 | (closed_id as u64) << 16 | (payload.unwrap_or(0) as u64) << 32,
        );
    }

    pub(crate) fn begin(&mut self, id: u16, t: u64, store: Store) {
        self.entry(self.depth, ENTRY_BEGIN, id, None, t, store);
        self.depth += 1;
    }

    pub(crate) fn end(&mut self, id: u16, payload: Option<u32>, t: u64, store: Store) {
        self.depth -= 1;
        self.entry(self.depth, ENTRY_END, id, Some((id, payload)), t, store);
    }

    pub(crate) fn switch(
        &mut self,
        from: u16,
        to: u16,
        payload: Option<u32>,
        t: u64,
        store: Store,
    ) {
        self.entry(
            self.depth - 1,
            ENTRY_SWITCH,
            to,
            Some((from, payload)),
            t,
            store,
        );
    }

    pub(crate) fn instant(&mut self, id: u16, payload: Option<u32>, t: u64, store: Store) {
        self.entry(self.depth, ENTRY_INSTANT, id, Some((id, payload)), t, store);
    }

    /// The flush: the head says done.
    pub(crate) fn done(self, sm: u32, t: u64, store: Store) {
        store(self.at, WATCH_MAGIC_DONE as u64 | (sm as u64) << 32);
        store(self.at + 8, t);
    }
}

/// Cells in a byte buffer, written through `WarpSim`.
pub(crate) struct Board(pub(crate) Vec<u8>);

impl Board {
    pub(crate) fn new(slots: u32) -> Board {
        Board(vec![0; slots as usize * WATCH_CELL_SIZE])
    }

    pub(crate) fn store(&mut self) -> impl FnMut(usize, u64) + '_ {
        |at, v| self.0[at..at + 8].copy_from_slice(&v.to_le_bytes())
    }
}

const LOAD: u16 = 1;
const WAIT: u16 = 2;
const MAIN: u16 = 3;
const CLAIM: u16 = 4;
const S: u64 = 1_000_000_000;

pub(crate) fn registry() -> EventRegistry {
    EventRegistry::from_pairs([
        (LOAD, "load"),
        (WAIT, "wait"),
        (MAIN, "mainloop"),
        (CLAIM, "claim"),
    ])
    .unwrap()
    .with_payload(LOAD, "k_tile")
    .unwrap()
}

pub(crate) fn snapshot(board: &Board, slots: u32, warps_per_block: u32, now_ns: u64) -> Snapshot {
    Snapshot {
        launch_id: 7,
        kernel: "pipeline".into(),
        grid: [slots / warps_per_block, 1, 1],
        warps_per_block,
        now_ns,
        running_ns: 3 * S,
        index: 0,
        warps: Cells { at: 0, slots }.read(&board.0[..]),
    }
}

fn running(b: &Board) -> (Vec<Open>, Option<Last>, Option<u64>) {
    let warps = Cells { at: 0, slots: 1 }.read(&b.0[..]);
    match &warps[0].state {
        State::Running {
            open,
            last,
            last_entry_ns,
            ..
        } => (open.clone(), *last, *last_entry_ns),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cell_tells_open_ranges_and_what_closed_last() {
    let mut b = Board::new(1);
    let mut st = b.store();
    let mut w = WarpSim::start(0, 0, 12, 100, &mut st);
    drop(st);
    assert_eq!(running(&b), (vec![], None, None));
    let mut st = b.store();
    w.begin(MAIN, 110, &mut st);
    w.begin(LOAD, 120, &mut st);
    w.switch(LOAD, WAIT, Some(17), 130, &mut st);
    drop(st);
    let warps = Cells { at: 0, slots: 1 }.read(&b.0[..]);
    assert_eq!(warps[0].sm, 12);
    assert_eq!(
        running(&b),
        (
            vec![
                Open {
                    id: MAIN,
                    since_ns: 110
                },
                Open {
                    id: WAIT,
                    since_ns: 130
                }
            ],
            Some(Last {
                id: LOAD,
                payload: Some(17)
            }),
            Some(130)
        )
    );
    assert_eq!(warps[0].since_ns(), Some(130));

    // The wait ends, a range opens and closes, another opens at the same depth: the
    // stale records above the open ones are not read as open, and what closed last
    // stays known after the begin that followed it.
    let mut st = b.store();
    w.end(WAIT, None, 140, &mut st);
    w.begin(LOAD, 150, &mut st);
    w.begin(CLAIM, 155, &mut st);
    w.end(CLAIM, Some(3), 160, &mut st);
    w.end(LOAD, Some(18), 170, &mut st);
    w.begin(LOAD, 175, &mut st);
    drop(st);
    assert_eq!(
        running(&b),
        (
            vec![
                Open {
                    id: MAIN,
                    since_ns: 110
                },
                Open {
                    id: LOAD,
                    since_ns: 175
                }
            ],
            Some(Last {
                id: LOAD,
                payload: Some(18)
            }),
            Some(175)
        )
    );
    // An end without a payload, then an instant above the open range: the instant is
    // the last thing done; it opens nothing.
    let mut st = b.store();
    w.end(LOAD, None, 180, &mut st);
    w.instant(CLAIM, Some(9), 190, &mut st);
    drop(st);
    assert_eq!(
        running(&b),
        (
            vec![Open {
                id: MAIN,
                since_ns: 110
            }],
            Some(Last {
                id: CLAIM,
                payload: Some(9)
            }),
            Some(190)
        )
    );
    // Stamped at one timer value, the later entry still wins (by the count): an end
    // and a begin in the same tick.
    let mut st = b.store();
    w.begin(LOAD, 200, &mut st);
    w.end(LOAD, Some(1), 200, &mut st);
    drop(st);
    assert_eq!(
        running(&b).0,
        vec![Open {
            id: MAIN,
            since_ns: 110
        }]
    );
    assert_eq!(
        running(&b).1,
        Some(Last {
            id: LOAD,
            payload: Some(1)
        })
    );
    let mut st = b.store();
    w.switch(MAIN, WAIT, None, 200, &mut st);
    drop(st);
    assert_eq!(
        running(&b).1,
        Some(Last {
            id: MAIN,
            payload: None
        })
    );
    let mut st = b.store();
    w.done(3, 300, &mut st);
    drop(st);
    assert_eq!(
        Cells { at: 0, slots: 1 }.read(&b.0[..])[0].state,
        State::Done { at_ns: 300 }
    );
}

#[test]
fn stamps_past_32_bits_keep_their_high_bits() {
    // A run whose clock is past 2^32 ns (4.3 s) and past 2^48 at the warp's start.
    let start = (3u64 << 48) - 5 * S;
    let mut b = Board::new(1);
    let mut st = b.store();
    let mut w = WarpSim::start(0, 0, 0, start, &mut st);
    w.begin(MAIN, start + 10 * S, &mut st);
    drop(st);
    assert_eq!(
        snapshot(&b, 1, 1, 0).warps[0].since_ns(),
        Some(start + 10 * S)
    );
}

/// The pipeline: 2 blocks of 4 warps run, one of them a producer stuck in
/// load; one block is done, one never started.
pub(crate) fn pipeline() -> Board {
    let mut b = Board::new(16);
    let mut st = b.store();
    for slot in 0..8 {
        let mut w = WarpSim::start(0, slot, slot / 4, S, &mut st);
        w.begin(MAIN, S + 10, &mut st);
        if slot == 5 {
            // The producer of block 1: loading k-tile 18 since it loaded 17.
            w.begin(LOAD, S + 20, &mut st);
            w.end(LOAD, Some(17), S + 30, &mut st);
            w.begin(LOAD, S + 40, &mut st);
        } else {
            w.begin(LOAD, S + 20, &mut st);
            w.switch(LOAD, WAIT, Some(17), S + 30 + slot as u64, &mut st);
        }
    }
    for slot in 8..12 {
        let mut w = WarpSim::start(0, slot, 2, S, &mut st);
        w.begin(MAIN, S + 1, &mut st);
        w.end(MAIN, Some(1), S + 2, &mut st);
        w.done(2, S + 3, &mut st);
    }
    drop(st);
    b
}

#[test]
fn warps_group_by_what_they_do_longest_first() {
    let snap = snapshot(&pipeline(), 16, 4, 4 * S + 100);
    let groups = snap.groups();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!(groups[0].open, [MAIN, WAIT]);
    assert_eq!(groups[0].warps, 7);
    // Since when: each warp's switch; the longest and the shortest of them.
    assert_eq!(groups[0].longest_ns, 3 * S + 70);
    assert_eq!(groups[0].shortest_ns, 3 * S + 63);
    assert_eq!(groups[1].open, [MAIN, LOAD]);
    assert_eq!(groups[1].warps, 1);
    assert_eq!(groups[1].longest_ns, 3 * S + 60);
    assert_eq!(
        groups[1].last.map(|l| (l.id, l.payload)),
        Some((LOAD, Some(17)))
    );
    let blocks = snap.blocks();
    assert_eq!(
        (
            blocks.running,
            blocks.done,
            blocks.never_started,
            blocks.warps_done
        ),
        (2, 1, 1, 0)
    );
    let text = snap.text(&registry());
    let expected =
        "launch 7 (pipeline, grid 4x1x1, 4 warps per block) still running after 3.0 s:\n  \
                    7 warps in mainloop > wait for 3.0 s, after load (k_tile 17)\n  \
                    1 warp in mainloop > load for 3.0 s, after load (k_tile 17)\n  \
                    1 block never started; 1 block done";
    assert_eq!(text, expected);
}

#[test]
fn many_groups_are_cut_and_counted() {
    let slots = MAX_GROUPS as u32 + 5;
    let mut b = Board::new(slots);
    let mut st = b.store();
    for slot in 0..slots {
        let mut w = WarpSim::start(0, slot, 0, S, &mut st);
        w.begin(LOAD, S, &mut st);
        w.end(LOAD, Some(slot), S + slot as u64, &mut st);
    }
    drop(st);
    let text = snapshot(&b, slots, 1, 2 * S).text(&registry());
    assert_eq!(text.lines().count(), 1 + MAX_GROUPS + 1, "{text}");
    assert!(text.ends_with("and 5 more groups (5 warps)"), "{text}");
    assert!(
        text.contains("1 warp between ranges for 1.0 s, after load (k_tile 0)"),
        "{text}"
    );
}

#[test]
fn counts_and_durations_read_well() {
    use super::summary::{count, duration};
    assert_eq!(count(1, "warp"), "1 warp");
    assert_eq!(count(1055, "warp"), "1,055 warps");
    assert_eq!(count(1_234_567, "block"), "1,234,567 blocks");
    assert_eq!(duration(80), "80 ns");
    assert_eq!(duration(12_400), "12 µs");
    assert_eq!(duration(999_999_999), "1.0 s");
    assert_eq!(duration(250_000_000), "250 ms");
    assert_eq!(duration(3_100_000_000), "3.1 s");
}
