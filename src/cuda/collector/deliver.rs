//! Delivery: a held launch, bracketed by its checkpoints, becomes a
//! [`Batch`] for the dispatcher that was current at launch time (and for the
//! archive); the sinks it reached are kept for the next flush.

use std::sync::Arc;

use super::{Held, Worker};
use crate::batch::Batch;
use crate::deliver;

impl Worker {
    pub(super) fn deliver(&mut self, h: Held) {
        let n = u64::from(h.finishes());
        let part = u64::from(h.launch.part.is_some());
        let Held {
            launch,
            capture,
            dispatch,
            span,
            first_device_ns,
            last_device_ns,
            ..
        } = h;
        self.held_bytes -= capture.bytes().len();
        let (events, lost) = (capture.event_count(), capture.events_lost());
        let batch = Arc::new(Batch {
            device: self.device.clone(),
            launch,
            buffer: Arc::new(capture),
            calibration: Arc::new(self.calibration.slice(first_device_ns, last_device_ns)),
            registry: self.registry.clone(),
        });
        if let Some(a) = self.archive.as_mut() {
            a.record(&batch);
        }
        let reached = deliver::deliver(&dispatch, batch);
        // Only now may the launch span close (and its id be reused).
        drop(span);
        self.shared.finish(n, |st| {
            st.stats.delivered += n;
            st.stats.parts += part;
            st.stats.events += events;
            st.stats.events_lost += lost;
            for sink in reached.sinks() {
                if !st.sinks.iter().any(|s| Arc::ptr_eq(s, &sink)) {
                    st.sinks.push(sink);
                }
            }
        });
    }
}
