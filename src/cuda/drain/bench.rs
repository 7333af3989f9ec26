//! One drain thread's work on rings in host memory, for `benches/drain.rs`:
//! not public API. The bench stores chunks as the device would, and the
//! drain reads and cuts them with the code the drain threads run
//! ([`Drain::poll`], [`Drain::cut`]), so that its CPU cost is measured
//! without a GPU.

use super::shard::{Drain, CHUNK_RECORDS};
use crate::cuda::device::{Kind, Memory, Region};
use crate::decode::OwnedBuffer;
use crate::format::{
    slot_stream_offsets as so, slot_stride, BufferHeader, BUFFER_HEADER_SIZE, CHUNK_SIZE,
    SLOT_HEADER_SIZE, VERSION,
};
use crate::registry::EventRegistry;

/// The rings of a launch of `warps` warps (blocks of 4), with the drain of
/// all of them: one drain thread's shard.
pub struct Rings {
    memory: Memory,
    region: Region,
    drain: Drain,
    registry: EventRegistry,
    chunks: u32,
    stride: usize,
    /// Chunks stored per ring.
    written: Vec<u32>,
}

impl Rings {
    /// Rings of `chunks` chunks for `warps` warps, whose ids `registry`
    /// names; the first chunks' stamps come after `before_ns`.
    pub fn new(warps: u32, chunks: u32, registry: EventRegistry, before_ns: u64) -> Rings {
        let capacity = chunks * CHUNK_RECORDS;
        let header = BufferHeader {
            version: VERSION,
            slot_capacity: capacity,
            slot_count: warps,
            warps_per_block: 4,
            sampling: Default::default(),
            launch_id: 1,
            grid: [warps.div_ceil(4), 1, 1],
            block: [128, 1, 1],
            flags: 0,
        };
        let stride = slot_stride(capacity);
        let len = BUFFER_HEADER_SIZE + warps as usize * stride;
        let interval = std::time::Duration::MAX;
        Rings {
            memory: Memory::on_heap(Kind::Mapped, 0, len),
            region: Region {
                offset: 0,
                len,
                seq: 0,
            },
            drain: Drain::new(header, 0..warps, before_ns, interval),
            registry,
            chunks,
            stride,
            written: vec![0; warps as usize],
        }
    }

    /// Stores `chunk` (32 words, its meta last) as warp `slot`'s next chunk,
    /// as the device does; `false` if its ring is full.
    pub fn store(&mut self, slot: u32, chunk: &[u64; 32]) -> bool {
        let at = BUFFER_HEADER_SIZE + slot as usize * self.stride;
        let written = &mut self.written[slot as usize];
        if written.wrapping_sub(self.memory.load_u32(at + so::READ)) >= self.chunks {
            return false;
        }
        let at = at + SLOT_HEADER_SIZE + (*written % self.chunks) as usize * CHUNK_SIZE;
        for (i, &w) in chunk.iter().enumerate() {
            self.memory.store_u64(at + 8 * i, w);
        }
        *written = written.wrapping_add(1);
        true
    }

    /// One pass of the drain over every ring, whole (the drain threads' passes
    /// stop at a part's worth; the bench cuts a part after three passes);
    /// returns the events it added.
    ///
    /// # Panics
    /// If a ring's chunks are refused: the bench stores valid ones.
    pub fn poll(&mut self) -> usize {
        let mut errors = Vec::new();
        let added = self.drain.poll(
            &self.memory,
            &self.region,
            &self.registry,
            &mut errors,
            true,
        );
        assert!(errors.is_empty(), "{:?}", errors[0].error);
        added
    }

    /// The part gathered so far, packed and indexed as a drain thread does.
    pub fn cut(&mut self) -> Option<OwnedBuffer> {
        let (part, errors) = self.drain.cut(None, &self.registry);
        assert!(errors.is_empty(), "{:?}", errors[0].error);
        part
    }
}

#[cfg(test)]
mod tests {
    use super::super::shard::PART_EVENTS;
    use super::*;
    use crate::format::wire::{CHUNK_ENTRIES, ENTRY_INSTANT, STREAM_MARK};

    #[test]
    fn a_pass_stops_at_a_parts_worth_and_the_next_goes_on_from_there() {
        // 64 full rings of 512 chunks, 31 instants a chunk: about four parts'
        // worth. A ring gives all but its last instant, which waits for the
        // chunk after (a payload of it may be there).
        const WARPS: u32 = 64;
        const CHUNKS: u32 = 512;
        let ring = (CHUNKS as usize) * CHUNK_ENTRIES - 1;
        let reg = EventRegistry::from_pairs([(1, "tick")]).unwrap();
        let t0 = 5_000_000_000u64;
        let mut rings = Rings::new(WARPS, CHUNKS, reg, t0);
        for s in 0..WARPS {
            let mut t = t0 + u64::from(s);
            for _ in 0..CHUNKS {
                let mut c = [0u64; 32];
                for w in &mut c[..CHUNK_ENTRIES] {
                    t += 10;
                    let kind = u64::from(ENTRY_INSTANT | STREAM_MARK);
                    *w = u64::from(t as u32) | 1 << 32 | kind << 48;
                }
                let info = u64::from(STREAM_MARK) | CHUNK_ENTRIES as u64;
                c[CHUNK_ENTRIES] = ((t + 1) & ((1 << 48) - 1)) | info << 48;
                assert!(rings.store(s, &c));
            }
        }
        let (mut total, mut parts) = (0, 0);
        let mut errors = Vec::new();
        while total < WARPS as usize * ring {
            let r = &mut rings;
            let added = r
                .drain
                .poll(&r.memory, &r.region, &r.registry, &mut errors, false);
            assert!(errors.is_empty());
            // Up to a part's worth, past it by less than a ring.
            assert!(added >= ring, "{added}");
            let left = WARPS as usize * ring - total - added;
            assert!(
                (left == 0 || added >= PART_EVENTS) && added < PART_EVENTS + ring,
                "{added}"
            );
            let part = rings.cut().expect("events");
            assert_eq!(part.event_count() as usize, added);
            total += added;
            parts += 1;
        }
        assert_eq!((total, parts), (WARPS as usize * ring, 4));
        // Every ring read whole, none twice.
        for s in 0..WARPS as usize {
            let at = BUFFER_HEADER_SIZE + s * rings.stride + so::READ;
            assert_eq!(rings.memory.load_u32(at), CHUNKS, "ring {s}");
        }
        assert_eq!(rings.poll(), 0);
    }
}
