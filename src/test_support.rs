//! Test helpers shared by the modules' unit tests: a batch with known
//! contents, a layer that records the device spans it sees, a sink, and the
//! Perfetto schema checker.

/// The Perfetto schema checker the integration tests use
/// (`tests/check_perfetto.py`): one copy, in tests/, for the unit tests too.
#[allow(dead_code)]
#[path = "../tests/perfetto_check/mod.rs"]
pub(crate) mod perfetto_check;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::batch::{Batch, BatchSink, DeviceInfo, LaunchInfo, DEVICE_TARGET};
use crate::clock::Calibration;
use crate::decode::OwnedBuffer;
use crate::format::BufferBuilder;
use crate::registry::EventRegistry;

/// A calibration with a known offset: device ns + `offset` = host ns.
pub(crate) fn calibration(offset: u64) -> Calibration {
    Calibration::exact(1_000_000, 1_000_000 + offset, 0.0)
}

/// A batch of two warps on `device`, 3 + 1 events, one warp with drops.
pub(crate) fn batch(device: u32, launch_id: u64, parent: Option<span::Id>) -> Arc<Batch> {
    let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 4);
    b.launch_id(launch_id);
    b.warp(0, 1)
        .unwrap()
        .sm(12, 12)
        .range(1, 2_000_000, 2_000_500, 7)
        .range(2, 2_000_600, 2_001_000, 8)
        .instant(3, 2_001_100, 9);
    b.warp(1, 0)
        .unwrap()
        .sm(3, 3)
        .range(1, 2_000_100, 2_000_200, 0)
        .range(1, 2_000_300, 2_000_400, 1)
        .range(1, 2_000_500, 2_000_600, 2)
        .range(1, 2_000_700, 2_000_800, 3)
        .range(1, 2_000_900, 2_000_950, 4);
    let capture = OwnedBuffer::decode(b.finish(), None).unwrap();
    let registry = EventRegistry::from_pairs([(1, "load"), (2, "mma"), (3, "epilogue")])
        .unwrap()
        .with_payload(1, "k_tile")
        .unwrap();
    Arc::new(Batch {
        device: Arc::new(DeviceInfo {
            ordinal: device,
            name: "Sim".into(),
            ..Default::default()
        }),
        launch: LaunchInfo {
            launch_id,
            kernel: "sim".into(),
            grid: [2, 1, 1],
            block: [64, 1, 1],
            parent,
            ..Default::default()
        },
        buffer: Arc::new(capture),
        calibration: Arc::new(calibration(1_000)),
        registry: Arc::new(registry),
    })
}

/// Records what reaches a layer: device spans (fields), their parents, events.
#[derive(Default)]
pub(crate) struct Seen {
    pub spans: Vec<BTreeMap<String, String>>,
    pub parents: Vec<Option<String>>,
    pub events: Vec<BTreeMap<String, String>>,
    pub batches: Vec<u64>,
    pub flushes: usize,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);
impl Visit for Fields<'_> {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().into(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().into(), v.into());
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.0.insert(f.name().into(), v.to_string());
    }
    /// Marked, so that a test sees a number that would reach
    /// `tracing-opentelemetry` as a string (it has no `record_u64`).
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.0.insert(f.name().into(), format!("{v} (u64)"));
    }
}

#[derive(Clone, Default)]
pub(crate) struct Recorder(pub Arc<Mutex<Seen>>);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.metadata().target() != DEVICE_TARGET {
            return;
        }
        let mut m = BTreeMap::new();
        attrs.record(&mut Fields(&mut m));
        let parent = ctx.span(id).unwrap().parent().map(|p| p.name().to_string());
        let mut seen = self.0.lock();
        seen.spans.push(m);
        seen.parents.push(parent);
    }
    fn on_event(&self, ev: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if ev.metadata().target() == DEVICE_TARGET {
            let mut m = BTreeMap::new();
            m.insert("name".into(), ev.metadata().name().into());
            ev.record(&mut Fields(&mut m));
            self.0.lock().events.push(m);
        }
    }
}

/// A bulk sink (add it as a [`crate::deliver::SinkLayer`]).
#[derive(Clone, Default)]
pub(crate) struct TestSink(pub Arc<Mutex<Seen>>);

impl BatchSink for TestSink {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.0.lock().batches.push(batch.launch.launch_id);
    }
    fn flush(&self) {
        self.0.lock().flushes += 1;
    }
}
