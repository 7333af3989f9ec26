//! The process-wide sink slots: taken up to `MAX_SINKS`, refused past that
//! with an error (never a panic, never a sink silently not found), and given
//! back when the last clone of a sink's layer is dropped. A test binary of its
//! own, since it holds every slot of the process for a moment.

use std::sync::Arc;

use tracing_gpu::batch::{Batch, BatchSink};
use tracing_gpu::deliver::{SinkLayer, MAX_SINKS};
use tracing_gpu::perfetto::{PerfettoError, PerfettoLayer};

#[derive(Debug)]
struct Nop;

impl BatchSink for Nop {
    fn on_batch(&self, _: &Arc<Batch>) {}
    fn flush(&self) {}
}

#[test]
fn slots_run_out_with_an_error_and_come_back() {
    let mut held = Vec::new();
    let refused = loop {
        match SinkLayer::new(Nop) {
            Ok(layer) => held.push(layer),
            Err(e) => break e,
        }
        assert!(held.len() <= MAX_SINKS, "more sinks than slots");
    };
    assert!(refused.to_string().contains("more than"), "{refused}");
    assert_eq!(held.len(), MAX_SINKS);
    // Our own layers say so too.
    let err = PerfettoLayer::builder()
        .writer(Vec::new())
        .build()
        .unwrap_err();
    assert!(matches!(err, PerfettoError::Sink(_)), "{err}");

    // A clone keeps its slot; the others come back.
    let clone = held[0].clone();
    drop(held);
    let again: Vec<_> = (1..MAX_SINKS)
        .map(|_| SinkLayer::new(Nop).expect("a slot given back"))
        .collect();
    assert!(SinkLayer::new(Nop).is_err(), "the clone still holds one");
    drop(clone);
    assert!(SinkLayer::new(Nop).is_ok());
    drop(again);
}
