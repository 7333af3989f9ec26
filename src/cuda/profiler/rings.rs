//! The rings of streamed launches, on the launch path: how large each warp's
//! ring is ([`RingSettings`], from [`ProfilerBuilder`](super::ProfilerBuilder)'s
//! `stream_*` settings) and the mapped arena they are taken from
//! ([`MappedArena`]), made at the first streamed launch.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::cuda::device::{Arena, Memory};
use crate::cuda::drain::CHUNK_RECORDS;
use crate::cuda::error::ProfilerError;
use crate::cuda::job::Watchdog;
use crate::format::WATCH_CELL_SIZE;

/// Default size of the streaming arena: 256 MiB of pinned host memory, mapped
/// into the device (no device memory), allocated at the first streamed launch.
/// Its rings hold about 30 ms of a 200 M events/s kernel: on the H200 the
/// drain threads' pauses (cutting a part) outlasted the 7 ms that 64 MiB held
/// and entries were dropped (docs/performance.md, "Streamed launches").
pub const DEFAULT_STREAM_MEMORY: usize = 256 << 20;

/// The smallest ring: 2 chunks.
const MIN_STREAM_CAPACITY: u32 = 2 * CHUNK_RECORDS;
/// The largest ring: 2¹⁵ chunks.
const MAX_STREAM_CAPACITY: u32 = 1 << 19;
/// Default time between two parts of a running streamed launch.
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(100);

/// The streaming settings of a [`ProfilerBuilder`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingSettings {
    pub(crate) memory: usize,
    /// Records per ring; `None`: sized per launch ([`RingSettings::capacity_for`]).
    pub(crate) capacity: Option<u32>,
    pub(crate) interval: Duration,
    /// Threads reading a launch's rings; `None`: [`DrainThreads::by_cores`].
    pub(crate) drain_threads: Option<usize>,
    /// The launches' watchdog, unless a launch sets its own.
    pub(crate) watchdog: Option<Watchdog>,
}

impl Default for RingSettings {
    fn default() -> Self {
        RingSettings {
            memory: DEFAULT_STREAM_MEMORY,
            capacity: None,
            interval: DEFAULT_STREAM_INTERVAL,
            drain_threads: None,
            watchdog: None,
        }
    }
}

impl RingSettings {
    pub(crate) fn check(&self) -> Result<(), ProfilerError> {
        // The device keeps its ring counters modulo 2¹⁶ and finds a chunk by the
        // low bits of its number (docs/format.md).
        let Some(c) = self.capacity else {
            return Ok(());
        };
        if !c.is_power_of_two() || !(MIN_STREAM_CAPACITY..=MAX_STREAM_CAPACITY).contains(&c) {
            return Err(ProfilerError::Invalid(format!(
                "stream capacity must be a power of two from {MIN_STREAM_CAPACITY} to {MAX_STREAM_CAPACITY} records, not {c}"
            )));
        }
        Ok(())
    }

    /// The ring size of a launch of `slots` warps: the one set, or the largest
    /// whose rings take at most half the arena (room for a second streamed
    /// launch), so that a ring holds as many milliseconds as memory allows.
    pub(crate) fn capacity_for(&self, slots: u64) -> u32 {
        self.capacity.unwrap_or_else(|| {
            let per_warp = (self.memory as u64 / 2).saturating_sub(64) / slots.max(1);
            // A ring's slot header and the warp's watch cell, then its records.
            let records = per_warp.saturating_sub(64 + WATCH_CELL_SIZE as u64) / 16;
            let fit = if records == 0 {
                1
            } else {
                1u64 << records.ilog2()
            };
            fit.clamp(MIN_STREAM_CAPACITY as u64, MAX_STREAM_CAPACITY as u64) as u32
        })
    }
}

/// The streaming arena, made at the first streamed launch.
#[derive(Default)]
pub(crate) struct MappedArena(Mutex<Option<(Arc<Memory>, Arc<Arena>)>>);

impl MappedArena {
    /// The memory and its bookkeeping, if made.
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Option<(Arc<Memory>, Arc<Arena>)>> {
        self.0.lock()
    }

    /// The arena's bytes (0 until the first streamed launch).
    pub(crate) fn bytes(&self) -> usize {
        self.0.lock().as_ref().map_or(0, |(m, _)| m.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_fill_half_the_arena_unless_set() {
        let auto = RingSettings::default();
        // 132 SMs × 4 warps in 256 MiB: 8192 records (128 KiB, 512 chunks) each.
        assert_eq!(auto.capacity_for(528), 8192);
        let total = 528 * crate::format::slot_stride(8192);
        assert!(total <= DEFAULT_STREAM_MEMORY / 2 && 2 * total > DEFAULT_STREAM_MEMORY / 2);
        // Few warps: the largest ring; very many: the smallest (the launch is
        // then refused if even those do not fit).
        assert_eq!(auto.capacity_for(2), MAX_STREAM_CAPACITY);
        assert_eq!(auto.capacity_for(1 << 30), MIN_STREAM_CAPACITY);
        let set = RingSettings {
            capacity: Some(64),
            ..auto
        };
        assert_eq!(set.capacity_for(528), 64);
        assert!(set.check().is_ok());
        let bad = RingSettings {
            capacity: Some(48),
            ..auto
        };
        assert!(bad.check().is_err());
    }
}
