//! The collector without a GPU: a simulated device ([`Sim`]) stands in for
//! CUDA, with host memory for device memory and flags for events; the tests
//! play the launching thread (the arena, the counts, the jobs) and the kernels
//! (buffers written with `BufferBuilder`), and the graph prologue. This is also
//! how a second device is simulated.
use super::*;
use crate::batch::{Batch, BatchSink};
use crate::clock::HostClock;
use crate::clock::{Checkpoint, ClockMap, HostOffsets};
use crate::cuda::device::{
    Kind, Mark, Memory, Place, Region, StreamMark, ALIGN, ARMED, PER_THREAD, REPLAY_HEADER, TAKEN,
};
use crate::cuda::drain::{DrainThreads, BACKLOG_BYTES};
use crate::cuda::job::{Node, Work};
use crate::cuda::ProfilerStats;
use crate::format::BufferBuilder;
use crate::test_support::Recorder;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing_subscriber::layer::SubscriberExt;

/// The simulated GPU: device memory by address, and which events have fired.
#[derive(Default)]
struct Gpu {
    memory: Mutex<HashMap<u64, Vec<u8>>>,
    fired: Mutex<HashSet<u64>>,
    next_event: AtomicU64,
    /// Bulk operations the collector made (fetches and recycles), and the
    /// places they covered, to check that draining is done in bulk.
    fetches: AtomicU64,
    fetched_places: AtomicU64,
    /// Calls giving events back, and the events given back.
    releases: AtomicU64,
    released: AtomicU64,
    /// Fail the next fetch.
    fail_fetch: Mutex<bool>,
    /// Streams still running: the collector's marks on them wait.
    busy: Mutex<HashSet<u64>>,
    /// Streams capturing a graph: they may not be marked.
    capturing: Mutex<HashSet<u64>>,
    /// The collector's requests to mark a stream, the streams marked (in
    /// order), and the marks not yet fired with their streams.
    marks_asked: AtomicU64,
    marked: Mutex<Vec<u64>>,
    waiting: Mutex<Vec<(u64, u64)>>,
    /// Events the collector asked about.
    queries: AtomicU64,
    /// Everything has run: every event fires, no stream captures (a test that
    /// failed ends so, rather than wait for its launches forever).
    ended: std::sync::atomic::AtomicBool,
}

impl Gpu {
    /// Device memory of `len` bytes at a new address, with its host mirror.
    fn allocate(&self, kind: Kind, len: usize) -> Arc<Memory> {
        static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
        let dptr = NEXT.fetch_add(1 << 32, Ordering::Relaxed);
        self.memory.lock().insert(dptr, vec![0; len]);
        Arc::new(Memory::on_heap(kind, dptr, len))
    }

    fn write(&self, memory: &Memory, offset: usize, bytes: &[u8]) {
        let mut m = self.memory.lock();
        let dev = m.get_mut(&memory.dptr).expect("allocated");
        dev[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn read(&self, memory: &Memory, offset: usize, len: usize) -> Vec<u8> {
        self.memory.lock()[&memory.dptr][offset..offset + len].to_vec()
    }

    /// An event recorded now on a stream; fires at once if `fired`.
    fn event(&self, fired: bool) -> u64 {
        let e = self.next_event.fetch_add(1, Ordering::Relaxed);
        if fired {
            self.fire(e);
        }
        e
    }

    fn fire(&self, event: u64) {
        self.fired.lock().insert(event);
    }

    /// `stream` has run everything: its marks fire, and later ones at once.
    fn finish_stream(&self, stream: u64) {
        self.busy.lock().remove(&stream);
        let mut waiting = self.waiting.lock();
        for &(_, e) in waiting.iter().filter(|(s, _)| *s == stream) {
            self.fire(e);
        }
        waiting.retain(|(s, _)| *s != stream);
    }
}

/// The collector's side of the simulated GPU.
struct Sim(Arc<Gpu>);

impl Device for Sim {
    fn mark(&mut self, stream: u64) -> Result<StreamMark, ProfilerError> {
        self.0.marks_asked.fetch_add(1, Ordering::Relaxed);
        let ended = self.0.ended.load(Ordering::Acquire);
        if !ended && self.0.capturing.lock().contains(&stream) {
            return Ok(StreamMark::NotNow);
        }
        self.0.marked.lock().push(stream);
        let busy = self.0.busy.lock().contains(&stream);
        let e = self.0.event(!busy);
        if busy {
            self.0.waiting.lock().push((stream, e));
        }
        Ok(StreamMark::Event(e))
    }

    fn finished(&mut self, mark: &Mark) -> Result<bool, ProfilerError> {
        self.0.queries.fetch_add(1, Ordering::Relaxed);
        let ended = self.0.ended.load(Ordering::Acquire);
        Ok(ended || mark.event.is_none_or(|e| self.0.fired.lock().contains(&e)))
    }

    fn fetch(&mut self, places: &[&Place]) -> Result<(), ProfilerError> {
        if std::mem::take(&mut *self.0.fail_fetch.lock()) {
            return Err(ProfilerError::Invalid("copy failed".into()));
        }
        self.0.fetches.fetch_add(1, Ordering::Relaxed);
        self.0
            .fetched_places
            .fetch_add(places.len() as u64, Ordering::Relaxed);
        for p in places {
            let bytes = self.0.read(&p.memory, p.region.offset, p.region.len);
            // SAFETY: the collector thread, no view alive.
            unsafe { p.memory.mirror_mut(p.region.offset, p.region.len) }.copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn recycle(&mut self, places: &[&Place]) -> Result<(), ProfilerError> {
        for p in places {
            self.0
                .write(&p.memory, p.region.offset, &vec![0; p.region.len]);
            if p.memory.kind == Kind::Replays {
                self.0
                    .write(&p.memory, p.region.offset, &ARMED.to_le_bytes());
            }
        }
        Ok(())
    }

    fn release(&mut self, marks: &[Mark]) {
        self.0.releases.fetch_add(1, Ordering::Relaxed);
        let mut fired = self.0.fired.lock();
        for e in marks.iter().filter_map(|m| m.event) {
            fired.remove(&e);
            self.0.released.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn idle(&mut self) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Checkpoints at device time 10 ms, 20 ms, ... with host = device + offset.
struct Steps {
    next: u64,
    offset: u64,
}

impl Recalibrate for Steps {
    fn round(&mut self, _beside_stream: bool) -> Result<Round, ProfilerError> {
        self.next += 10_000_000;
        Ok(Round {
            samples: Vec::new(),
            checkpoint: Checkpoint {
                map: ClockMap::exact(self.next, self.next + self.offset, 0.0),
                host_offsets: HostOffsets::default(),
            },
        })
    }
}

fn device(ordinal: u32) -> Arc<DeviceInfo> {
    Arc::new(DeviceInfo {
        ordinal,
        name: format!("Sim {ordinal}"),
        sm_count: 4,
        ..Default::default()
    })
}

/// One simulated GPU with its profiler's host side: the arena, the counts, the collector.
struct Rig {
    gpu: Arc<Gpu>,
    arena: Arc<Arena>,
    memory: Arc<Memory>,
    shared: Arc<Ledger>,
    /// Before `collector`: fields drop in order.
    _ends: EndOnPanic,
    collector: Collector,
    device: u32,
    /// The simulated streams' handles, which jobs hold until marked.
    streams: Mutex<HashMap<u64, Arc<()>>>,
}

/// Dropped before a rig's collector: a test that fails while launches still
/// run ends them, so that the collector stops instead of waiting for them forever.
struct EndOnPanic(Arc<Gpu>);

impl Drop for EndOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.ended.store(true, Ordering::Release);
        }
    }
}

impl Rig {
    fn new(ordinal: u32, recalibrate: Option<Recalibration>) -> Rig {
        Rig::with(
            ordinal,
            recalibrate,
            Calibration::exact(0, 5_000, 0.0),
            1 << 20,
        )
    }

    fn with(
        ordinal: u32,
        recalibrate: Option<Recalibration>,
        calibration: Calibration,
        arena_bytes: usize,
    ) -> Rig {
        Rig::paced(
            ordinal,
            recalibrate,
            calibration,
            arena_bytes,
            BRING_BACK_EVERY,
        )
    }

    /// `with`, bringing finished launches back after `bring_back_every`.
    fn paced(
        ordinal: u32,
        recalibrate: Option<Recalibration>,
        calibration: Calibration,
        arena_bytes: usize,
        bring_back_every: Duration,
    ) -> Rig {
        let clock = (recalibrate, calibration);
        Rig::built(ordinal, clock, arena_bytes, bring_back_every, BACKLOG_BYTES)
    }

    /// `new(0, None)`, whose streamed launches' drain threads stop reading
    /// while `backlog` bytes of parts wait for the collector.
    fn backlogged(backlog: usize) -> Rig {
        let clock = (None, Calibration::exact(0, 5_000, 0.0));
        Rig::built(0, clock, 1 << 20, BRING_BACK_EVERY, backlog)
    }

    fn built(
        ordinal: u32,
        (recalibrate, calibration): (Option<Recalibration>, Calibration),
        arena_bytes: usize,
        bring_back_every: Duration,
        backlog: usize,
    ) -> Rig {
        let gpu = Arc::new(Gpu::default());
        let shared = Ledger::new(calibration);
        let arena = Arc::new(Arena::new(arena_bytes));
        let memory = gpu.allocate(Kind::Arena, arena_bytes);
        let registry = EventRegistry::from_pairs([(1, "load"), (2, "mma")]).unwrap();
        let collector = Collector::spawn(
            CollectorConfig {
                device: device(ordinal),
                registry: Arc::new(registry),
                recalibrate,
                archive: None,
                backend: Box::new(Sim(gpu.clone())),
                arena: arena.clone(),
                // Several, whatever this machine has: the parallel decode is tested.
                decoders: 3,
                drain: DrainConfig {
                    threads: DrainThreads::by_cores(),
                    interval: Duration::from_millis(5),
                    backlog,
                },
                bring_back_every,
                on_start: None,
            },
            shared.clone(),
        )
        .unwrap();
        Rig {
            _ends: EndOnPanic(gpu.clone()),
            gpu,
            arena,
            memory,
            shared,
            collector,
            device: ordinal,
            streams: Mutex::default(),
        }
    }

    /// A launch as `Profiler::launch` makes it, of one kernel of 2 blocks × 2
    /// warps whose events start at `t0` device ns (the kernel writes `bytes`
    /// instead when given): a region, the count, the kernel's writes, the
    /// event on `stream` (fired at once if `fired`), the job. Returns the
    /// event, or `None` if the arena was full (the launch is skipped).
    fn launch(&self, stream: u64, t0: u64, bytes: Option<Vec<u8>>, fired: bool) -> Option<u64> {
        let event = self.gpu.event(fired);
        self.launch_marked(stream, t0, bytes, Some(event), false)
            .map(|()| event)
    }

    /// `launch`, marked by `event` (`None`: as when no event could be
    /// recorded and the launching thread waited for the kernel itself), or
    /// left to the collector to mark (`by_collector`); the job then holds its
    /// stream (its handle in `streams`), except the legacy stream (0).
    fn launch_marked(
        &self,
        stream: u64,
        t0: u64,
        bytes: Option<Vec<u8>>,
        event: Option<u64>,
        by_collector: bool,
    ) -> Option<()> {
        self.launch_of(
            kernel(self.device, t0),
            stream,
            t0,
            bytes,
            event,
            by_collector,
        )
    }

    /// `launch_marked` of the kernel that writes what `b` holds (or `bytes`).
    fn launch_of(
        &self,
        b: BufferBuilder,
        stream: u64,
        t0: u64,
        bytes: Option<Vec<u8>>,
        event: Option<u64>,
        by_collector: bool,
    ) -> Option<()> {
        let launch_id = crate::cuda::__private::next_launch_id();
        let mut header = *b.header();
        header.launch_id = launch_id;
        let mut made = bytes.unwrap_or_else(|| b.finish());
        // The device never writes the buffer header: the collector must.
        made[..header.size()].fill(0);
        let region = self.arena.alloc(made.len(), None);
        self.shared.count_launch(region.is_none());
        let region = region?;
        let span = tracing::info_span!("sim_kernel", gpu.launch_id = launch_id);
        span.in_scope(|| self.gpu.write(&self.memory, region.offset, &made));
        self.collector.send(Job {
            launch: LaunchInfo {
                launch_id,
                kernel: "sim_kernel".into(),
                host_launch_ns: t0,
                grid: header.grid,
                block: header.block,
                parent: span.id(),
                host_thread: "main".into(),
                ..Default::default()
            },
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
            span,
            mark: Mark {
                stream,
                event,
                by_collector,
            },
            stream: (by_collector && stream != 0).then(|| {
                let handle = self.streams.lock().entry(stream).or_default().clone();
                handle as Arc<dyn std::any::Any + Send + Sync>
            }),
            work: Work::Launch {
                header,
                place: Place {
                    memory: self.memory.clone(),
                    region,
                },
            },
        });
        Some(())
    }

    /// How many jobs hold `stream` (the collector has still to mark them).
    fn holding(&self, stream: u64) -> usize {
        self.streams
            .lock()
            .get(&stream)
            .map_or(0, |h| Arc::strong_count(h) - 1)
    }
}

/// The simulated kernel: 2 blocks × 2 warps, two ranges on two of the warps, the one
/// as recorder v1 writes them (records), the other as v2 does (a begin, a switch, an
/// end with its payload).
fn kernel(device: u32, t0: u64) -> BufferBuilder {
    let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 8);
    b.warp(0, 0)
        .unwrap()
        .sm(device, device)
        .range(1, t0, t0 + 100, 0)
        .range(2, t0 + 100, t0 + 400, 1);
    b.warp_v2(1, 1)
        .unwrap()
        .sm(2 + device)
        .begin(1, t0)
        .switch(2, t0 + 100)
        .end(2, t0 + 400)
        .payload(1);
    b
}

fn recorder_dispatch() -> (Recorder, Dispatch) {
    let rec = Recorder::default();
    (
        rec.clone(),
        Dispatch::new(tracing_subscriber::registry().with(rec)),
    )
}

/// A subscriber with a sink that counts batches: for more launches than the
/// plain spans' budget (`FALLBACK_SPAN_BUDGET`) would show.
fn sink_dispatch() -> (crate::test_support::TestSink, Dispatch) {
    let sink = crate::test_support::TestSink::default();
    let layer = crate::deliver::SinkLayer::new(sink.clone()).unwrap();
    (
        sink,
        Dispatch::new(tracing_subscriber::registry().with(layer)),
    )
}

/// Every launch is delivered, failed, skipped or left out by the sampling, each once.
fn assert_accounted(st: &ProfilerStats) {
    assert_eq!(
        st.launches,
        st.delivered + st.failed + st.skipped + st.unsampled,
        "launches not all accounted for: {st:?}"
    );
}

#[test]
fn two_simulated_devices_feed_one_subscriber() {
    let (rec, dispatch) = recorder_dispatch();
    let r0 = Rig::new(0, None);
    let r1 = Rig::new(1, None);
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..3 {
            r0.launch(7, 1_000_000 + i * 10_000, None, true).unwrap();
            r1.launch(7, 1_000_000 + i * 10_000, None, true).unwrap();
        }
    });
    r0.collector.flush().unwrap();
    r1.collector.flush().unwrap();
    for s in [&r0.shared, &r1.shared] {
        let st = s.stats();
        assert_eq!((st.delivered, st.events, st.failed), (3, 12, 0));
    }
    let seen = rec.0.lock();
    assert_eq!(seen.spans.len(), 24);
    assert!(seen
        .parents
        .iter()
        .all(|p| p.as_deref() == Some("sim_kernel")));
    for d in ["0", "1"] {
        let on: Vec<_> = seen.spans.iter().filter(|s| s["gpu.device"] == d).collect();
        assert_eq!(on.len(), 12);
        assert!(on
            .iter()
            .all(|s| s["gpu.thread"].starts_with(&format!("GPU {d} / SM "))));
    }
    // Launch ids are unique across the two devices' profilers.
    let ids: std::collections::BTreeSet<&String> =
        seen.spans.iter().map(|s| &s["gpu.launch_id"]).collect();
    assert_eq!(ids.len(), 6);
    // The calibration (host = device + 5000) was applied.
    let first = seen.spans.iter().find(|s| s["gpu.device"] == "0").unwrap();
    assert_eq!(first["gpu.start_ns"], "1005000");
}

#[test]
fn launches_wait_for_a_checkpoint_after_them() {
    let (_rec, dispatch) = recorder_dispatch();
    let steps = Steps {
        next: 0,
        offset: 5_000,
    };
    let r = Rig::new(0, Some((Box::new(steps), Duration::from_secs(3600))));
    tracing::dispatcher::with_default(&dispatch, || r.launch(1, 3_000_000, None, true));
    // Held: the only checkpoint (device 0) lies before the launch.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(r.shared.stats().delivered, 0);
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.calibrations), (1, 2));
    // The checkpoint taken for it (device 10 ms) brackets its events.
    let cal = r.shared.calibration();
    assert_eq!(cal.checkpoints().len(), 2);
    assert_eq!(cal.latest().map.anchor().0, 10_000_000);
}

#[test]
fn a_bad_buffer_is_an_error_at_flush_and_loses_nothing_else() {
    let (rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    tracing::dispatcher::with_default(&dispatch, || {
        r.launch(1, 1_000_000, None, true).unwrap();
        // A slot magic that is neither zero nor "SLOT".
        let mut bytes = BufferBuilder::new([2, 1, 1], [64, 1, 1], 8).finish();
        bytes[crate::format::BUFFER_HEADER_SIZE] = 0xAB;
        r.launch(1, 1_100_000, Some(bytes), true).unwrap();
        r.launch(1, 1_300_000, None, true).unwrap();
    });
    let err = r.collector.flush().unwrap_err();
    assert!(matches!(err, ProfilerError::Decode { .. }), "{err}");
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.failed), (2, 1));
    assert_eq!(rec.0.lock().spans.len(), 8);
    // The errors were handed out once; the bad launch's region came back zeroed.
    r.collector.flush().unwrap();
    assert_eq!(r.arena.used(), 0);
    assert!(r.gpu.memory.lock()[&r.memory.dptr].iter().all(|&b| b == 0));
}

#[test]
fn a_failed_copy_fails_its_launches_and_keeps_their_regions_out_of_use() {
    let (_rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    *r.gpu.fail_fetch.lock() = true;
    tracing::dispatcher::with_default(&dispatch, || r.launch(1, 1_000_000, None, true));
    assert!(r.collector.flush().is_err());
    tracing::dispatcher::with_default(&dispatch, || r.launch(1, 1_100_000, None, true));
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_eq!((st.launches, st.delivered, st.failed), (2, 1, 1));
    assert_accounted(&st);
}

#[test]
fn dropping_the_collector_delivers_everything() {
    let (rec, dispatch) = recorder_dispatch();
    let steps = Steps { next: 0, offset: 0 };
    let r = Rig::new(0, Some((Box::new(steps), Duration::from_secs(3600))));
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..5 {
            r.launch(1, 1_000_000 + i * 1_000, None, true).unwrap();
        }
    });
    let Rig {
        collector, shared, ..
    } = r;
    drop(collector);
    assert_eq!(shared.stats().delivered, 5);
    assert_eq!(rec.0.lock().spans.len(), 20);
}

#[test]
fn the_arena_wraps_around_and_every_launch_is_delivered_or_skipped() {
    let (sink, dispatch) = sink_dispatch();
    // Room for about three launches' buffers at a time.
    let one = kernel(0, 0).finish().len().next_multiple_of(ALIGN);
    let r = Rig::with(0, None, Calibration::exact(0, 5_000, 0.0), 3 * one);
    let mut skipped = 0;
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..200u64 {
            // Unfired launches pile up until the arena is full; then the
            // oldest fire, the collector brings them back, and room returns.
            if r.launch(1, 1_000_000 + i * 1_000, None, true).is_none() {
                skipped += 1;
                // Wait for the collector to bring regions back.
                let t = std::time::Instant::now();
                while r.arena.used() > one && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
    });
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_accounted(&st);
    assert_eq!(st.skipped, skipped);
    assert_eq!(st.delivered, 200 - skipped);
    assert_eq!(sink.0.lock().batches.len() as u64, st.delivered);
    assert_eq!(r.arena.used(), 0);
}

#[test]
fn a_launch_marked_without_an_event_is_delivered_and_its_region_comes_back() {
    let (rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    tracing::dispatcher::with_default(&dispatch, || {
        r.launch_marked(1, 1_000_000, None, None, false).unwrap();
        r.launch(1, 1_100_000, None, true).unwrap();
    });
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_accounted(&st);
    assert_eq!(st.delivered, 2);
    assert_eq!(rec.0.lock().spans.len(), 8);
    assert_eq!(r.arena.used(), 0);
}

#[test]
fn launches_on_two_streams_finish_out_of_order() {
    let (rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let (slow, fast) = tracing::dispatcher::with_default(&dispatch, || {
        let slow = r.launch(1, 1_000_000, None, false).unwrap();
        let fast: Vec<u64> = (0..3)
            .map(|i| r.launch(2, 1_010_000 + i * 1_000, None, true).unwrap())
            .collect();
        (slow, fast)
    });
    // Stream 2's launches are delivered while stream 1's is still running.
    let t = std::time::Instant::now();
    while r.shared.stats().delivered < 3 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(r.shared.stats().delivered, 3);
    assert_eq!(fast.len(), 3);
    // The slow launch's region still holds the arena's tail: nothing behind
    // it is reclaimed out of order, and nothing is lost.
    assert!(r.arena.used() > 0);
    r.gpu.fire(slow);
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.failed), (4, 0));
    assert_eq!(r.arena.used(), 0);
    assert_eq!(rec.0.lock().spans.len(), 16);
}

#[test]
fn finished_launches_are_brought_back_in_bulk() {
    let (rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let events: Vec<u64> = tracing::dispatcher::with_default(&dispatch, || {
        (0..50)
            .map(|i| r.launch(1, 1_000_000 + i * 1_000, None, false).unwrap())
            .collect()
    });
    // Let the collector see them all pending, then finish them at once.
    std::thread::sleep(Duration::from_millis(20));
    for e in events {
        r.gpu.fire(e);
    }
    r.collector.flush().unwrap();
    assert_eq!(r.shared.stats().delivered, 50);
    assert_eq!(r.gpu.fetched_places.load(Ordering::Relaxed), 50);
    // One fetch (maybe two, if the collector looked mid-way) for 50 launches.
    assert!(r.gpu.fetches.load(Ordering::Relaxed) <= 2);
    // Decoded on several threads, delivered whole and in launch order.
    let seen = rec.0.lock();
    assert_eq!(seen.spans.len(), 200);
    let ids: Vec<u64> = seen
        .spans
        .iter()
        .map(|s| s["gpu.launch_id"].parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 50);
}

#[test]
fn a_pass_gives_back_every_region_and_event_at_once() {
    // More launches than `Arena::free` gives back between two hand-overs of its lock.
    let r = Rig::new(0, None);
    let (_rec, dispatch) = recorder_dispatch();
    let events: Vec<u64> = tracing::dispatcher::with_default(&dispatch, || {
        (0..300)
            .map(|i| r.launch(1, 1_000_000 + i * 1_000, None, false).unwrap())
            .collect()
    });
    std::thread::sleep(Duration::from_millis(20));
    for e in events {
        r.gpu.fire(e);
    }
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.failed, st.skipped), (300, 0, 0));
    assert_eq!(r.arena.used(), 0);
    assert_eq!(r.gpu.released.load(Ordering::Relaxed), 300);
    // One call per pass that found launches finished (maybe two, as for the fetch).
    assert!(r.gpu.releases.load(Ordering::Relaxed) <= 2);
    assert_eq!(r.arena.alloc(1 << 20, None).map(|g| g.offset), Some(0));
}

#[test]
fn a_drain_racing_new_launches_loses_nothing() {
    let (sink, dispatch) = sink_dispatch();
    let one = kernel(0, 0).finish().len().next_multiple_of(ALIGN);
    let r = Arc::new(Rig::with(
        0,
        None,
        Calibration::exact(0, 5_000, 0.0),
        8 * one,
    ));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (r, dispatch) = (r.clone(), dispatch.clone());
            std::thread::spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    for i in 0..300 {
                        // Each thread's launches on its own stream, finishing
                        // at once or one launch late.
                        let fired = i % 3 != 0;
                        if let Some(e) = r.launch(t, 1_000_000 + i * 1_000, None, fired) {
                            if !fired {
                                r.gpu.fire(e);
                            }
                        }
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_eq!(st.launches, 1200);
    assert_accounted(&st);
    assert_eq!(st.failed, 0);
    assert_eq!(sink.0.lock().batches.len() as u64, st.delivered);
    assert_eq!(r.arena.used(), 0);
}

#[test]
fn two_simulated_devices_make_one_perfetto_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two-gpus.perfetto-trace");
    let (layer, guard) = crate::perfetto::PerfettoLayer::builder()
        .file(&path)
        .build()
        .unwrap();
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer));
    // Device time 1 ms lands 30 s from now: after the launch spans, however slowly
    // a loaded machine makes the two rigs (one second was not always enough).
    let host = HostClock::Boottime.now_ns() + 30_000_000_000;
    let map = |skew: u64| Calibration::exact(1_000_000, host + skew, 0.0);
    let r0 = Rig::with(0, None, map(0), 1 << 20);
    let r1 = Rig::with(1, None, map(3_000), 1 << 20);
    tracing::dispatcher::with_default(&dispatch, || {
        let _step = tracing::info_span!("step").entered();
        for i in 0..3 {
            r0.launch(1, 1_000_000 + i * 10_000, None, true).unwrap();
            r1.launch(1, 1_000_000 + i * 10_000, None, true).unwrap();
        }
    });
    r0.collector.flush().unwrap();
    r1.collector.flush().unwrap();
    let stats = guard.finish().unwrap();
    assert_eq!(
        (stats.kernels, stats.flows, stats.device_events),
        (6, 6, 24)
    );
    assert_eq!(r0.shared.stats().events + r1.shared.stats().events, 24);
    crate::test_support::perfetto_check::check(
        &path,
        &[
            "--expect-gpus",
            "2",
            "--expect-kernels",
            "6",
            "--expect-flows",
            "6",
            "--expect-device-slices",
            "24",
        ],
    );
}

mod drains;
mod graphs;
mod losses;
mod passes;
mod sampling;
mod snapshots;
mod watchdog;
