//! Which encoder thread writes each warp ([`Owners`], one copy in each encoder
//! of [`super::parallel`]).
//!
//! A warp always goes to the same encoder, so that its lanes, their sequences
//! and their clocks stay one encoder's. The encoders move together (the writer
//! waits for the oldest group until every encoder has finished it), so the one
//! with the most events sets the pace of all. A hash of the warp's place gave
//! the busiest of 12 encoders 9-17 % more than their mean on a persistent
//! kernel whose producer warps record half what its consumers do (132 blocks
//! of 4 warps; a model of the hash, which the threads' CPU time on an H100
//! host bore out: the busiest about 1.2× the mean).
//! Here a warp goes, the first time it is seen, to the encoder that has been
//! given the fewest events so far, counting each warp's events in every batch:
//! the shares then differ by about one warp's events of a batch. A warp first
//! seen with few events (one that had only begun when its first part was cut)
//! counts there as the batch's mean, so that such warps do not all go to one
//! encoder.
//!
//! Every encoder is handed every batch, in the same order, and looks at every
//! warp of it: each keeps its own copy of the choice and they all agree, with
//! no lock between them and nothing more for the writer thread, which a storm
//! of short launches keeps busy (there, a pass over each batch's slots on the
//! writer thread cost it half again its work).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::host::KeyHasher;

/// A warp: GPU ordinal, SM, linear block index and warp in its block (as
/// [`super::tracks::WarpTracks`] keys its tracks), 32 bits each from the top.
pub(crate) type WarpKey = u128;

pub(crate) fn warp_key(ordinal: u32, sm: u32, block: u32, warp: u32) -> WarpKey {
    u128::from(ordinal) << 96 | u128::from(sm) << 64 | u128::from(block) << 32 | u128::from(warp)
}

/// One encoder's copy: the encoder each warp was given, and the events each
/// encoder has had.
#[derive(Debug)]
pub(crate) struct Owners {
    /// Hashed with a multiply a word: std's SipHash took some 400
    /// instructions a warp of a batch.
    by_warp: HashMap<WarpKey, u16, BuildHasherDefault<KeyHasher>>,
    load: Vec<u64>,
    /// The encoder this copy is for.
    index: u16,
}

impl Owners {
    /// Encoder `index`'s copy, of `n` encoders (at most `u16::MAX`).
    pub(crate) fn new(index: usize, n: usize) -> Owners {
        Owners {
            by_warp: HashMap::default(),
            load: vec![0; n.clamp(1, u16::MAX as usize)],
            index: index as u16,
        }
    }

    /// Whether this encoder writes warp `key`, which has `events` in the batch
    /// at hand (given now, it counts as at least `mean`). Called for every warp
    /// of every batch, in order, by every encoder.
    pub(crate) fn mine(&mut self, key: WarpKey, events: u64, mean: u64) -> bool {
        self.owner(key, events, mean) == self.index
    }

    fn owner(&mut self, key: WarpKey, events: u64, mean: u64) -> u16 {
        let (e, counts) = match self.by_warp.entry(key) {
            Entry::Occupied(o) => (*o.get(), events),
            Entry::Vacant(v) => {
                // The first of the least loaded: ties (the first batch) go in order.
                let load = &self.load;
                let least = (0..load.len()).min_by_key(|&e| load[e]).unwrap_or(0) as u16;
                (*v.insert(least), events.max(mean))
            }
        };
        self.load[e as usize] += counts;
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Producer warps recording half what consumers record, as the hash could
    /// not: every encoder within one warp's events of the mean, each warp kept
    /// by its encoder batch after batch, and every copy agreeing (each warp
    /// exactly one encoder's).
    #[test]
    fn warps_go_to_the_least_loaded_encoder_and_stay() {
        for n in [2usize, 3, 12, 13] {
            let mut copies: Vec<Owners> = (0..n).map(|i| Owners::new(i, n)).collect();
            let mut first = HashMap::new();
            for _ in 0..10 {
                for block in 0..132u32 {
                    for warp in 0..4u32 {
                        let events = if warp == 0 { 1_000 } else { 2_000 };
                        let key = warp_key(0, block * 7 % 132, block, warp);
                        let mine: Vec<usize> =
                            (0..n).filter(|&i| copies[i].mine(key, events, 0)).collect();
                        assert_eq!(mine.len(), 1, "warp {block}/{warp}: {mine:?}");
                        assert_eq!(*first.entry(key).or_insert(mine[0]), mine[0], "warp moved");
                    }
                }
            }
            let load = &copies[0].load;
            assert!(copies.iter().all(|c| &c.load == load));
            let mean = load.iter().sum::<u64>() / n as u64;
            let max = *load.iter().max().unwrap();
            // Within one warp's events of all batches (the largest step).
            assert!(max - mean <= 10 * 2_000, "{n} encoders: {load:?}");
        }
    }

    /// Warps of 1,000 blocks of 4 warps on 132 SMs, each block on each SM
    /// (many launches of one kernel): no two hash alike.
    #[test]
    fn warp_keys_hash_apart() {
        use std::hash::BuildHasher;
        let hasher = BuildHasherDefault::<KeyHasher>::default();
        let mut seen = std::collections::HashSet::new();
        for sm in 0..132 {
            for block in 0..1_000 {
                for warp in 0..4 {
                    let h = hasher.hash_one(warp_key(0, sm, block, warp));
                    assert!(seen.insert(h), "SM {sm} block {block} warp {warp}");
                }
            }
        }
    }

    /// Warps first seen with nothing yet (the first part cut as they began)
    /// spread as if they had the batch's mean, rather than all going to the
    /// encoder that was least loaded then.
    #[test]
    fn warps_first_seen_empty_spread_too() {
        let mut o = Owners::new(0, 4);
        // 40 warps that have recorded nothing yet, in a batch of 25 a warp.
        let first: Vec<u16> = (0..40)
            .map(|w| o.owner(warp_key(0, 0, 0, w), 0, 25))
            .collect();
        for e in 0..4u16 {
            let n = first.iter().filter(|&&f| f == e).count();
            assert_eq!(n, 10, "encoder {e} got {n} of 40: {first:?}");
        }
    }
}
