//! One launch folded into a [`Timeline`]: given whole, slot by slot, or part by
//! part (a streamed launch, [`Timeline::add_part`]). A part's events are folded
//! as it comes and then dropped: what a launch keeps between its parts is its
//! window, its warps (so that a warp seen in several parts counts once, on its
//! first SM, in one lane of the picture) and, per SM, the union of its ranges so
//! far, all bounded whatever the number of its events.

use super::open::{Open, Warp, MAX_INTERVALS, MAX_WARPS, NO_LANE};
use super::picture::{Mark, Piece, FULL};
use super::{flatten, union_length, SlotRec, Timeline};
use crate::format::{Event, EventKind};

impl Timeline {
    /// Folds slots of `open` (a whole launch, or a part of a streamed one:
    /// `streamed`, its warps then followed across parts) into the statistics
    /// and the picture: one pass over them, SM by SM (`events_of` gives a
    /// slot's events). The picture bins them over their own window, as a
    /// layer of their own. The work space (one SM's events and ranges, the
    /// pieces for the picture) is dropped at the end.
    pub(super) fn fold_slots(
        &mut self,
        open: &mut Open,
        slots: &mut [SlotRec],
        streamed: bool,
        events_of: impl Fn(&SlotRec, &mut Vec<Event>),
    ) {
        let Some(t0) = slots.iter().map(|s| s.first_ts).min() else {
            return;
        };
        let t1 = slots.iter().map(|s| s.last_ts).max().unwrap_or(t0).max(t0);
        open.window = Some(match open.window {
            Some((a, b)) => (a.min(t0), b.max(t1)),
            None => (t0, t1),
        });
        let axis = match (streamed, open.axis) {
            (false, _) => (t0, t1),
            (true, None) => (t0, t1),
            (true, Some((a0, a1))) => {
                let a0 = a0.min(t0);
                let mut len = (a1 - a0).max(1);
                while a0.saturating_add(len) < t1 {
                    len = len.saturating_mul(2);
                }
                (a0, a0.saturating_add(len))
            }
        };
        open.axis = Some(axis);
        // Each slot's warp: new (counted now), or seen in an earlier part
        // (counted on its first SM, drawn in its lane).
        for s in slots.iter_mut() {
            self.dropped += u64::from(s.dropped);
            let seen = match streamed {
                true => open.warps.get_mut(&s.warp),
                false => None,
            };
            match seen {
                Some(w) => {
                    if !w.migrated && (s.migrated || s.sm != w.sm) {
                        w.migrated = true;
                        self.migrated += 1;
                    }
                    s.sm = w.sm;
                    s.lane = w.lane;
                }
                None => {
                    self.warps += 1;
                    self.sms.entry(s.sm).or_default().warps += 1;
                    self.migrated += u64::from(s.migrated);
                    if streamed && open.warps.len() < MAX_WARPS {
                        let w = Warp {
                            sm: s.sm,
                            lane: NO_LANE,
                            migrated: s.migrated,
                        };
                        open.warps.insert(s.warp, w);
                    }
                }
            }
        }
        // Ties in start go by slot order, so that lanes do not depend on the sort.
        slots.sort_unstable_by_key(|s| (s.sm, s.first_ts, s.at));
        let (mut events, mut intervals) = (Vec::new(), Vec::new());
        let (mut pieces, mut marks) = (Vec::new(), Vec::new());
        let (mut sorted, mut segments) = (Vec::new(), Vec::new());
        let mut order: Vec<(u32, usize)> = Vec::new();
        for group in slots.chunk_by(|a, b| a.sm == b.sm) {
            let sm = group[0].sm;
            // The picture's lanes, given in start order (a warp seen before
            // keeps its own); then the warps go lane by lane, so that each
            // lane's pieces come together.
            order.clear();
            match &mut self.picture {
                Some(picture) => order.extend(group.iter().enumerate().map(|(i, s)| {
                    let lane = match s.lane {
                        NO_LANE => picture.assign_lane(sm, s.first_ts, s.last_ts),
                        lane => picture.keep_lane(sm, lane, s.last_ts),
                    };
                    if let Some(w) = open.warps.get_mut(&s.warp) {
                        w.lane = lane;
                    }
                    (lane, i)
                })),
                None => order.extend((0..group.len()).map(|i| (0, i))),
            }
            order.sort_by_key(|&(lane, _)| lane);
            intervals.clear();
            let acc = self.sms.entry(sm).or_default();
            for &(lane, i) in &order {
                let s = &group[i];
                events.clear();
                events_of(s, &mut events);
                acc.events += events.len() as u64;
                self.events += events.len() as u64;
                for e in &events {
                    self.types.entry(e.id).or_default().add(e);
                }
                intervals.extend(
                    events
                        .iter()
                        .filter(|e| e.kind == EventKind::Range && e.end_ns > e.start_ns)
                        .map(|e| (e.start_ns, e.end_ns)),
                );
                if self.picture.is_some() {
                    segments.clear();
                    flatten(&events, &mut sorted, &mut segments);
                    pieces.extend(segments.iter().map(|&(a, b, k)| Piece {
                        sm,
                        lane,
                        a: a.saturating_sub(axis.0) as f64,
                        b: b.saturating_sub(axis.0) as f64,
                        k: u32::from(k),
                        w: FULL,
                    }));
                    marks.extend(
                        events
                            .iter()
                            .filter(|e| e.kind == EventKind::Instant)
                            .map(|e| Mark {
                                sm,
                                lane,
                                t: e.start_ns,
                                k: e.id,
                            }),
                    );
                }
            }
            if streamed {
                let busy = open.busy.entry(sm).or_default();
                open.intervals -= busy.spans.len();
                busy.add(&mut intervals);
                open.intervals += busy.spans.len();
                if open.intervals > MAX_INTERVALS {
                    let keep = (MAX_INTERVALS / 2 / open.busy.len()).max(1);
                    open.intervals = 0;
                    for busy in open.busy.values_mut() {
                        busy.keep(keep);
                        open.intervals += busy.spans.len();
                    }
                }
            } else {
                // A launch given whole: this SM's ranges are all here.
                acc.busy_ns = acc.busy_ns.saturating_add(union_length(&mut intervals));
            }
        }
        if let Some(picture) = &mut self.picture {
            picture.add_launch(axis, (t0, t1), pieces, marks);
        }
    }

    /// Counts a launch whose slots (or parts) have all been folded in: its
    /// window, and its SMs' busy time.
    pub(super) fn close_open(&mut self, open: Open) {
        self.launches += 1;
        let Some((t0, t1)) = open.window else {
            return;
        };
        self.window_ns = self.window_ns.saturating_add(t1 - t0);
        self.span = Some(match self.span {
            Some((a, b)) => (a.min(t0), b.max(t1)),
            None => (t0, t1),
        });
        for (sm, busy) in open.busy {
            let acc = self.sms.entry(sm).or_default();
            acc.busy_ns = acc.busy_ns.saturating_add(busy.total());
        }
    }
}
