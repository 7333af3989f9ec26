//! Whether a snapshot agrees with the trace the warps streamed afterwards
//! (issue #32): every running warp's open ranges are the ranges of the trace that
//! were open when its cell was last written, begun at the same times, or ranges
//! the trace never closes (still open at its end); and what it closed last is the
//! trace's latest event ended by then, with the same payload. The simulated
//! device's tests check each snapshot of a persistent kernel with it; a device
//! test can check a real one's the same way. Meant for a trace that lost no
//! events: a dropped chunk takes ranges away from the trace, not from the cells.

use super::snapshot::{Snapshot, State};
use crate::format::{Event, EventKind};

/// What in `snapshot` disagrees with the trace, one line each (none: it agrees).
/// `events_of(block, warp)` is the warp's events in the whole trace delivered
/// afterwards (every part), in device ns, in the order delivered.
pub(crate) fn disagreements(
    snapshot: &Snapshot,
    events_of: impl Fn(u32, u32) -> Vec<Event>,
) -> Vec<String> {
    let mut out = Vec::new();
    let per_block = snapshot.warps_per_block.max(1);
    for w in &snapshot.warps {
        let State::Running {
            open,
            last,
            last_entry_ns,
            started_ns,
        } = &w.state
        else {
            continue;
        };
        let (block, warp) = (w.slot / per_block, w.slot % per_block);
        let events = events_of(block, warp);
        // When the cell was last written: what it tells was true then.
        let at = last_entry_ns.unwrap_or(*started_ns);
        let who = format!("snapshot {}, block {block} warp {warp}", snapshot.index);
        let ranges = || events.iter().filter(|e| e.kind == EventKind::Range);
        for o in open {
            let covering = ranges().find(|e| e.id == o.id && e.start_ns <= at && at < e.end_ns);
            match covering {
                Some(e) if e.start_ns != o.since_ns => out.push(format!(
                    "{who}: event {} open since {} ns, but the trace has it from {} to {} ns",
                    o.id, o.since_ns, e.start_ns, e.end_ns
                )),
                Some(_) => {}
                None => {
                    if let Some(e) = ranges().find(|e| e.id == o.id && e.start_ns == o.since_ns) {
                        out.push(format!(
                            "{who}: event {} open since {} ns, but the trace ends it at {} ns, before {at} ns",
                            o.id, o.since_ns, e.end_ns
                        ));
                    }
                }
            }
        }
        // The latest to end by then; of those ending together, the last delivered.
        let closed = events
            .iter()
            .filter(|e| e.end_ns <= at)
            .max_by_key(|e| e.end_ns);
        match (last, closed) {
            (None, None) => {}
            (Some(l), Some(e)) if l.id == e.id && l.payload.unwrap_or(0) == e.payload => {}
            (l, e) => out.push(format!(
                "{who}: closed last {:?}, but the trace's latest by {at} ns is {:?}",
                l.map(|l| (l.id, l.payload)),
                e.map(|e| (e.id, e.payload, e.end_ns))
            )),
        }
    }
    out
}
