//! The arena's bookkeeping on the host: which bytes of the profiler's device
//! arena belong to which launch. Pure Rust (no driver), shared by the
//! launching threads, which take regions, and the collector, which gives them
//! back; the collector's tests drive it through a simulated device.
//!
//! Regions are handed out by a bump pointer that wraps around, like a ring
//! buffer, and come back in any order (launches on several streams finish out
//! of order). A region that comes back before the ones handed out earlier is
//! marked and reclaimed when they come back too. Every region is contiguous,
//! so the collector copies a run of neighbouring launches back in one copy.
//!
//! Invariant kept by the users: bytes that are free here are zero on the
//! device (the arena is zeroed once when it is made, and the collector zeroes
//! a region before giving it back), so a launch never waits for a memset.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Regions start on this boundary (the device's preferred alignment for the
/// 16-byte vector stores of the recorder, and for the copy engines).
pub(crate) const ALIGN: usize = 256;

/// One launch's bytes of the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    /// Byte offset in the arena.
    pub offset: usize,
    /// Bytes the launch uses (the region may be longer by the alignment).
    pub len: usize,
    /// The allocation's sequence number, for [`WrapAllocator::free`].
    pub seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: usize,
    /// Aligned length.
    size: usize,
    freed: bool,
}

/// The wrapping allocator itself (not thread-safe; [`Arena`] locks it).
#[derive(Debug)]
pub(crate) struct WrapAllocator {
    capacity: usize,
    /// Live allocations, oldest first (freed ones stay until the older ones go).
    entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]`.
    first_seq: u64,
    /// Where the next allocation goes if it fits.
    head: usize,
    /// Bytes held by live and not yet reclaimed allocations.
    used: usize,
}

impl WrapAllocator {
    /// An allocator of `capacity` bytes.
    pub(crate) fn new(capacity: usize) -> WrapAllocator {
        WrapAllocator {
            capacity,
            entries: VecDeque::new(),
            first_seq: 0,
            head: 0,
            used: 0,
        }
    }

    /// Bytes in use (handed out, or freed behind an older region still out).
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// Regions handed out and not yet reclaimed.
    pub(crate) fn outstanding(&self) -> usize {
        self.entries.len()
    }

    /// A contiguous region of `len` bytes, or `None` if it has no room now.
    pub(crate) fn alloc(&mut self, len: usize) -> Option<Region> {
        let size = len.max(1).checked_next_multiple_of(ALIGN)?;
        if size > self.capacity {
            return None;
        }
        let offset = match self.entries.front() {
            None => 0,
            Some(oldest) => {
                let tail = oldest.offset;
                if self.head > tail {
                    // Live bytes are [tail, head): room after head, else from 0.
                    if self.capacity - self.head >= size {
                        self.head
                    } else if tail >= size {
                        0
                    } else {
                        return None;
                    }
                } else if tail - self.head >= size {
                    // Wrapped: live bytes are [tail, cap) and [0, head).
                    self.head
                } else {
                    return None;
                }
            }
        };
        let seq = self.first_seq + self.entries.len() as u64;
        self.entries.push_back(Entry {
            offset,
            size,
            freed: false,
        });
        self.head = offset + size;
        self.used += size;
        Some(Region { offset, len, seq })
    }

    /// Gives a region back (in any order). Returns whether space was reclaimed.
    pub(crate) fn free(&mut self, region: &Region) -> bool {
        let Some(i) = region
            .seq
            .checked_sub(self.first_seq)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < self.entries.len())
        else {
            debug_assert!(false, "region {region:?} freed twice or never allocated");
            return false;
        };
        let e = &mut self.entries[i];
        debug_assert!(
            !e.freed && e.offset == region.offset,
            "{region:?} freed twice"
        );
        e.freed = true;
        let mut reclaimed = false;
        while self.entries.front().is_some_and(|e| e.freed) {
            let e = self.entries.pop_front().expect("front exists");
            self.used -= e.size;
            self.first_seq += 1;
            reclaimed = true;
        }
        if self.entries.is_empty() {
            // Start over at 0: the next regions are contiguous again.
            self.head = 0;
        }
        reclaimed
    }
}

/// Regions [`Arena::free`] gives back between two chances for a launching
/// thread to take the lock: a pass may bring back thousands of launches, and a
/// launch call must not wait for all of them (about 64 × 10 ns at most).
const FREE_RUN: usize = 64;

/// A [`WrapAllocator`] shared between the launching threads and the collector, with a
/// condition variable for launches that choose to wait for room.
#[derive(Debug)]
pub(crate) struct Arena {
    allocator: Mutex<WrapAllocator>,
    room: Condvar,
    /// The arena's capacity, read by every launch (to size-check its buffer)
    /// without the lock.
    capacity: usize,
}

impl Arena {
    pub(crate) fn new(capacity: usize) -> Arena {
        Arena {
            allocator: Mutex::new(WrapAllocator::new(capacity)),
            room: Condvar::new(),
            capacity,
        }
    }

    /// Bytes the arena manages.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes in use now.
    pub(crate) fn used(&self) -> usize {
        self.allocator.lock().used()
    }

    /// A region now, or `None` if the arena is full. With `wait`, waits up to
    /// `timeout` for the collector to bring regions back instead.
    pub(crate) fn alloc(&self, len: usize, wait: Option<Duration>) -> Option<Region> {
        let mut allocator = self.allocator.lock();
        if let Some(r) = allocator.alloc(len) {
            return Some(r);
        }
        let timeout = wait?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            // Waiting is pointless when nothing is out: the region can never fit.
            if allocator.outstanding() == 0
                || self.room.wait_until(&mut allocator, deadline).timed_out()
            {
                return allocator.alloc(len);
            }
            if let Some(r) = allocator.alloc(len) {
                return Some(r);
            }
        }
    }

    /// Gives regions back (their bytes are zero on the device again). Every
    /// [`FREE_RUN`] regions, a launching thread waiting for the lock gets it
    /// first (a fair hand-over), so that its call waits for one run, not for
    /// the whole pass.
    pub(crate) fn free(&self, regions: impl IntoIterator<Item = Region>) {
        let mut allocator = self.allocator.lock();
        let mut reclaimed = false;
        for (i, r) in regions.into_iter().enumerate() {
            if i > 0 && i % FREE_RUN == 0 {
                MutexGuard::bump(&mut allocator);
            }
            reclaimed |= allocator.free(&r);
        }
        drop(allocator);
        if reclaimed {
            self.room.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned_contiguous_and_disjoint() {
        let mut r = WrapAllocator::new(4096);
        let a = r.alloc(100).unwrap();
        let b = r.alloc(300).unwrap();
        assert_eq!((a.offset, b.offset), (0, 256));
        assert_eq!((a.len, b.len), (100, 300));
        assert_eq!(r.used(), 256 + 512);
    }

    #[test]
    fn wraps_around_and_reclaims_out_of_order() {
        let mut r = WrapAllocator::new(1024);
        let a = r.alloc(256).unwrap();
        let b = r.alloc(256).unwrap();
        let c = r.alloc(256).unwrap();
        // 256 bytes left at the end: a 512-byte region does not fit yet.
        assert!(r.alloc(512).is_none());
        // b comes back first: nothing is reclaimed while a is out.
        assert!(!r.free(&b));
        assert!(r.alloc(512).is_none());
        // a comes back: a and b are reclaimed, the region wraps to 0.
        assert!(r.free(&a));
        let d = r.alloc(512).unwrap();
        assert_eq!(d.offset, 0);
        // Live: c [512, 768), d [0, 512); the end [768, 1024) is free but the
        // ring is wrapped, so the next region must fit between d and c.
        assert!(r.alloc(256).is_none());
        r.free(&c);
        let e = r.alloc(256).unwrap();
        assert_eq!(e.offset, 512);
        r.free(&d);
        r.free(&e);
        assert_eq!((r.used(), r.outstanding()), (0, 0));
        // Empty again: the next region starts at 0.
        assert_eq!(r.alloc(1024).unwrap().offset, 0);
    }

    #[test]
    fn a_region_larger_than_the_ring_never_fits() {
        let mut r = WrapAllocator::new(1024);
        assert!(r.alloc(1025).is_none());
        assert!(r.alloc(usize::MAX).is_none());
        let arena = Arena::new(1024);
        // Waiting is refused at once when nothing is out to come back.
        let t = std::time::Instant::now();
        assert!(arena.alloc(2048, Some(Duration::from_secs(10))).is_none());
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    /// A random walk against a model that tracks every byte: regions never
    /// overlap, and the ring never refuses a request the free bytes in one
    /// piece at the allowed positions could hold.
    #[test]
    fn random_use_never_overlaps_and_never_leaks() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let cap = 64 * ALIGN;
        let mut r = WrapAllocator::new(cap);
        let mut owner = vec![u64::MAX; cap / ALIGN];
        let mut live: Vec<Region> = Vec::new();
        for _ in 0..20_000 {
            if next() % 3 != 0 {
                let len = 1 + (next() % (8 * ALIGN as u64)) as usize;
                if let Some(reg) = r.alloc(len) {
                    let blocks = reg.offset / ALIGN..(reg.offset + len).div_ceil(ALIGN);
                    for b in blocks {
                        assert_eq!(owner[b], u64::MAX, "overlap at block {b}");
                        owner[b] = reg.seq;
                    }
                    live.push(reg);
                }
            } else if !live.is_empty() {
                let reg = live.swap_remove((next() % live.len() as u64) as usize);
                for o in owner.iter_mut().filter(|o| **o == reg.seq) {
                    *o = u64::MAX;
                }
                r.free(&reg);
            }
        }
        for reg in live.drain(..) {
            r.free(&reg);
        }
        assert_eq!((r.used(), r.outstanding()), (0, 0));
        assert_eq!(r.alloc(cap).unwrap().offset, 0);
    }

    #[test]
    fn a_long_free_lets_launches_in_and_loses_nothing() {
        let arena = std::sync::Arc::new(Arena::new(4096 * ALIGN));
        let held: Vec<Region> = (0..10 * FREE_RUN)
            .map(|_| arena.alloc(ALIGN, None).unwrap())
            .collect();
        let a = arena.clone();
        let taker = std::thread::spawn(move || {
            (0..2000)
                .filter_map(|_| a.alloc(ALIGN, None))
                .collect::<Vec<_>>()
        });
        arena.free(held);
        let taken = taker.join().unwrap();
        assert_eq!(taken.len(), 2000);
        arena.free(taken);
        assert_eq!(arena.used(), 0);
        assert_eq!(arena.alloc(4096 * ALIGN, None).map(|r| r.offset), Some(0));
    }

    #[test]
    fn a_waiting_launch_gets_room_when_the_collector_frees() {
        let arena = std::sync::Arc::new(Arena::new(1024));
        let held = arena.alloc(1024, None).unwrap();
        assert!(arena.alloc(256, None).is_none());
        let a = arena.clone();
        let waiter = std::thread::spawn(move || a.alloc(256, Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(20));
        arena.free([held]);
        let got = waiter.join().unwrap();
        assert_eq!(got.map(|r| r.offset), Some(0));
    }
}
