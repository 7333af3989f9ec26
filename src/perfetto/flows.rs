//! Flow arrows from a launch's host span to its kernel slice: which launches
//! started one that their kernel slice has not yet ended.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The flow id of a launch: the same on the host span and the kernel slice.
pub(crate) fn launch_flow_id(launch_id: u64) -> u64 {
    // Never zero: Perfetto reads 0 as "no id".
    launch_id.wrapping_add(1).max(1)
}

/// The launches whose host slice started a flow that their kernel slice has
/// not yet ended.
///
/// Live ([`FlowOrigins::window`], the layer's): one word per launch id modulo
/// [`FlowOrigins::WINDOW`], holding the id plus one (0: none). A launch span
/// starts its flow on the launching thread (one store, no lock: it is on the
/// launch call's path) and its kernel slice ends it (a compare-and-swap); a
/// launch that never gets a batch (one skipped because the arena was full)
/// leaves its word to be overwritten, so the memory is fixed (2 MiB) whatever
/// the run's length. A launch whose word a launch `WINDOW` ids later took
/// before its batch came (more than 262,144 launches in between, which the
/// profiler's hold of about a second reaches only past 250 k launches a
/// second) has its flow left unended (a dangling arrow, as a skipped
/// launch's), never ended by the wrong kernel.
///
/// Replayed ([`FlowOrigins::default`], a [`TraceWriter`](super::TraceWriter)'s): a capture's
/// host spans are all written before its batches, so every flow stays open
/// until its batch: a set, exact, as large as the spans already in memory.
#[derive(Debug)]
pub(crate) enum FlowOrigins {
    Window(Box<[AtomicU64]>),
    Exact(Mutex<HashSet<u64>>),
}

impl Default for FlowOrigins {
    fn default() -> FlowOrigins {
        FlowOrigins::Exact(Mutex::default())
    }
}

impl FlowOrigins {
    const WINDOW: usize = 1 << 18;

    /// The live layer's table.
    pub(crate) fn window() -> FlowOrigins {
        FlowOrigins::Window((0..Self::WINDOW).map(|_| AtomicU64::new(0)).collect())
    }

    /// Starts the flow of launch `launch_id` at a host slice: remembers that its
    /// kernel slice ends one ([`DeviceEncoder::kernel`](super::device::DeviceEncoder::kernel)), and returns the flow id.
    pub(crate) fn start(&self, launch_id: u64) -> u64 {
        match self {
            FlowOrigins::Window(w) => w[launch_id as usize % Self::WINDOW]
                .store(launch_id.wrapping_add(1), Ordering::Relaxed),
            FlowOrigins::Exact(set) => {
                set.lock().insert(launch_id);
            }
        }
        launch_flow_id(launch_id)
    }

    /// Whether launch `launch_id`'s flow was started and not yet ended; ends it.
    pub(crate) fn end(&self, launch_id: u64) -> bool {
        match self {
            FlowOrigins::Window(w) => w[launch_id as usize % Self::WINDOW]
                .compare_exchange(
                    launch_id.wrapping_add(1),
                    0,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok(),
            FlowOrigins::Exact(set) => set.lock().remove(&launch_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_is_ended_once_by_its_own_launch_and_memory_stays_fixed() {
        let o = FlowOrigins::window();
        assert_eq!(o.start(7), launch_flow_id(7));
        assert!(!o.end(8), "never started");
        assert!(o.end(7));
        assert!(!o.end(7), "ended once");
        // A launch WINDOW ids later takes the word: the earlier flow is left
        // unended, never ended by the other kernel.
        let later = 9 + FlowOrigins::WINDOW as u64;
        o.start(9);
        o.start(later);
        assert!(!o.end(9));
        assert!(o.end(later));
        // Launches that never get a batch reuse words: no growth.
        for id in 0..3 * FlowOrigins::WINDOW as u64 {
            o.start(id);
        }
        let FlowOrigins::Window(w) = &o else {
            panic!("a window")
        };
        assert_eq!(w.len(), FlowOrigins::WINDOW);
        // A replay's set keeps every flow until its batch, however many.
        let exact = FlowOrigins::default();
        exact.start(9);
        exact.start(later);
        assert!(exact.end(9) && exact.end(later));
    }
}
