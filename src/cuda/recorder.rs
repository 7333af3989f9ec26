//! [`CaptureRecorder`]: records a live run into a capture file (`crate::capture`, `.tgpu`)
//! that `tracing-gpu convert` / `report` and the tests replay without a GPU.
//!
//! One recorder can serve several profilers (one per GPU): each adds its device,
//! its calibration rounds (raw samples) and its launches (raw trace buffers).
//! Its [`CaptureRecorder::layer`] records the host spans too, so a replay shows host
//! and device together. The file is written, atomically, when a profiler that
//! uses the recorder is dropped, and by [`CaptureRecorder::write`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tracing_gpu::cuda::{CaptureRecorder, Profiler};
//! use tracing_subscriber::{layer::SubscriberExt, EnvFilter};
//! let capture = CaptureRecorder::new("run.tgpu");
//! let subscriber = tracing_subscriber::registry()
//!     .with(EnvFilter::new("trace,tracing_gpu::device=info")) // batches, no plain device spans
//!     .with(capture.layer());
//! tracing::subscriber::set_global_default(subscriber)?;
//! let profiler = Profiler::builder().recorder(capture.clone()).build()?;
//! // ... gpu_profile!(profiler, ...) ...
//! drop(profiler); // writes run.tgpu
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::collector::{Archive, Round};
use super::error::ProfilerError;
use crate::batch::HostSpan;
use crate::batch::{Batch, DeviceInfo, DEVICE_TARGET};
use crate::capture::{
    CalibrationRound, Capture, CaptureDevice, CaptureLaunch, KeptSnapshot, HOST_SPANS_NOTE,
};
use crate::clock::HostClock;
use crate::registry::EventRegistry;
use crate::watch::Snapshot;

/// Collects a run into a [`Capture`] and writes it to a file.
#[derive(Debug)]
pub struct CaptureRecorder {
    path: PathBuf,
    capture: Mutex<Capture>,
    /// Whether its layer has seen a host span: if not, the file says how to
    /// record them (a capture without host spans replays without launch arrows).
    layer_seen: AtomicBool,
}

impl CaptureRecorder {
    /// A recorder that will write `path`.
    pub fn new(path: impl Into<PathBuf>) -> Arc<CaptureRecorder> {
        let metadata = vec![
            (
                "tool".to_string(),
                format!("tracing-gpu {}", env!("CARGO_PKG_VERSION")),
            ),
            (
                "command".to_string(),
                std::env::args().collect::<Vec<_>>().join(" "),
            ),
        ];
        Arc::new(CaptureRecorder {
            path: path.into(),
            capture: Mutex::new(Capture {
                metadata,
                ..Default::default()
            }),
            layer_seen: AtomicBool::new(false),
        })
    }

    /// The file it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds a free-form note to the capture's metadata.
    pub fn note(&self, key: impl Into<String>, value: impl Into<String>) {
        self.capture
            .lock()
            .metadata
            .push((key.into(), value.into()));
    }

    /// Writes everything recorded so far, atomically (a reader never sees half
    /// a file). If the recorder's [`layer`](Self::layer) was never in the
    /// subscriber, the metadata says so under [`HOST_SPANS_NOTE`], and the
    /// CLI repeats it when it replays the file.
    pub fn write(&self) -> Result<(), ProfilerError> {
        // Written from a snapshot, so launches are not held up by the disk.
        let mut snapshot = self.capture.lock().clone();
        if !self.layer_seen.load(Ordering::Relaxed)
            && !snapshot.metadata.iter().any(|(k, _)| k == HOST_SPANS_NOTE)
        {
            snapshot.metadata.push((
                HOST_SPANS_NOTE.into(),
                "only the launch spans: add CaptureRecorder::layer() to the subscriber for the others"
                    .into(),
            ));
        }
        snapshot.write(&self.path).map_err(ProfilerError::Capture)
    }

    /// A `tracing` layer that records the host spans into the capture.
    pub fn layer(self: &Arc<Self>) -> CaptureLayer {
        CaptureLayer {
            recorder: self.clone(),
        }
    }

    /// Adds the event names of a profiler.
    pub(crate) fn add_registry(&self, registry: &EventRegistry) -> Result<(), ProfilerError> {
        Ok(self.capture.lock().registry.merge(registry)?)
    }

    /// Adds a device (once).
    pub(crate) fn add_device(&self, device: &DeviceInfo) {
        let mut d = self.capture.lock();
        if !d.devices.iter().any(|x| x.info.ordinal == device.ordinal) {
            d.devices.push(CaptureDevice {
                info: device.clone(),
                calibrations: Vec::new(),
            });
        }
    }

    /// The [`Archive`] a profiler's collector writes to.
    pub(crate) fn archive(self: &Arc<Self>) -> Box<dyn Archive> {
        Box::new(RecorderArchive(self.clone()))
    }

    fn add_round(&self, device: &DeviceInfo, round: &Round) {
        let o = &round.checkpoint.host_offsets;
        let r = CalibrationRound {
            samples: round.samples.clone(),
            realtime_offset_ns: o.realtime_ns,
            monotonic_offset_ns: o.monotonic_ns,
            monotonic_raw_offset_ns: o.monotonic_raw_ns,
            offset_uncertainty_ns: o.uncertainty_ns,
            // Not carried by `Round`: 0 makes the replay fit with the default step.
            timer_step_ns: 0,
        };
        self.add_device(device);
        let mut d = self.capture.lock();
        if let Some(dev) = d
            .devices
            .iter_mut()
            .find(|x| x.info.ordinal == device.ordinal)
        {
            dev.calibrations.push(r);
        }
    }
}

struct RecorderArchive(Arc<CaptureRecorder>);

impl Archive for RecorderArchive {
    fn calibration(&mut self, device: &DeviceInfo, round: &Round) {
        self.0.add_round(device, round);
    }

    fn record(&mut self, batch: &Batch) {
        let launch = CaptureLaunch::new(batch.device.ordinal, &batch.launch, batch.buffer.clone());
        let mut capture = self.0.capture.lock();
        capture.launches.push(launch);
        // A streamed launch's parts go in one by one, as they come; its span
        // once, with its last part, when its completion is known.
        let whole = batch.launch.part.is_none_or(|p| p.last);
        if whole && !self.0.layer_seen.load(Ordering::Relaxed) {
            // Without the layer, the launch's own span still goes in (so a replay
            // has its launch slices and arrows): from what the launch knows.
            capture.host_spans.push(launch_span(&batch.launch));
        }
    }

    fn snapshot(&mut self, snapshot: &Snapshot, text: &str) {
        // Written out before the lock, which the layer takes on the application's threads.
        let kept = KeptSnapshot::new(snapshot, text);
        self.0.capture.lock().push_snapshot(kept);
    }

    fn finish(&mut self) -> Result<(), ProfilerError> {
        self.0.write()
    }
}

/// The host span of a launch whose recorder's layer is not in the subscriber:
/// its name and thread, from the clock read before the launch call to the
/// completion the collector saw (the layer would record the call alone).
fn launch_span(l: &crate::batch::LaunchInfo) -> HostSpan {
    // No OS thread id is known here: one derived from the name keeps the
    // launches of one thread on one track (FNV-1a).
    let thread_id = l
        .host_thread
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    HostSpan {
        name: l.kernel.to_string(),
        target: "tracing_gpu".into(),
        thread_name: l.host_thread.to_string(),
        thread_id,
        start_ns: l.host_launch_ns,
        end_ns: l.host_complete_ns.max(l.host_launch_ns),
        parent: None,
        launch_id: Some(l.launch_id),
        fields: vec![("gpu.launch_id".into(), l.launch_id.to_string())],
    }
}

/// Records host spans into a [`CaptureRecorder`]: see [`CaptureRecorder::layer`].
///
/// Device spans (target [`DEVICE_TARGET`]) are left out: the capture holds the
/// device events themselves. A span's start is its first enter (its creation if it is never entered) and
/// its end its last exit (its close if it is never entered), on the trace clock;
/// fields are kept as strings; the span that carries `gpu.launch_id` is linked
/// to its launch.
#[derive(Debug, Clone)]
pub struct CaptureLayer {
    recorder: Arc<CaptureRecorder>,
}

/// A span's index in [`Capture::host_spans`], and whether it was entered yet.
struct Index {
    at: usize,
    entered: bool,
}

struct Fields<'a>(&'a mut HostSpan);

impl Visit for Fields<'_> {
    fn record_u64(&mut self, f: &Field, v: u64) {
        if f.name() == "gpu.launch_id" {
            self.0.launch_id = Some(v);
        }
        self.0.fields.push((f.name().to_string(), v.to_string()));
    }
    // `gpu_profile!` records the launch id as an `i64`, which every layer keeps
    // as an integer (tracing-opentelemetry turns a `u64` into a string).
    fn record_i64(&mut self, f: &Field, v: i64) {
        if f.name() == "gpu.launch_id" {
            self.0.launch_id = u64::try_from(v).ok();
        }
        self.0.fields.push((f.name().to_string(), v.to_string()));
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.fields.push((f.name().to_string(), v.to_string()));
    }
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.fields.push((f.name().to_string(), format!("{v:?}")));
    }
}

fn os_thread_id() -> u64 {
    rustix::thread::gettid().as_raw_nonzero().get() as u64
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S>
    for CaptureLayer
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        // Device events are in the capture already, as raw buffers; their
        // plain spans (crate::deliver) are not host spans.
        if attrs.metadata().target() == DEVICE_TARGET {
            return;
        }
        self.recorder.layer_seen.store(true, Ordering::Relaxed);
        let Some(span) = ctx.span(id) else { return };
        let now = HostClock::Boottime.now_ns();
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.at as u32));
        let t = std::thread::current();
        let mut h = HostSpan {
            name: attrs.metadata().name().to_string(),
            target: attrs.metadata().target().to_string(),
            thread_name: t
                .name()
                .map_or_else(|| format!("{:?}", t.id()), str::to_string),
            thread_id: os_thread_id(),
            start_ns: now,
            end_ns: now,
            parent,
            launch_id: None,
            fields: Vec::new(),
        };
        attrs.record(&mut Fields(&mut h));
        let at = {
            let mut d = self.recorder.capture.lock();
            d.host_spans.push(h);
            d.host_spans.len() - 1
        };
        span.extensions_mut().insert(Index { at, entered: false });
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(at) = ctx
            .span(id)
            .and_then(|s| s.extensions().get::<Index>().map(|i| i.at))
        else {
            return;
        };
        let mut d = self.recorder.capture.lock();
        values.record(&mut Fields(&mut d.host_spans[at]));
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(index) = ext.get_mut::<Index>() else {
            return;
        };
        if !index.entered {
            index.entered = true;
            let now = HostClock::Boottime.now_ns();
            let mut d = self.recorder.capture.lock();
            let h = &mut d.host_spans[index.at];
            // The thread that runs it, not the one that made it.
            h.thread_id = os_thread_id();
            let t = std::thread::current();
            h.thread_name = t
                .name()
                .map_or_else(|| format!("{:?}", t.id()), str::to_string);
            (h.start_ns, h.end_ns) = (now, now);
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        let Some(at) = ctx
            .span(id)
            .and_then(|s| s.extensions().get::<Index>().map(|i| i.at))
        else {
            return;
        };
        let now = HostClock::Boottime.now_ns();
        let mut d = self.recorder.capture.lock();
        d.host_spans[at].end_ns = now;
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        let Some(index) = ext.get::<Index>() else {
            return;
        };
        if !index.entered {
            let now = HostClock::Boottime.now_ns();
            self.recorder.capture.lock().host_spans[index.at].end_ns = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Checkpoint, ClockMap, HostOffsets, Sample};
    use crate::test_support::batch;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn a_recorded_run_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.tgpu");
        let rec = CaptureRecorder::new(&path);
        let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(rec.layer()));
        let launch_span = tracing::dispatcher::with_default(&dispatch, || {
            let outer = tracing::info_span!("step", i = 3u64);
            let _g = outer.enter();
            let l = tracing::info_span!("sim", gpu.launch_id = 7i64);
            l.in_scope(|| std::thread::sleep(std::time::Duration::from_millis(1)));
            let _device = tracing::trace_span!(target: DEVICE_TARGET, "gpu.event");
            l
        });
        for ordinal in [0, 1] {
            let b = batch(ordinal, 7 + ordinal as u64, launch_span.id());
            rec.add_registry(&b.registry).unwrap();
            let mut a = rec.archive();
            let round = Round {
                samples: vec![Sample {
                    host_before: 10,
                    device: 5,
                    host_after: 20,
                }],
                checkpoint: Checkpoint {
                    map: ClockMap::exact(5, 15, 0.0),
                    host_offsets: HostOffsets::default(),
                },
            };
            a.calibration(&b.device, &round);
            a.record(&b);
            a.finish().unwrap();
        }
        drop(launch_span);
        let back = Capture::read(&path).unwrap();
        assert_eq!(back.devices.len(), 2);
        assert_eq!(back.devices[1].calibrations[0].samples.len(), 1);
        assert_eq!(back.launches.len(), 2);
        assert_eq!(back.launches[0].buffer.event_count(), 7);
        assert_eq!(back.registry.name(2), Some("mma"));
        assert_eq!(back.host_spans.len(), 2);
        let (step, sim) = (&back.host_spans[0], &back.host_spans[1]);
        assert_eq!((step.name.as_str(), sim.name.as_str()), ("step", "sim"));
        assert_eq!(sim.parent, Some(0));
        assert_eq!(sim.launch_id, Some(7));
        assert!(sim.end_ns - sim.start_ns >= 1_000_000, "{sim:?}");
        assert!(step.fields.contains(&("i".to_string(), "3".to_string())));
        assert!(
            !back.metadata.iter().any(|(k, _)| k == HOST_SPANS_NOTE),
            "its layer was there"
        );
    }

    #[test]
    fn a_capture_without_the_layer_keeps_the_launch_spans_and_says_how_to_get_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.tgpu");
        let rec = CaptureRecorder::new(&path);
        let b = batch(0, 7, None);
        rec.add_registry(&b.registry).unwrap();
        rec.add_device(&b.device);
        rec.archive().record(&b);
        rec.write().unwrap();
        let back = Capture::read(&path).unwrap();
        // The launch's own span is there, linked to its launch.
        assert_eq!(back.host_spans.len(), 1);
        assert_eq!(back.host_spans[0].launch_id, Some(b.launch.launch_id));
        assert_eq!(back.host_spans[0].name, *b.launch.kernel);
        let note = back.metadata.iter().find(|(k, _)| k == HOST_SPANS_NOTE);
        assert!(
            note.is_some_and(|(_, v)| v.contains("CaptureRecorder::layer()")),
            "{:?}",
            back.metadata
        );
    }

    #[test]
    fn a_streamed_launch_is_recorded_part_by_part() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.tgpu");
        let rec = CaptureRecorder::new(&path);
        let b = batch(0, 9, None);
        rec.add_registry(&b.registry).unwrap();
        rec.add_device(&b.device);
        let mut archive = rec.archive();
        // What the live drain hands the archive: the same launch, part by
        // part, each through `Archive::record` as it is delivered.
        for index in 0..3u32 {
            let mut part = (*b).clone();
            part.launch.part = Some(crate::batch::Part {
                index,
                last: index == 2,
            });
            part.launch.host_complete_ns = b.launch.host_complete_ns + u64::from(index);
            archive.record(&part);
        }
        archive.finish().unwrap();
        let back = Capture::read(&path).unwrap();
        let parts: Vec<_> = back.launches.iter().map(|l| l.part).collect();
        assert_eq!(parts.len(), 3);
        assert!(parts
            .iter()
            .enumerate()
            .all(|(i, p)| p.is_some_and(|p| p.index == i as u32 && p.last == (i == 2))));
        // The launch's span once, to its completion (the last part's).
        assert_eq!(back.host_spans.len(), 1);
        assert_eq!(back.host_spans[0].end_ns, b.launch.host_complete_ns + 2);
    }

    #[test]
    fn a_snapshot_is_kept_with_every_warp_and_told_again() {
        use crate::watch::tests::{pipeline, registry, snapshot};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.tgpu");
        let rec = CaptureRecorder::new(&path);
        rec.add_registry(&registry()).unwrap();
        let s = snapshot(&pipeline(), 16, 4, 4_000_000_100);
        let text = s.text(&registry());
        let mut archive = rec.archive();
        archive.snapshot(&s, &text);
        archive.finish().unwrap();
        let back = Capture::read(&path).unwrap();
        let kept: Vec<_> = back
            .kept_snapshots()
            .filter_map(|(note, _)| back.kept_snapshot(note))
            .collect();
        assert_eq!(kept, [s]);
        let told: Vec<_> = back.snapshots().collect();
        assert_eq!(told, [(7, 0, text.as_str().into())]);
    }
}
