//! A watchdog's snapshot beside its event: the collector emits the ERROR event
//! (target [`crate::watch::TARGET`]) inside [`emit`], and a sink that wants the
//! structured snapshot, not only the text, takes it in its `on_event` with
//! [`current`]. Through the event, a sink gets a snapshot exactly when the
//! subscriber's filters let the event reach it, whatever wraps it (`reload`,
//! per-layer filters), and the data still flows one way: collector → here → sinks.

use std::cell::RefCell;
use std::sync::Arc;

use crate::batch::DeviceInfo;
use crate::clock::ClockMap;
use crate::registry::EventRegistry;
use crate::watch::{Snapshot, TARGET};

/// A snapshot and what a sink needs to draw it: the device it ran on, the map of
/// its device times to the trace clock, the names of its events.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) snapshot: Snapshot,
    pub(crate) text: String,
    pub(crate) device: Arc<DeviceInfo>,
    pub(crate) clock: ClockMap,
    pub(crate) registry: Arc<EventRegistry>,
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Watched>>> = const { RefCell::new(None) };
}

/// Runs `emit` (which emits the snapshot's event) with `watched` as the current
/// snapshot of this thread.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn emit(watched: Arc<Watched>, emit: impl FnOnce()) {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            CURRENT.with(|c| c.borrow_mut().take());
        }
    }
    CURRENT.with(|c| *c.borrow_mut() = Some(watched));
    let _clear = Clear;
    emit();
}

/// The snapshot that `event` tells, if it is a watchdog's event emitted through
/// [`emit`] on this thread.
pub(crate) fn current(event: &tracing::Event<'_>) -> Option<Arc<Watched>> {
    if event.metadata().target() != TARGET {
        return None;
    }
    CURRENT.with(|c| c.borrow().clone())
}
