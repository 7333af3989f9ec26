//! The launching thread's host-side work for one profiled launch, without a driver
//! (issue #12), in ns per launch: `cargo bench --bench launch_path`.
//!
//! The arena's bookkeeping (`src/cuda/device/arena.rs`) and the launch's shared names
//! (`src/cuda/profiler/names.rs`) are the crate's own files, included here (they are pure Rust
//! and crate-private). The rest is modelled with the types the profiler uses, because
//! its files need CUDA or the collector's internals: the event pool's free list
//! (`device/cuda.rs`: `Mutex<Vec<usize>>`, popped per launch, pushed per finished launch by
//! the collector; its `cuEventRecord` is a driver call, not measured here), and the job
//! (`job.rs`: the same fields, a `LaunchInfo`, the dispatcher, the span, the mark, the
//! header and the place) sent unboxed through `std::sync::mpsc`, which allocates a
//! block per 31 messages.
//!
//! - `one thread/…`: each part alone (`region`: `Arena::capacity` and `alloc` and the
//!   launch counter; `send`: the channel; `event`: the pool's pop; `names`;
//!   `dispatcher`: its clone), then the whole launch (`all`: those, the job built and
//!   sent); the collector's side (receive, events back, regions back) runs untimed
//!   every 64 launches.
//! - `one thread/span, …`: the launch span as `gpu_profile!` makes it, entered,
//!   under the storm's subscriber (an `EnvFilter` and a `PerfettoLayer`
//!   writing to a file), under each of its parts alone, under the bare registry and
//!   under none, and with a field recorded after the launch (what `gpu_profile!`
//!   did with the launch time until it measured the cost); closing it (on the
//!   collector thread, after delivery) is not timed.
//! - `4 threads + collector/all`: four launching threads and a collector thread
//!   draining beside them as the real one does (every message it finds, then the
//!   regions back in one `Arena::free` and the events under one lock): wall time per
//!   launch of the slowest launching thread. On a machine with fewer than five cores
//!   the threads share cores, so compare it with `1 thread + collector/all`, run
//!   the same way with one launching thread.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use parking_lot::Mutex;
use tracing::Dispatch;
use tracing_gpu::batch::LaunchInfo;
use tracing_gpu::format::BufferHeader;
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

// Whole files: the launch path uses `Arena::{capacity, alloc, free}` of the first;
// their unit tests are not built here, which leaves their imports unused.
#[path = "../src/cuda/device/arena.rs"]
#[allow(dead_code, unused_imports)]
mod arena;

#[path = "../src/cuda/profiler/names.rs"]
#[allow(unused_imports)]
mod names;

use arena::{Arena, Region};

/// A storm launch's region: 8 blocks × 4 warps × 16 records (`storm --blocks 8`).
const REGION: usize = 9_472;
/// The arena: bookkeeping only (the ring allocates no memory), so large enough never
/// to fill however far the collector lags, and every launch takes the recorded path.
const ARENA: usize = 1 << 50;
/// Events made ahead (`Profiler`'s).
const EVENTS: usize = 1024;

/// `job.rs`'s `Job`, field for field, with a stand-in for the place's memory. Most
/// fields are only carried: moved through the channel and dropped by the collector.
#[allow(dead_code)]
struct Job {
    launch: LaunchInfo,
    dispatch: Dispatch,
    span: tracing::Span,
    mark: (u64, Option<u64>),
    header: BufferHeader,
    memory: Arc<()>,
    region: Region,
}

/// `collector.rs`'s message: jobs travel unboxed.
#[allow(clippy::large_enum_variant, dead_code)]
enum Msg {
    Job(Job),
    Flush,
    Stop,
}

/// What the launching threads and the collector share.
struct Path {
    arena: Arena,
    events: Mutex<Vec<usize>>,
    memory: Arc<()>,
    /// `Shared::launches` and `Shared::sent`: atomics each launch bumps.
    launches: AtomicU64,
    sent: AtomicU64,
}

impl Path {
    fn new() -> Arc<Path> {
        Arc::new(Path {
            arena: Arena::new(ARENA),
            events: Mutex::new((0..EVENTS).collect()),
            memory: Arc::new(()),
            launches: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        })
    }

    /// The region, as `Profiler::launch` takes it (the shape's check reads the capacity).
    fn region(&self) -> Option<Region> {
        black_box(self.arena.capacity());
        let r = self.arena.alloc(REGION, None);
        self.launches.fetch_add(1, Ordering::AcqRel);
        r
    }

    /// An event from the pool (`Events::record`, before its driver call).
    fn event(&self) -> u64 {
        self.events.lock().pop().unwrap_or(usize::MAX) as u64
    }

    /// The job, as `Profiler::launch` and `hand_over` build it.
    fn job(&self, region: Region, event: u64) -> Job {
        Job {
            launch: LaunchInfo {
                launch_id: region.seq,
                kernel: names::kernel_name("tiled_poly"),
                host_launch_ns: 1,
                host_complete_ns: 0,
                grid: [8, 1, 1],
                block: [128, 1, 1],
                parent: None,
                host_thread: names::thread_name(),
                part: None,
            },
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
            span: tracing::Span::none(),
            mark: (7, Some(event)),
            header: BufferHeader::default(),
            memory: self.memory.clone(),
            region,
        }
    }

    /// One whole launch's host work: `Collector::send` included.
    fn launch(&self, tx: &mpsc::Sender<Msg>) {
        let Some(region) = self.region() else {
            unreachable!("the arena never fills");
        };
        let event = self.event();
        let job = self.job(region, event);
        self.sent.fetch_add(1, Ordering::AcqRel);
        tx.send(Msg::Job(job)).expect("the receiver lives");
    }

    /// The collector's side for the jobs received: every region back at once, then
    /// every event under one lock (`Device::release`).
    fn collect(&self, jobs: &mut Vec<Job>) {
        self.arena.free(jobs.iter().map(|j| j.region));
        let mut events = self.events.lock();
        events.extend(jobs.drain(..).filter_map(|j| j.mark.1.map(|e| e as usize)));
    }
}

/// Receives what is queued (the jobs; other messages are dropped).
fn drain(rx: &mpsc::Receiver<Msg>, into: &mut Vec<Job>) {
    while let Ok(m) = rx.try_recv() {
        if let Msg::Job(j) = m {
            into.push(j);
        }
    }
}

/// `iters` runs of `part` on this thread, timed in runs of 64; between runs,
/// untimed, the collector's side takes back what they took (the jobs sent, and the
/// regions `part` leaves in its vector).
fn timed_in_runs(
    iters: u64,
    mut part: impl FnMut(&Path, &mpsc::Sender<Msg>, &mut Vec<Region>),
) -> Duration {
    let path = Path::new();
    let (tx, rx) = mpsc::channel();
    let (mut jobs, mut regions) = (Vec::new(), Vec::new());
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(64);
        let t = Instant::now();
        for _ in 0..n {
            part(&path, &tx, &mut regions);
        }
        total += t.elapsed();
        left -= n;
        drain(&rx, &mut jobs);
        path.collect(&mut jobs);
        path.arena.free(regions.drain(..));
    }
    total
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("one thread");
    g.bench_function("region", |b| {
        b.iter_custom(|iters| {
            timed_in_runs(iters, |p, _, regions| {
                regions.push(p.region().expect("room"))
            })
        })
    });
    // The channel alone: a message of the job's size (a slot is the enum's size
    // whatever the variant), a block allocated per 31.
    g.bench_function("send", |b| {
        b.iter_custom(|iters| {
            timed_in_runs(iters, |_, tx, _| {
                tx.send(Msg::Flush).expect("receiver lives")
            })
        })
    });
    g.bench_function("event", |b| {
        b.iter_custom(|iters| {
            let path = Path::new();
            let t = Instant::now();
            for _ in 0..iters {
                let e = path.event();
                path.events.lock().push(black_box(e) as usize);
            }
            // Half of it is the collector's push, as cheap as the pop.
            t.elapsed() / 2
        })
    });
    g.bench_function("names", |b| {
        b.iter(|| (names::kernel_name("tiled_poly"), names::thread_name()))
    });
    g.bench_function("dispatcher", |b| {
        b.iter(|| tracing::dispatcher::get_default(|d| d.clone()))
    });
    g.bench_function("all", |b| {
        b.iter_custom(|iters| timed_in_runs(iters, |p, tx, _| p.launch(tx)))
    });
    // The launch span as `gpu_profile!` makes it (named by the kernel, its two
    // fields), entered around the launch, under the storm's subscriber: its filter
    // and a Perfetto layer writing to a file; and once with a third field recorded
    // after the launch, as the launch time was until it proved a fifth of the
    // span's cost. The span is closed later on the collector thread: here it is
    // dropped untimed, in runs.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (layer, guard) = PerfettoLayer::builder()
        .file(dir.path().join("launch_path.perfetto-trace"))
        .build()
        .expect("a Perfetto layer");
    let perfetto = Dispatch::new(
        tracing_subscriber::registry()
            .with(EnvFilter::new("trace,tracing_gpu::device=info"))
            .with(layer),
    );
    let (layer, layer_guard) = PerfettoLayer::builder()
        .file(dir.path().join("layer_only.perfetto-trace"))
        .build()
        .expect("a Perfetto layer");
    let layer_only = Dispatch::new(tracing_subscriber::registry().with(layer));
    let filter_only = Dispatch::new(
        tracing_subscriber::registry().with(EnvFilter::new("trace,tracing_gpu::device=info")),
    );
    let registry = Dispatch::new(tracing_subscriber::registry());
    for (name, dispatch, recorded) in [
        ("span, Perfetto layer", &perfetto, false),
        (
            "span, Perfetto layer, a field recorded after",
            &perfetto,
            true,
        ),
        ("span, Perfetto layer alone", &layer_only, false),
        ("span, filter alone", &filter_only, false),
        ("span, registry alone", &registry, false),
        ("span, no subscriber", &Dispatch::none(), false),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                tracing::dispatcher::with_default(dispatch, || {
                    let mut spans = Vec::with_capacity(64);
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        let t = Instant::now();
                        // Ids repeat, as launches' batches end their flows: the
                        // Perfetto layer's set of open flows stays this large.
                        let id = i % 65_536;
                        let span = match recorded {
                            false => tracing::info_span!(
                                "tiled_poly",
                                gpu.launch_id = id,
                                gpu.device = 0u64
                            ),
                            true => tracing::info_span!(
                                "tiled_poly",
                                gpu.launch_id = id,
                                gpu.device = 0u64,
                                gpu.host_launch_ns = tracing::field::Empty,
                            ),
                        };
                        let entered = span.enter();
                        black_box(&entered);
                        drop(entered);
                        if recorded {
                            span.record("gpu.host_launch_ns", i);
                        }
                        spans.push(span);
                        total += t.elapsed();
                        if spans.len() == 64 {
                            spans.clear();
                        }
                    }
                    total
                })
            })
        });
    }
    g.finish();
    guard.finish().expect("the trace written");
    layer_guard.finish().expect("the trace written");
}

/// `threads` launching threads, `iters` launches each, beside a collector thread;
/// returns the slowest thread's time.
fn storm(threads: usize, iters: u64) -> Duration {
    let path = Path::new();
    let (tx, rx) = mpsc::channel();
    let start = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let (path, start) = (&path, &start);
        let collector = scope.spawn(move || {
            start.wait();
            let mut jobs = Vec::new();
            // Like the collector's loop: wait for a message, take everything queued,
            // then one pass; it ends when every launching thread has.
            while let Ok(m) = rx.recv() {
                if let Msg::Job(j) = m {
                    jobs.push(j);
                }
                drain(&rx, &mut jobs);
                path.collect(&mut jobs);
            }
        });
        let launchers: Vec<_> = (0..threads)
            .map(|_| {
                let tx = tx.clone();
                scope.spawn(move || {
                    start.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        path.launch(&tx);
                    }
                    t.elapsed()
                })
            })
            .collect();
        drop(tx);
        let slowest = launchers
            .into_iter()
            .map(|h| h.join().expect("launcher"))
            .max()
            .expect("a thread");
        collector.join().expect("collector");
        slowest
    })
}

fn threads(c: &mut Criterion) {
    for n in [1, 4] {
        let name = match n {
            1 => "1 thread + collector",
            _ => "4 threads + collector",
        };
        let mut g = c.benchmark_group(name);
        g.sample_size(20);
        g.bench_function("all", |b| b.iter_custom(|iters| storm(n, iters)));
        g.finish();
    }
}

criterion_group!(benches, one_thread, threads);
criterion_main!(benches);
