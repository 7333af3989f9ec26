//! Which encoder thread writes which warp ([`Owners`], on the writer thread),
//! and what an encoder is told of it per batch ([`Mine`]).
//!
//! A warp always goes to the same encoder, so that its lanes, their sequences
//! and their clocks are one encoder's, batch after batch. Which one is decided
//! when the warp is first seen: the encoder with the least work so far (events
//! handed to it, and one per warp). Hashing the warp's key instead spread a
//! persistent kernel's 528 warps (1 producer at one event an iteration, 3
//! consumers at two) unevenly over 12 encoders: the busiest had 12-31 % more
//! than its share (p10-p90 over block placements), and it sets the pace of
//! all, since the writer hands out a group only when the slowest encoder has
//! finished an older one.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::host::KeyHasher;
use crate::batch::Batch;
use crate::deliver::watched::Watched;
use crate::watch::State;

/// A warp's key, as its tracks are found (`tracks::WarpTracks`: GPU ordinal,
/// SM, block, warp), packed into one word for a cheap lookup (the writer
/// thread makes one per warp of every batch). Packing may give two warps one
/// key (an ordinal past 255, an SM past 65,535, a warp past 255): they then
/// share an encoder, which is all a key decides.
fn key(ordinal: u32, sm: u32, block: u32, warp: u32) -> u64 {
    u64::from(block) << 32
        | u64::from(sm & 0xFFFF) << 16
        | u64::from(ordinal & 0xFF) << 8
        | u64::from(warp & 0xFF)
}

/// The encoder of every warp seen so far, and the work each was given.
#[derive(Debug)]
pub(crate) struct Owners {
    of: HashMap<u64, u8, BuildHasherDefault<KeyHasher>>,
    /// Per encoder: events handed to it so far, plus one per warp-batch (so
    /// that warps without events spread too).
    load: Vec<u64>,
}

impl Owners {
    /// Owners for `n` encoders (at most 256).
    pub(crate) fn new(n: usize) -> Owners {
        assert!((1..=256).contains(&n), "{n} encoders");
        Owners {
            of: HashMap::default(),
            load: vec![0; n],
        }
    }

    /// The encoder of warp `key`, which has `events` events now: the one it
    /// had, or, first seen, the one with the least work.
    fn owner(&mut self, key: u64, events: u64) -> u8 {
        let load = &mut self.load;
        let e = *self.of.entry(key).or_insert_with(|| {
            let least = (0..load.len()).min_by_key(|&e| load[e]).unwrap_or(0);
            least as u8
        });
        load[e as usize] += events + 1;
        e
    }

    /// One byte per slot of `b`, in order: the encoder that writes it.
    pub(crate) fn batch(&mut self, b: &Batch) -> Box<[u8]> {
        let ordinal = b.device.ordinal;
        b.buffer
            .view()
            .slots()
            .map(|s| {
                let h = &s.header;
                let key = key(ordinal, h.sm_first, h.block_linear, h.warp);
                self.owner(key, u64::from(s.event_count()))
            })
            .collect()
    }

    /// One byte per warp of `w`'s snapshot, in order: the encoder that writes
    /// its open ranges (0 for a warp with none, which no encoder writes).
    pub(crate) fn snapshot(&mut self, w: &Watched) -> Box<[u8]> {
        let s = &w.snapshot;
        let per_block = s.warps_per_block.max(1);
        s.warps
            .iter()
            .map(|warp| match &warp.state {
                State::Running { open, .. } if !open.is_empty() => {
                    let (block, index) = (warp.slot / per_block, warp.slot % per_block);
                    let key = key(w.device.ordinal, warp.sm, block, index);
                    self.owner(key, open.len() as u64)
                }
                _ => 0,
            })
            .collect()
    }
}

/// Which of a batch's warps (or a snapshot's) an encoder writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mine<'a> {
    /// Every one: the only encoder.
    All,
    /// Those whose entry in `owners` ([`Owners::batch`], [`Owners::snapshot`])
    /// is `encoder`.
    Of { encoder: u8, owners: &'a [u8] },
}

impl Mine<'_> {
    /// Whether the encoder writes the `i`-th warp.
    #[inline]
    pub(crate) fn owns(self, i: usize) -> bool {
        match self {
            Mine::All => true,
            Mine::Of { encoder, owners } => owners.get(i) == Some(&encoder),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A persistent kernel's warps (132 blocks of a producer at one event an
    /// iteration and three consumers at two), on SMs in any order, arrive in
    /// parts of a quarter of the warps each: every warp keeps its encoder, and
    /// no encoder gets more than its share and one warp's events.
    #[test]
    fn warps_keep_their_encoder_and_the_work_is_shared_evenly() {
        for n in [1usize, 2, 3, 8, 12] {
            let mut owners = Owners::new(n);
            let mut seen = HashMap::new();
            let mut work = vec![0u64; n];
            // SMs: a fixed shuffle (a multiplier coprime to 132).
            let sm = |b: u32| b * 97 % 132;
            for _round in 0..50 {
                for quarter in 0..4u32 {
                    for b in quarter * 33..(quarter + 1) * 33 {
                        for w in 0..4u32 {
                            let events = if w == 0 { 100 } else { 200 };
                            let e = owners.owner(key(0, sm(b), b, w), events);
                            assert_eq!(*seen.entry((b, w)).or_insert(e), e, "warp {b}/{w}");
                            work[e as usize] += events;
                        }
                    }
                }
            }
            let share = work.iter().sum::<u64>() / n as u64;
            let most = *work.iter().max().unwrap();
            // One warp's events over 50 rounds: 200 × 50.
            assert!(most <= share + 200 * 50, "{n} encoders: {work:?}");
        }
    }

    #[test]
    fn mine_says_which_warps_an_encoder_writes() {
        let owners = [0u8, 1, 1, 0];
        let of = |encoder| Mine::Of {
            encoder,
            owners: &owners,
        };
        let listed = |m: Mine| (0..5).filter(|&i| m.owns(i)).collect::<Vec<_>>();
        assert_eq!(listed(of(0)), [0, 3]);
        assert_eq!(listed(of(1)), [1, 2]);
        assert_eq!(listed(Mine::All), [0, 1, 2, 3, 4]);
    }
}
