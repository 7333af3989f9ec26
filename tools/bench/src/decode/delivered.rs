//! A sink beside the Perfetto layer that checks every delivered batch of the decode step:
//! each launch must hold, with nothing dropped, the events its kernel records (warps ×
//! ranges per warp, [`super::Kind::ranges`]), whether it was a direct launch or a node of
//! a graph replay.

use std::sync::Arc;

use parking_lot::Mutex;
use tracing_gpu::batch::{Batch, BatchSink};

use super::Kind;

/// What the sink has seen.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Batches delivered.
    pub batches: u64,
    /// Their events.
    pub events: u64,
    /// Batches whose events were not their kernel's (or that dropped some).
    pub wrong: u64,
    /// The first of those, described.
    pub first_wrong: Option<String>,
}

/// The sink (add it with `tracing_gpu::deliver::SinkLayer`).
#[derive(Default)]
pub struct Delivered(Mutex<Tally>);

impl Delivered {
    /// What it has seen so far.
    pub fn tally(&self) -> Tally {
        self.0.lock().clone()
    }
}

impl BatchSink for Delivered {
    fn on_batch(&self, batch: &Arc<Batch>) {
        let buffer = &batch.buffer;
        let header = buffer.header();
        let (g, b) = (header.grid, header.block);
        let warps = u64::from(g[0] * g[1] * g[2]) * u64::from((b[0] * b[1] * b[2]).div_ceil(32));
        let name = &batch.launch.kernel;
        let want = Kind::of_node(name).map(|k| warps * u64::from(k.ranges()));
        let (got, dropped) = (buffer.event_count(), buffer.events_lost());
        let mut t = self.0.lock();
        t.batches += 1;
        t.events += got;
        if want != Some(got) || dropped != 0 {
            t.wrong += 1;
            t.first_wrong.get_or_insert_with(|| {
                format!("{name} (grid {g:?}): {got} events, {want:?} expected, {dropped} dropped")
            });
        }
    }

    fn flush(&self) {}
}
