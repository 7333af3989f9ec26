//! Sampling (docs/format.md, "Sampling"): which launches, blocks and warps
//! record. The kernel argument carries it (the device reads the blocks and
//! warps, once per warp, at its recorder's construction), and a sampled
//! buffer's header carries it, so that a reader knows what the slots cover and
//! maps each slot back to its block and warp. This file is the host's one copy
//! of the device's rule (`detail::sampled_slot` in the header).

/// [`BufferHeader::flags`](super::BufferHeader::flags) bit: the buffer is sampled;
/// its header is [`SAMPLED_HEADER_SIZE`] bytes, the last 64 its [`Sampling`]
/// (at [`sampling_offsets`], the rest zero), and its slots follow.
pub const BUFFER_FLAG_SAMPLED: u32 = 2;
/// The header size of a sampled buffer: the 64-byte header, then 64 bytes of sampling.
pub const SAMPLED_HEADER_SIZE: usize = 128;

/// Byte offsets of a sampled buffer's sampling, the same four `u32` as in the
/// kernel argument.
pub mod sampling_offsets {
    /// `u32` [`Sampling::warp_mask`](super::Sampling::warp_mask).
    pub const WARP_MASK: usize = 64;
    /// `u32` [`Sampling::block_stride`](super::Sampling::block_stride).
    pub const BLOCK_STRIDE: usize = 68;
    /// `u32` [`Sampling::block_offset`](super::Sampling::block_offset).
    pub const BLOCK_OFFSET: usize = 72;
    /// `u32` [`Sampling::launch_every`](super::Sampling::launch_every).
    pub const LAUNCH_EVERY: usize = 76;
    /// Zero from here to the end of the header.
    pub const RESERVED: usize = 80;
}

/// Which launches, blocks and warps record; the default records everything.
///
/// A launch that is sampled gets slots only for the warps that record, so
/// that the same memory holds more events per warp: warp `w` of block `b`
/// records when `b ≥ block_offset`, `(b − block_offset)` is a multiple of
/// `block_stride`, and bit `w` of `warp_mask` is set (a zero mask: every
/// warp). It is carried in the kernel argument and in the buffer's header,
/// and every output says it, so that a statistic over the sampled warps is
/// not taken for the whole kernel's.
///
/// ```
/// use tracing_gpu::format::Sampling;
/// // Warp 0 of each warpgroup (warps 0, 4, 8), every 4th block from block 1.
/// let s = Sampling::default().warps(0x111).blocks(4, 1);
/// assert_eq!(s.slot_of(5, 4, 12), Some(4)); // block 5 is the 2nd sampled, warp 4 its 2nd
/// assert_eq!(s.place(4, 12), Some((5, 4)));
/// assert_eq!(s.slot_of(2, 4, 12), None);
/// assert_eq!(s.describe(12), "3 of 12 warps per block (mask 0x111), 1 block in 4 from block 1");
/// ```
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sampling {
    /// The warps of each sampled block that record (bit `w`: warp `w`); 0: every warp.
    pub warp_mask: u32,
    /// Every `block_stride`-th block records (its linear index), from
    /// `block_offset` on; 0 or 1: every block.
    pub block_stride: u32,
    /// The first block that records.
    pub block_offset: u32,
    /// One launch in `launch_every` records (0 or 1: every launch). The host
    /// decides, and an unsampled launch gets no buffer; the device does not
    /// read it.
    pub launch_every: u32,
}

impl Sampling {
    /// Only the warps of `mask` (bit `w`: warp `w` of each block; 0: every warp).
    #[must_use]
    pub fn warps(self, mask: u32) -> Self {
        Sampling {
            warp_mask: mask,
            ..self
        }
    }

    /// Only every `stride`-th block, from block `offset` on (linear indices).
    #[must_use]
    pub fn blocks(self, stride: u32, offset: u32) -> Self {
        Sampling {
            block_stride: stride,
            block_offset: offset,
            ..self
        }
    }

    /// Only one launch in `n`.
    #[must_use]
    pub fn launches(self, n: u32) -> Self {
        Sampling {
            launch_every: n,
            ..self
        }
    }

    /// Whether it records everything: every launch, block and warp.
    pub fn is_all(&self) -> bool {
        self.warp_mask == 0
            && self.block_stride <= 1
            && self.block_offset == 0
            && self.launch_every <= 1
    }

    fn stride(&self) -> u32 {
        self.block_stride.max(1)
    }

    /// The warps that record in a block of `warps_per_block` warps, as a mask.
    pub fn warp_mask_of(&self, warps_per_block: u32) -> u32 {
        let mask = if self.warp_mask == 0 {
            u32::MAX
        } else {
            self.warp_mask
        };
        match warps_per_block {
            0..=31 => mask & ((1u32 << warps_per_block) - 1),
            _ => mask,
        }
    }

    /// How many warps of a block of `warps_per_block` record.
    pub fn warps_per_block(&self, warps_per_block: u32) -> u32 {
        // Without a mask, every warp of a block of any size (a buffer may say
        // more than the 32 a CUDA block has).
        match self.warp_mask {
            0 => warps_per_block,
            _ => self.warp_mask_of(warps_per_block).count_ones(),
        }
    }

    /// How many of a grid's `blocks` record.
    pub fn blocks_of(&self, blocks: u64) -> u64 {
        let offset = u64::from(self.block_offset);
        match blocks > offset {
            true => (blocks - offset - 1) / u64::from(self.stride()) + 1,
            false => 0,
        }
    }

    /// The slots a launch of `blocks` blocks of `warps_per_block` warps needs: one per
    /// warp that records.
    pub fn slots(&self, blocks: u64, warps_per_block: u32) -> u64 {
        self.blocks_of(blocks) * u64::from(self.warps_per_block(warps_per_block))
    }

    /// The slot of warp `warp` of block `block_linear`, if it records (no bound on
    /// the grid): the rule the device follows.
    pub fn slot_of(&self, block_linear: u32, warp: u32, warps_per_block: u32) -> Option<u64> {
        let from = block_linear.checked_sub(self.block_offset)?;
        if !from.is_multiple_of(self.stride()) || warp >= warps_per_block {
            return None;
        }
        let below = match self.warp_mask {
            0 => warp,
            _ => {
                let mask = self.warp_mask_of(warps_per_block);
                if warp >= 32 || mask >> warp & 1 == 0 {
                    return None;
                }
                (mask & ((1u32 << warp) - 1)).count_ones()
            }
        };
        let rank = u64::from(from / self.stride());
        Some(rank * u64::from(self.warps_per_block(warps_per_block)) + u64::from(below))
    }

    /// The block (linear index) and warp whose slot is `slot`: the inverse of
    /// [`Sampling::slot_of`]; `None` if the block's index passes `u32::MAX` or no
    /// warp records.
    pub fn place(&self, slot: u32, warps_per_block: u32) -> Option<(u32, u32)> {
        let per = self.warps_per_block(warps_per_block);
        if per == 0 {
            return None;
        }
        let block = u64::from(self.block_offset) + u64::from(slot / per) * u64::from(self.stride());
        let warp = match self.warp_mask {
            0 => slot % per,
            _ => {
                // The (slot mod per)-th set bit of the mask.
                let mut m = self.warp_mask_of(warps_per_block);
                for _ in 0..slot % per {
                    m &= m - 1;
                }
                m.trailing_zeros()
            }
        };
        Some((u32::try_from(block).ok()?, warp))
    }

    /// What it records, in words, for the outputs: for example "8 of 64 warps
    /// per block (mask 0x1), 1 block in 4, 1 launch in 10"; "every warp" when it
    /// records everything.
    pub fn describe(&self, warps_per_block: u32) -> String {
        let mut parts = Vec::new();
        if self.warp_mask != 0 {
            parts.push(format!(
                "{} of {warps_per_block} warps per block (mask {:#x})",
                self.warps_per_block(warps_per_block),
                self.warp_mask
            ));
        }
        match (self.stride(), self.block_offset) {
            (1, 0) => {}
            (1, from) => parts.push(format!("every block from block {from}")),
            (n, 0) => parts.push(format!("1 block in {n}")),
            (n, from) => parts.push(format!("1 block in {n} from block {from}")),
        }
        if self.launch_every > 1 {
            parts.push(format!("1 launch in {}", self.launch_every));
        }
        match parts.is_empty() {
            true => "every warp".to_string(),
            false => parts.join(", "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every warp of a grid, through `slot_of` and back through `place`: the
    /// sampled ones get the slots 0..slots in order, the others none.
    fn check(s: Sampling, blocks: u32, wpb: u32) {
        let mut next = 0u64;
        for b in 0..blocks {
            for w in 0..wpb {
                match s.slot_of(b, w, wpb) {
                    Some(slot) => {
                        assert_eq!(slot, next, "{s:?}: block {b} warp {w}");
                        assert_eq!(s.place(slot as u32, wpb), Some((b, w)));
                        next += 1;
                    }
                    None => {
                        let in_blocks =
                            b >= s.block_offset && (b - s.block_offset).is_multiple_of(s.stride());
                        assert!(!in_blocks || s.warp_mask_of(wpb) >> w & 1 == 0);
                    }
                }
            }
        }
        assert_eq!(next, s.slots(u64::from(blocks), wpb), "{s:?}");
    }

    #[test]
    fn slots_are_numbered_over_the_sampled_warps_only() {
        let all = Sampling::default();
        for (s, blocks, wpb) in [
            (all, 5, 3),
            (all.warps(0b1), 7, 8),
            (all.warps(0x1111_1111), 3, 32),
            (all.warps(0x8000_0000), 3, 32),
            (all.warps(0b1010_0000), 4, 6), // bits past the block's warps
            (all.blocks(3, 0), 10, 4),
            (all.blocks(4, 1), 13, 12),
            (all.blocks(0, 2), 5, 2),
            (all.blocks(5, 9), 4, 2), // the offset past the grid
            (all.warps(0x111).blocks(4, 1).launches(10), 132, 12),
        ] {
            check(s, blocks, wpb);
        }
    }

    #[test]
    fn counts_and_words() {
        let s = Sampling::default().warps(0b1).blocks(4, 0);
        assert_eq!(s.blocks_of(132), 33);
        assert_eq!(s.slots(132, 8), 33);
        assert_eq!(s.blocks(4, 131).blocks_of(132), 1);
        assert_eq!(s.blocks(4, 132).blocks_of(132), 0);
        assert_eq!(Sampling::default().warps(0b1010_0000).slots(4, 6), 4);
        assert!(Sampling::default().is_all());
        assert!(Sampling::default().blocks(1, 0).launches(1).is_all());
        assert!(!Sampling::default().launches(2).is_all());
        assert_eq!(Sampling::default().describe(8), "every warp");
        assert_eq!(
            s.launches(10).describe(8),
            "1 of 8 warps per block (mask 0x1), 1 block in 4, 1 launch in 10"
        );
        assert_eq!(Sampling::default().place(0, 0), None);
    }

    #[test]
    fn a_sampled_buffer_decodes_trims_and_refuses_a_misplaced_slot() {
        use crate::decode::{Buffer, DecodeError};
        use crate::format::{slot_stride, trimmed, BufferBuilder, SAMPLED_HEADER_SIZE};
        // Warp 1 of blocks 2 and 5 of 8 (2 warps a block): 2 slots.
        let s = Sampling::default().warps(0b10).blocks(3, 2);
        let mut b = BufferBuilder::new([8, 1, 1], [64, 1, 1], 4);
        b.sampling(s);
        assert!(b.warp(2, 0).is_none() && b.warp(3, 1).is_none());
        b.warp(5, 1).unwrap().range(1, 100, 200, 7);
        let bytes = b.finish();
        let stride = slot_stride(4);
        assert_eq!(bytes.len(), SAMPLED_HEADER_SIZE + 2 * stride);
        let placed = |bytes: &[u8]| {
            let buf = Buffer::decode(bytes, None).unwrap();
            assert_eq!(buf.header().sampling, s);
            let slots: Vec<_> = buf
                .slots()
                .map(|x| {
                    (
                        x.index,
                        x.header.block_linear,
                        x.header.block,
                        x.header.warp,
                    )
                })
                .collect();
            slots
        };
        assert_eq!(placed(&bytes), [(1, 5, [5, 0, 0], 1)]);
        let header = *Buffer::decode(&bytes, None).unwrap().header();
        assert_eq!(placed(&trimmed(&bytes, &header)), [(1, 5, [5, 0, 0], 1)]);
        // Block 5's slot where block 2's belongs.
        let mut bad = bytes.clone();
        let (first, second) = (SAMPLED_HEADER_SIZE, SAMPLED_HEADER_SIZE + stride);
        bad.copy_within(second..second + stride, first);
        bad[second..].fill(0);
        assert!(matches!(
            Buffer::decode(&bad, None),
            Err(DecodeError::Misplaced {
                slot: 0,
                expected_block: 2,
                found_block: 5,
                ..
            })
        ));
        // Flagged sampled, but sampling nothing out.
        let mut bad = bytes.clone();
        bad[sampling_offsets::WARP_MASK..sampling_offsets::RESERVED].fill(0);
        assert!(matches!(
            Buffer::decode(&bad, None),
            Err(DecodeError::BadHeaderField {
                field: "sampling",
                ..
            })
        ));
        // More slots than the sampled warps of the grid.
        let mut b = BufferBuilder::new([8, 1, 1], [64, 1, 1], 4);
        b.sampling(s).slot_count(3);
        let mut bytes = b.finish();
        bytes.resize(SAMPLED_HEADER_SIZE + 3 * stride, 0);
        let at = SAMPLED_HEADER_SIZE + 2 * stride;
        bytes[at..at + 4].copy_from_slice(&crate::format::SLOT_MAGIC.to_le_bytes());
        assert!(matches!(
            Buffer::decode(&bytes, None),
            Err(DecodeError::SlotOutsideGrid { slot: 2, warps: 2 })
        ));
    }
}
