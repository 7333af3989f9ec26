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

    /// One pass of the drain over every ring; returns the events it added.
    ///
    /// # Panics
    /// If a ring's chunks are refused: the bench stores valid ones.
    pub fn poll(&mut self) -> usize {
        let mut errors = Vec::new();
        let added = self
            .drain
            .poll(&self.memory, &self.region, &self.registry, &mut errors);
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
