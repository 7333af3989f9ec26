//! The kernel slice of a launch delivered in parts ([`crate::batch::Part`]).
//!
//! Each part's warps are written as the part arrives (they land on the same
//! warp tracks whatever the part: a warp's tracks are keyed by GPU, SM, block
//! and warp, and each warp has one encoder). The kernel slice is drawn once,
//! at the last part, over what every part recorded, as the slice of the same
//! launch delivered whole would be: so until then each launch arriving in parts
//! keeps a small summary here, which its last part removes.

use std::collections::{HashMap, HashSet};

use crate::batch::Part;

/// Launches with parts still to come that are summed up at once; past that,
/// the one updated longest ago is forgotten (its kernel slice, if its last
/// part ever comes, covers only the parts after that). Streamed launches are
/// long-running kernels, a handful at a time: this bounds what a launch whose
/// last part never comes (its run ended first) can hold.
pub(crate) const MAX_ARRIVING: usize = 1024;

/// What a kernel slice says of its launch: its extent on the trace clock
/// (`None`: nothing recorded) and its counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct KernelSum {
    pub(crate) extent: Option<(u64, u64)>,
    pub(crate) events: u64,
    pub(crate) warps: u64,
    pub(crate) events_lost: u64,
}

/// One launch arriving in parts: its parts so far.
#[derive(Debug)]
struct Arriving {
    sum: KernelSum,
    /// The warps (block, warp) seen: a warp is in many parts, counted once.
    warps: HashSet<(u32, u32)>,
    /// When it was last updated (parts taken so far, all launches).
    touched: u64,
}

/// The launches arriving in parts, by launch id.
#[derive(Debug, Default)]
pub(crate) struct LaunchParts {
    open: HashMap<u64, Arriving>,
    parts: u64,
}

impl LaunchParts {
    /// Adds part `part` of launch `launch_id` (`sum`: the part's own, its
    /// `warps` unused; `warps`: its warps). Returns the launch's sum at its last
    /// part, `None` before.
    pub(crate) fn add(
        &mut self,
        launch_id: u64,
        part: Part,
        sum: KernelSum,
        warps: impl Iterator<Item = (u32, u32)>,
    ) -> Option<KernelSum> {
        self.parts += 1;
        if !self.open.contains_key(&launch_id) && self.open.len() >= MAX_ARRIVING {
            let stalest = self.open.iter().min_by_key(|(_, s)| s.touched);
            if let Some(&id) = stalest.map(|(id, _)| id) {
                self.open.remove(&id);
            }
        }
        let s = self.open.entry(launch_id).or_insert_with(|| Arriving {
            sum: KernelSum::default(),
            warps: HashSet::new(),
            touched: 0,
        });
        s.touched = self.parts;
        s.warps.extend(warps);
        let t = &mut s.sum;
        t.extent = match (t.extent, sum.extent) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (a, b) => a.or(b),
        };
        t.events += sum.events;
        t.events_lost += sum.events_lost;
        if !part.last {
            return None;
        }
        let s = self.open.remove(&launch_id)?;
        Some(KernelSum {
            warps: s.warps.len() as u64,
            ..s.sum
        })
    }

    /// What the parts of launch `launch_id` delivered so far sum up to, if its
    /// last part has not come.
    pub(crate) fn arriving(&self, launch_id: u64) -> Option<&KernelSum> {
        self.open.get(&launch_id).map(|a| &a.sum)
    }

    /// Launches arriving in parts now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(index: u32, last: bool) -> Part {
        Part { index, last }
    }

    #[test]
    fn parts_sum_up_at_the_last_and_are_forgotten_then() {
        let mut s = LaunchParts::default();
        let sum = |a, b, events| KernelSum {
            extent: Some((a, b)),
            events,
            warps: 0,
            events_lost: 1,
        };
        assert!(s
            .add(
                7,
                part(0, false),
                sum(100, 200, 3),
                [(0, 0), (0, 1)].into_iter()
            )
            .is_none());
        assert!(s
            .add(7, part(1, false), KernelSum::default(), [].into_iter())
            .is_none());
        let k = s
            .add(
                7,
                part(2, true),
                sum(150, 400, 2),
                [(0, 1), (1, 0)].into_iter(),
            )
            .unwrap();
        assert_eq!(k.extent, Some((100, 400)));
        assert_eq!((k.events, k.warps, k.events_lost), (5, 3, 2));
        assert_eq!(s.len(), 0, "the last part frees the launch");
    }

    #[test]
    fn launches_whose_last_part_never_comes_are_bounded() {
        let mut s = LaunchParts::default();
        for id in 0..(MAX_ARRIVING as u64 * 3) {
            s.add(
                id,
                part(0, false),
                KernelSum::default(),
                [(0, 0)].into_iter(),
            );
        }
        assert_eq!(s.len(), MAX_ARRIVING);
        // The newest are kept.
        let k = s.add(
            MAX_ARRIVING as u64 * 3 - 1,
            part(1, true),
            KernelSum::default(),
            [].into_iter(),
        );
        assert_eq!(k.unwrap().warps, 1);
    }
}
