//! The slots sinks take: [`MAX_SINKS`] of them, each with a marker type of its
//! own (`Slot<N>`) that a dispatcher finds by downcast, and the sink it holds
//! now; and [`Reached`], a set of slots.
//!
//! `tracing` finds a layer in a subscriber by `downcast_raw`, and a stack of
//! layers answers with the first layer that claims a type: one marker type
//! for every sink would find one sink only, so each slot has its own.

use std::any::TypeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;
use tracing::Dispatch;

use super::reload;
use crate::batch::BatchSink;

/// How many sinks may be alive at once in a process (in all subscribers
/// together). [`SinkHandle::new`](super::SinkHandle::new) fails past it.
pub const MAX_SINKS: usize = 128;

const WORDS: usize = MAX_SINKS / 64;

/// The marker a sink in slot `N` answers for: a distinct `TypeId` per slot.
/// A pointer to a sink's `Arc<dyn BatchSink>` is handed out as one of these.
#[repr(transparent)]
struct Slot<const N: usize>(Arc<dyn BatchSink>);

/// Finds the sink in slot `N` of a dispatcher, if it is there.
fn probe<const N: usize>(dispatch: &Dispatch) -> Option<&Arc<dyn BatchSink>> {
    dispatch.downcast_ref::<Slot<N>>().map(|s| &s.0)
}

/// The `TypeId` of slot `N`'s marker.
fn marker<const N: usize>() -> TypeId {
    TypeId::of::<Slot<N>>()
}

type Probe = fn(&Dispatch) -> Option<&Arc<dyn BatchSink>>;

/// One `(marker, probe)` pair per slot: a const generic cannot be picked at
/// run time, so every slot's pair is instantiated here.
macro_rules! slots {
    ($($n:literal)*) => {
        const MARKERS: [fn() -> TypeId; MAX_SINKS] = [$(marker::<$n>),*];
        const PROBES: [Probe; MAX_SINKS] = [$(probe::<$n>),*];
    };
}
slots!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
    64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95
    96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127
);

/// The slots in use, one bit each.
static IN_USE: [AtomicU64; WORDS] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The sink each slot in use holds: what a [`Reached`] slot names.
static HOLDERS: [RwLock<Option<Weak<dyn BatchSink>>>; MAX_SINKS] =
    [const { RwLock::new(None) }; MAX_SINKS];

/// A slot, given back when the last clone of its sink's handle is dropped.
#[derive(Debug)]
pub(super) struct Taken(pub(super) usize);

impl Taken {
    /// Takes a free slot for `sink`.
    pub(super) fn take(sink: &Arc<dyn BatchSink>) -> Option<Taken> {
        for (w, word) in IN_USE.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != u64::MAX {
                let free = bits.trailing_ones() as usize;
                match word.compare_exchange_weak(
                    bits,
                    bits | 1 << free,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let slot = w * 64 + free;
                        *HOLDERS[slot].write() = Some(Arc::downgrade(sink));
                        return Some(Taken(slot));
                    }
                    Err(now) => bits = now,
                }
            }
        }
        None
    }

    /// The `TypeId` of this slot's marker.
    pub(super) fn marker(&self) -> TypeId {
        MARKERS[self.0]()
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        reload::forget(self.0);
        *HOLDERS[self.0].write() = None;
        IN_USE[self.0 / 64].fetch_and(!(1 << (self.0 % 64)), Ordering::AcqRel);
    }
}

/// A set of slots: the sinks that [`deliver`](super::deliver) handed a batch
/// to. Sixteen bytes, no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached([u64; WORDS]);

impl Reached {
    pub(super) const EMPTY: Reached = Reached([0; WORDS]);

    /// How many sinks.
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether no sink got the batch.
    pub fn is_empty(&self) -> bool {
        *self == Reached::EMPTY
    }

    /// Whether `slot` is in the set.
    pub(super) fn has(&self, slot: usize) -> bool {
        self.0[slot / 64] & 1 << (slot % 64) != 0
    }

    /// Adds `slot`; `false` if it was in already.
    pub(super) fn add(&mut self, slot: usize) -> bool {
        let had = self.has(slot);
        self.0[slot / 64] |= 1 << (slot % 64);
        !had
    }

    /// The slots, in order.
    fn slots(self) -> impl Iterator<Item = usize> {
        self.0.into_iter().enumerate().flat_map(|(w, mut bits)| {
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * 64 + b
                })
            })
        })
    }

    /// The sinks in these slots, in slot order (those still alive).
    pub(crate) fn sinks(self) -> impl Iterator<Item = Arc<dyn BatchSink>> {
        self.slots()
            .filter_map(|slot| HOLDERS[slot].read().as_ref()?.upgrade())
    }
}

/// Every slot in use.
fn in_use() -> Reached {
    Reached(std::array::from_fn(|w| IN_USE[w].load(Ordering::Acquire)))
}

/// The slots of every sink in use, if `dispatch` holds them all (by downcast,
/// or behind `reload`); `None` if some sink of the process is not there
/// (in another subscriber, or where this one cannot find it).
pub(super) fn every_sink_in(dispatch: &Dispatch) -> Option<Reached> {
    let used = in_use();
    let mut found = Reached::EMPTY;
    for slot in used.slots() {
        if PROBES[slot](dispatch).is_some() {
            found.add(slot);
        }
    }
    if found != used {
        reload::hidden_slots_in(dispatch, |slot| {
            found.add(slot);
        });
    }
    (found == used).then_some(found)
}

/// Whether `dispatch` finds, by downcast, the sink in `slot` at address `sink`.
pub(crate) fn holds(dispatch: &Dispatch, slot: usize, sink: *const ()) -> bool {
    PROBES[slot](dispatch).is_some_and(|s| Arc::as_ptr(s) as *const () == sink)
}

/// Calls `f` with every sink in `dispatch`: those found by downcast, in slot
/// order, then those behind `reload` ([`reload::hidden_in`]).
pub(super) fn for_each_sink(dispatch: &Dispatch, mut f: impl FnMut(&Arc<dyn BatchSink>)) {
    let mut found = Reached::EMPTY;
    for slot in in_use().slots() {
        if let Some(sink) = PROBES[slot](dispatch) {
            found.add(slot);
            f(sink);
        }
    }
    for sink in reload::hidden_in(dispatch, |slot| found.has(slot)) {
        f(&sink);
    }
}
