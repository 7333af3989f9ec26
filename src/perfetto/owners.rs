//! Which encoder thread writes each warp ([`Owners`], kept by the writer thread
//! for [`super::parallel`]).
//!
//! A warp always goes to the same encoder, so that its lanes, their sequences
//! and their clocks stay one encoder's. The encoders move together (the writer
//! waits for the oldest group until every encoder has finished it), so the one
//! with the most events sets the pace of all. A hash of the warp's place gave
//! the busiest of 12 encoders 9-17 % more than their mean on a persistent
//! kernel whose producer warps record half what its consumers do (132 blocks
//! of 4 warps), and so the layer 8-15 % less than its cores could encode.
//! Here a warp goes, the first time it is seen, to the encoder that has been
//! given the fewest events so far, counting each warp's events in every batch:
//! the shares then differ by about one warp's events of a batch. A warp first
//! seen with few events (one that had only begun when its first part was cut)
//! counts there as the batch's mean, so that such warps do not all go to one
//! encoder.

use std::collections::HashMap;

use crate::batch::Batch;
use crate::deliver::watched::Watched;
use crate::watch::State;

/// A warp: GPU ordinal, SM, linear block index, warp in its block (as
/// [`super::tracks::WarpTracks`] keys its tracks).
type WarpKey = (u32, u32, u32, u32);

/// The encoder each warp was given, and the events each encoder has had.
#[derive(Debug)]
pub(crate) struct Owners {
    by_warp: HashMap<WarpKey, u16>,
    load: Vec<u64>,
}

impl Owners {
    /// For `n` encoders (at most `u16::MAX`).
    pub(crate) fn new(n: usize) -> Owners {
        Owners {
            by_warp: HashMap::new(),
            load: vec![0; n.clamp(1, u16::MAX as usize)],
        }
    }

    /// The encoder of each slot of `b`, in slot order.
    pub(crate) fn batch(&mut self, b: &Batch) -> Box<[u16]> {
        let ordinal = b.device.ordinal;
        let cap = b.buffer.view();
        let mean = cap.event_count() / cap.slots().len().max(1) as u64;
        let owners = cap.slots().map(|slot| {
            let h = &slot.header;
            let key = (ordinal, h.sm_first, h.block_linear, h.warp);
            self.owner(key, u64::from(slot.event_count()), mean)
        });
        owners.collect()
    }

    /// The encoder of each warp of `w`'s snapshot, in its order (a warp with
    /// ranges open counts their number).
    pub(crate) fn open(&mut self, w: &Watched) -> Box<[u16]> {
        let s = &w.snapshot;
        let per_block = s.warps_per_block.max(1);
        let owners = s.warps.iter().map(|warp| {
            let key = (
                w.device.ordinal,
                warp.sm,
                warp.slot / per_block,
                warp.slot % per_block,
            );
            let open = match &warp.state {
                State::Running { open, .. } => open.len() as u64,
                _ => 0,
            };
            self.owner(key, open, 1)
        });
        owners.collect()
    }

    /// The encoder of `key`, which has `events` in the batch at hand; given
    /// now, it counts as at least `mean`.
    fn owner(&mut self, key: WarpKey, events: u64, mean: u64) -> u16 {
        let load = &mut self.load;
        let mut counts = events;
        let e = *self.by_warp.entry(key).or_insert_with(|| {
            counts = events.max(mean);
            // The first of the least loaded: ties (the first batch) go in order.
            let least = (0..load.len()).min_by_key(|&e| load[e]).unwrap_or(0);
            least as u16
        });
        load[e as usize] += counts;
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Producer warps recording half what consumers record, as the hash could
    /// not: every encoder within one warp's events of the mean, each warp kept
    /// by its encoder batch after batch.
    #[test]
    fn warps_go_to_the_least_loaded_encoder_and_stay() {
        for n in [2usize, 3, 12, 13] {
            let mut o = Owners::new(n);
            let mut first = HashMap::new();
            for _ in 0..10 {
                for block in 0..132u32 {
                    for warp in 0..4u32 {
                        let events = if warp == 0 { 1_000 } else { 2_000 };
                        let key = (0, block * 7 % 132, block, warp);
                        let e = o.owner(key, events, 0);
                        assert_eq!(*first.entry(key).or_insert(e), e, "warp moved");
                        assert!((e as usize) < n);
                    }
                }
            }
            let mean = o.load.iter().sum::<u64>() / n as u64;
            let max = *o.load.iter().max().unwrap();
            // Within one warp's events of all batches (the largest step).
            assert!(max - mean <= 10 * 2_000, "{n} encoders: {:?}", o.load);
        }
    }

    /// Warps first seen with nothing yet (the first part cut as they began)
    /// spread as if they had the batch's mean, rather than all going to the
    /// encoder that was least loaded then.
    #[test]
    fn warps_first_seen_empty_spread_too() {
        let mut o = Owners::new(4);
        // 40 warps that have recorded nothing yet, in a batch of 25 a warp.
        let first: Vec<u16> = (0..40).map(|w| o.owner((0, 0, 0, w), 0, 25)).collect();
        for e in 0..4u16 {
            let n = first.iter().filter(|&&f| f == e).count();
            assert_eq!(n, 10, "encoder {e} got {n} of 40: {first:?}");
        }
    }
}
