//! What the collector needs of a device, and nothing of CUDA: trace memory with
//! its host mirror ([`Memory`]), a launch's place in it ([`Place`]), the mark
//! that says a launch has finished ([`Mark`]), and the [`Device`] operations
//! the collector calls in bulk. The CUDA implementation is in `cuda.rs`; the
//! collector's tests implement [`Device`] on host memory, which is how a device
//! (or a second one) is simulated without a GPU.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::LaunchConfig;

use crate::cuda::device::Region;
use crate::cuda::error::ProfilerError;
use crate::format::{self, Sampling};

/// What a piece of trace memory is for, which decides how it is recycled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The profiler's arena: regions go back to the ring, zeroed.
    Arena,
    /// A graph's replay ring: a region is zeroed and armed again for the
    /// graph's prologue (its first word set to [`ARMED`]).
    Replays,
    /// The streaming arena: host memory mapped into the device, so `dptr` and
    /// the mirror are the same bytes. Nothing is copied; the collector reads
    /// it while kernels write it, and zeroes a region itself before giving it
    /// back (`drain/`).
    Mapped,
}

/// A replay region starts with this header (the prologue writes it); the
/// kernel nodes' buffers follow it.
///
/// | offset | type | field |
/// |---:|---|---|
/// | 0 | u32 | state: 0 in use or being recycled, [`ARMED`] free, [`TAKEN`] taken by a replay |
/// | 8 | u64 | the replay that took it |
pub(crate) const REPLAY_HEADER: usize = 256;
/// The region is free: the next replay whose turn it is may take it.
pub(crate) const ARMED: u32 = 1;
/// A replay's prologue took the region.
pub(crate) const TAKEN: u32 = 2;

/// Whether replay `replay` took the region whose bytes (header first) are `region`.
pub(crate) fn replay_taken(region: &[u8], replay: u64) -> bool {
    let u32_at = |i: usize| u32::from_le_bytes(region[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(region[i..i + 8].try_into().expect("8 bytes"));
    region.len() >= 16 && u32_at(0) == TAKEN && u64_at(8) == replay
}

/// Device memory and its host mirror, of the same size. The mirror is written
/// only by [`Device::fetch`], on the collector thread, and read after it.
pub(crate) struct Memory {
    /// What the memory is for.
    pub kind: Kind,
    /// Device address (the simulator's: any key it likes).
    pub dptr: u64,
    /// Bytes of each side.
    pub len: usize,
    host: NonNull<u8>,
    /// Frees both sides (CUDA: the device memory and the pinned mirror).
    free: Option<Free>,
}

/// How a [`Memory`] frees its device address and mirror.
pub(crate) type Free = Box<dyn FnOnce(u64, NonNull<u8>) + Send + Sync>;

// SAFETY: the mirror is plain host memory; `Memory` hands out views of it only
// through `mirror`/`mirror_mut`, whose callers (the collector thread) order
// the writes before the reads.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("kind", &self.kind)
            .field("dptr", &format_args!("{:#x}", self.dptr))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Memory {
    /// Memory whose mirror is `host` (`len` bytes), freed by `free`.
    pub(crate) fn new(kind: Kind, dptr: u64, len: usize, host: NonNull<u8>, free: Free) -> Memory {
        Memory {
            kind,
            dptr,
            len,
            host,
            free: Some(free),
        }
    }

    /// Memory with a zeroed mirror on the heap (the simulator's, the tests' and
    /// the drain bench's).
    pub(crate) fn on_heap(kind: Kind, dptr: u64, len: usize) -> Memory {
        // Whole words, so that the word accesses below are aligned (as a driver
        // allocation is), which a byte array would not promise.
        let n = len.div_ceil(8).max(1);
        let b: Box<[u64]> = vec![0u64; n].into_boxed_slice();
        let host = NonNull::new(Box::into_raw(b).cast::<u8>()).expect("box is not null");
        Memory::new(
            kind,
            dptr,
            len,
            host,
            Box::new(move |_, p| {
                let words = p.as_ptr().cast::<u64>();
                // SAFETY: made by Box::into_raw above with this length, freed once.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(words, n)) })
            }),
        )
    }

    /// The mirror's bytes of `region`. Valid after a [`Device::fetch`] of it.
    pub(crate) fn mirror(&self, region: &Region) -> &[u8] {
        assert!(
            region.offset + region.len <= self.len,
            "{region:?} outside {self:?}"
        );
        // SAFETY: in bounds (checked); nobody writes the mirror while the
        // collector reads it (only the collector's fetch writes it).
        unsafe { std::slice::from_raw_parts(self.host.as_ptr().add(region.offset), region.len) }
    }

    /// The mirror's bytes at `offset..offset + len`, for the copy back to write.
    ///
    /// # Safety
    /// Only the collector thread may call it, and no view of the same bytes
    /// may be alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn mirror_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len, "{offset}+{len} outside {self:?}");
        std::slice::from_raw_parts_mut(self.host.as_ptr().add(offset), len)
    }
}

/// Reads and writes of memory that the device may be writing at the same
/// time (a [`Kind::Mapped`] arena): volatile, one aligned word at a time,
/// never through a slice.
impl Memory {
    fn word_ptr<T>(&self, offset: usize) -> *mut T {
        let size = std::mem::size_of::<T>();
        assert!(
            offset.is_multiple_of(size) && offset + size <= self.len,
            "{offset} outside {self:?}"
        );
        // SAFETY: in bounds (checked above).
        unsafe { self.host.as_ptr().add(offset).cast::<T>() }
    }

    /// The 32 words (256 bytes) at `offset`, each read whole.
    pub(crate) fn load_chunk(&self, offset: usize) -> [u64; 32] {
        assert!(offset + 256 <= self.len, "{offset} outside {self:?}");
        let p = self.word_ptr::<u64>(offset);
        // SAFETY: in bounds and aligned (word_ptr); every word is read with one
        // aligned 8-byte load, which the device's 8-byte stores never tear.
        std::array::from_fn(|i| unsafe { p.add(i).read_volatile() })
    }

    /// The `u32` at `offset`.
    pub(crate) fn load_u32(&self, offset: usize) -> u32 {
        // SAFETY: in bounds and aligned (word_ptr).
        unsafe { self.word_ptr::<u32>(offset).read_volatile() }
    }

    /// The `u64` at `offset`.
    pub(crate) fn load_u64(&self, offset: usize) -> u64 {
        // SAFETY: in bounds and aligned (word_ptr).
        unsafe { self.word_ptr::<u64>(offset).read_volatile() }
    }

    /// Writes `v` at `offset`, after every write before it (the device that
    /// reads it must see those first).
    pub(crate) fn publish_u32(&self, offset: usize, v: u32) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: in bounds and aligned (word_ptr).
        unsafe { self.word_ptr::<u32>(offset).write_volatile(v) }
    }

    /// Writes `v` at `offset`, as a simulated device does.
    pub(crate) fn store_u64(&self, offset: usize, v: u64) {
        // SAFETY: in bounds and aligned (word_ptr).
        unsafe { self.word_ptr::<u64>(offset).write_volatile(v) }
    }

    /// Zeroes `len` bytes at `offset` (both multiples of 8).
    pub(crate) fn zero(&self, offset: usize, len: usize) {
        assert!(len.is_multiple_of(8), "{len} bytes");
        for i in (0..len).step_by(8) {
            // SAFETY: in bounds and aligned (word_ptr).
            unsafe { self.word_ptr::<u64>(offset + i).write_volatile(0) }
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Some(free) = self.free.take() {
            free(self.dptr, self.host);
        }
    }
}

/// Where one launch's records are.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The memory (kept alive by every launch that uses it).
    pub memory: Arc<Memory>,
    /// The launch's bytes in it.
    pub region: Region,
}

/// What says a launch has finished: an event recorded after it on its stream.
/// Launches on one stream finish in order, so the collector asks only about
/// the oldest unfinished mark of each stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The stream the launch went to (a key: only compared).
    pub stream: u64,
    /// The event recorded after the work (the simulator's: any key it likes);
    /// `None` when none could be recorded and the launching thread waited for
    /// the work itself: finished, and handed over all the same, so that its
    /// region comes back (zeroed, or re-armed) like any other.
    pub event: Option<u64>,
    /// Its launching thread recorded no event: the collector marks it
    /// (`event` is `None` until then), with one event for all the launches it
    /// finds unmarked on the stream at once.
    pub by_collector: bool,
}

/// The handle of the calling thread's per-thread default stream
/// (`CU_STREAM_PER_THREAD`): each thread's own stream, so only the launching
/// thread may record on it, and its launches from several threads share the key.
pub(crate) const PER_THREAD: u64 = 0x2;

/// What [`Device::mark`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamMark {
    /// An event recorded now.
    Event(u64),
    /// None could be recorded: it waited for the stream instead (all finished).
    Waited,
    /// The stream captures a graph (for the legacy stream: a blocking stream
    /// does), which an event recorded there would join: nothing done, ask
    /// again later.
    NotNow,
}

impl Mark {
    /// Not yet marked: the collector must record its event before asking.
    pub(crate) fn unmarked(&self) -> bool {
        self.by_collector && self.event.is_none()
    }
}

/// The device operations of the collector thread. Everything is done in bulk:
/// one call for all the launches found finished at once.
pub(crate) trait Device: Send {
    /// Whether the work before `mark` has finished. Never blocks.
    fn finished(&mut self, mark: &Mark) -> Result<bool, ProfilerError>;
    /// Records an event on `stream` now, after everything submitted to it
    /// before. The caller keeps the stream alive (the legacy stream lives as
    /// long as the context; a job holds its own stream until marked).
    fn mark(&mut self, stream: u64) -> Result<StreamMark, ProfilerError>;
    /// Copies `places` back into their memories' mirrors, all before returning
    /// (neighbouring regions of one memory in one copy).
    fn fetch(&mut self, places: &[&Place]) -> Result<(), ProfilerError>;
    /// Zeroes `places` on the device (and arms replay regions again), all
    /// before returning; then the regions may be used again.
    fn recycle(&mut self, places: &[&Place]) -> Result<(), ProfilerError>;
    /// The collector is done with a pass's `marks`: their events may be reused
    /// (all at once: the launching threads take events from the same pool).
    fn release(&mut self, marks: &[Mark]);
    /// Nothing has finished: wait a little (the poll interval) before asking again.
    fn idle(&mut self);
}

/// The trace buffer a launch needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub slots: u32,
    pub warps_per_block: u32,
    pub bytes: usize,
}

impl Shape {
    /// One slot per warp of the grid, `capacity` records each.
    #[cfg(test)]
    pub(crate) fn of(
        cfg: &LaunchConfig,
        capacity: u32,
        limit: usize,
    ) -> Result<Shape, ProfilerError> {
        Shape::sampled(cfg, capacity, limit, &Sampling::default())
    }

    /// One slot per warp `sampling` names, `capacity` records each, after a
    /// header of the size a buffer so sampled has.
    pub(crate) fn sampled(
        cfg: &LaunchConfig,
        capacity: u32,
        limit: usize,
        sampling: &Sampling,
    ) -> Result<Shape, ProfilerError> {
        let grid = [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2];
        let block = [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2];
        if grid.contains(&0) || block.contains(&0) {
            return Err(ProfilerError::EmptyLaunch { grid, block });
        }
        let threads = block.iter().map(|&d| d as u64).product::<u64>();
        let warps_per_block = threads.div_ceil(32);
        let blocks = grid.iter().map(|&d| d as u64).product::<u64>();
        let slots = match u32::try_from(warps_per_block) {
            Ok(w) => sampling.slots(blocks, w),
            Err(_) => u64::MAX,
        };
        let header = match sampling.is_all() {
            true => format::BUFFER_HEADER_SIZE,
            false => format::SAMPLED_HEADER_SIZE,
        };
        let needed = header as u128 + slots as u128 * format::slot_stride(capacity) as u128;
        let too_large = || ProfilerError::BufferTooLarge {
            needed,
            slots,
            capacity,
            limit,
        };
        if needed > limit as u128 || slots > u32::MAX as u64 || warps_per_block > u32::MAX as u64 {
            return Err(too_large());
        }
        Ok(Shape {
            slots: slots as u32,
            warps_per_block: warps_per_block as u32,
            bytes: needed as usize,
        })
    }
}
