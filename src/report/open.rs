//! What a launch being folded into a [`Timeline`](super::Timeline) keeps
//! between its parts (a streamed launch) or its SMs: its window, its warps, and
//! per SM the union of its ranges, each bounded whatever the launch's length.

use std::collections::{BTreeMap, HashMap};

/// Warps of a streamed launch told apart across its parts: past this many, a
/// warp not yet seen counts as a new one in each part it comes in (its events
/// and busy time are still counted once). 2²⁰ warps are 8 k blocks of 128
/// warps, about 40 MB.
pub(super) const MAX_WARPS: usize = 1 << 20;

/// Disjoint busy intervals a launch keeps over all its SMs between its parts;
/// past it, each SM's oldest are summed (see [`Busy`]). 2²⁰ intervals are 16 MB.
pub(super) const MAX_INTERVALS: usize = 1 << 20;

/// Streamed launches followed at once; past it, the one updated longest ago is
/// added with the parts it had (a later part of it then counts as a launch of
/// its own). Streamed launches are long-running kernels, a handful at a time:
/// this bounds what launches whose last part never comes can hold.
pub(super) const MAX_OPEN: usize = 1024;

/// A warp's lane before the picture gives it one.
pub(super) const NO_LANE: u32 = u32::MAX;

/// A launch being folded in.
#[derive(Debug, Clone, Default)]
pub(super) struct Open {
    /// Earliest warp start and latest warp end so far.
    pub(super) window: Option<(u64, u64)>,
    /// A streamed launch's warps so far: (block, warp) → what it was first seen with.
    pub(super) warps: HashMap<(u32, u32), Warp>,
    /// Per SM, the union of its ranges so far.
    pub(super) busy: BTreeMap<u32, Busy>,
    /// Intervals kept in `busy`, over all SMs.
    pub(super) intervals: usize,
    /// The time axis a streamed launch's parts are binned over in the picture:
    /// from its start, and as long as the first part, doubled as often as a
    /// part needs; so that a part of a long launch covers a few bins of it,
    /// not a picture's width of its own.
    pub(super) axis: Option<(u64, u64)>,
    /// When it last took a part (the timeline's count of parts then).
    pub(super) touched: u64,
}

#[cfg(test)]
impl Open {
    /// Warps and busy intervals kept.
    pub(super) fn kept(&self) -> (usize, usize) {
        (self.warps.len(), self.intervals)
    }
}

/// A warp of a streamed launch, as its first part gave it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Warp {
    /// The SM it is counted on: its first part's.
    pub(super) sm: u32,
    /// Its lane in the picture ([`NO_LANE`]: none drawn).
    pub(super) lane: u32,
    /// Whether it has been counted as migrated.
    pub(super) migrated: bool,
}

/// The time an SM had a range open during one launch: the union of its ranges,
/// kept as sorted disjoint intervals. When a launch keeps too many
/// ([`MAX_INTERVALS`]), each SM's oldest are summed into `done`, and a range that
/// a later part brings and that starts before them counts from the last of
/// them on (`horizon`): exact for a launch given whole, and for a streamed
/// launch whose ranges come in time order, as a drain delivers them, but for
/// ranges that reach back over gaps already summed.
#[derive(Debug, Clone, Default)]
pub(super) struct Busy {
    done: u64,
    horizon: u64,
    pub(super) spans: Vec<(u64, u64)>,
}

impl Busy {
    /// Adds ranges (drained from `new`): the union grows.
    pub(super) fn add(&mut self, new: &mut Vec<(u64, u64)>) {
        let horizon = self.horizon;
        new.retain_mut(|(a, b)| {
            *a = (*a).max(horizon);
            a < b
        });
        if new.is_empty() {
            return;
        }
        new.sort_unstable();
        union_in_place(new);
        // Only the kept intervals that reach the first new one can merge with
        // the new ones: ranges come mostly in time order.
        let from = self.spans.partition_point(|&(_, b)| b < new[0].0);
        let mut tail = self.spans.split_off(from);
        tail.append(new);
        tail.sort_unstable();
        union_in_place(&mut tail);
        self.spans.append(&mut tail);
    }

    /// Sums all but the newest `keep` intervals.
    pub(super) fn keep(&mut self, keep: usize) {
        let k = self.spans.len().saturating_sub(keep);
        if k == 0 {
            return;
        }
        self.done += self.spans[..k].iter().map(|(a, b)| b - a).sum::<u64>();
        self.horizon = self.spans[k - 1].1;
        self.spans.drain(..k);
    }

    pub(super) fn total(&self) -> u64 {
        let kept: u64 = self.spans.iter().map(|(a, b)| b - a).sum();
        self.done.saturating_add(kept)
    }
}

/// Makes sorted intervals disjoint, merging those that touch.
fn union_in_place(v: &mut Vec<(u64, u64)>) {
    let mut out = 0;
    for i in 0..v.len() {
        let (a, b) = v[i];
        if out > 0 && a <= v[out - 1].1 {
            v[out - 1].1 = v[out - 1].1.max(b);
        } else {
            v[out] = (a, b);
            out += 1;
        }
    }
    v.truncate(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(parts: &[&[(u64, u64)]], keep: Option<usize>) -> u64 {
        let mut b = Busy::default();
        for p in parts {
            b.add(&mut p.to_vec());
            if let Some(k) = keep {
                b.keep(k);
            }
        }
        b.total()
    }

    #[test]
    fn busy_time_is_the_union_over_parts() {
        let parts: [&[(u64, u64)]; 3] = [&[(0, 10), (20, 30)], &[(5, 25), (40, 50)], &[(0, 60)]];
        assert_eq!(total(&parts, None), 60);
        assert_eq!(total(&parts[..2], None), 40);
        // In time order, summing the oldest changes nothing.
        let ordered: [&[(u64, u64)]; 3] =
            [&[(0, 10), (20, 30)], &[(25, 35)], &[(40, 45), (50, 60)]];
        assert_eq!(total(&ordered, Some(1)), total(&ordered, None));
        assert_eq!(total(&ordered, None), 10 + 15 + 5 + 10);
        // A range that reaches back past what was summed counts from there:
        // [15, 20), a gap summed as idle, stays idle.
        let back: [&[(u64, u64)]; 2] = [&[(0, 10), (20, 30), (40, 50)], &[(15, 45)]];
        assert_eq!(total(&back, None), 10 + 35);
        assert_eq!(total(&back, Some(1)), 10 + 35 - 5);
    }
}
