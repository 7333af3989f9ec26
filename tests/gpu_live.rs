//! The live path on a real GPU: profiler, collector, delivery, PerfettoLayer. Runs
//! the quickstart example's `run` and checks its trace with Perfetto's own schema
//! (`tests/check_perfetto.py`). Prints "skipped: no GPU" and passes where there is
//! no GPU.

#![cfg(feature = "cuda")]

#[allow(dead_code)]
#[path = "../examples/quickstart.rs"]
mod quickstart;

use std::process::Command;

fn gpu_present() -> bool {
    tracing_gpu::cuda::ensure_libraries().is_ok()
        && tracing_gpu::cuda::cudarc::driver::CudaContext::device_count().is_ok_and(|n| n > 0)
}

#[test]
fn live_trace_passes_the_schema_check() {
    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("live.perfetto-trace");
    let dump = dir.path().join("live.tgpu");
    let launches = 4;
    let s = quickstart::run(&trace, Some(&dump), launches, true).unwrap();
    assert_eq!(s.stats.delivered, launches as u64);
    assert_eq!((s.stats.failed, s.stats.skipped), (0, 0));
    assert!(s.stats.events > 0);
    assert_eq!(s.trace.device_events, s.stats.events);
    assert_eq!(s.trace.kernels, launches as u64);
    assert_eq!(s.trace.flows, launches as u64);

    // The capture reads back with every launch.
    let back = tracing_gpu::capture::Capture::read(&dump).unwrap();
    assert_eq!(back.launches.len(), launches as usize);
    assert!(back.devices[0]
        .calibrations
        .iter()
        .all(|c| !c.samples.is_empty()));
    assert!(
        back.host_spans
            .iter()
            .filter(|h| h.launch_id.is_some())
            .count()
            == launches as usize
    );

    let Ok(python) = std::env::var("TGPU_PYTHON") else {
        assert!(
            std::env::var("TGPU_REQUIRE_TOOLS").is_err(),
            "TGPU_REQUIRE_TOOLS is set but TGPU_PYTHON is not"
        );
        println!("skipped the schema check: TGPU_PYTHON not set (eval \"$(scripts/test-env.sh)\")");
        return;
    };
    let out = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/check_perfetto.py"
        ))
        .arg(&trace)
        .args(["--expect-gpus", "1"])
        .args(["--expect-kernels", &launches.to_string()])
        .args(["--expect-flows", &launches.to_string()])
        .args(["--expect-device-slices", &s.stats.events.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check_perfetto failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A profiler, the quickstart kernel, a stream of its own with event tracking off (so
/// that captures hold no event nodes), and the kernel's buffers and launch shape.
struct Rig {
    profiler: tracing_gpu::cuda::Profiler,
    kernel: quickstart::Kernel,
    stream: std::sync::Arc<tracing_gpu::cuda::cudarc::driver::CudaStream>,
    x: tracing_gpu::cuda::cudarc::driver::CudaSlice<f32>,
    y: tracing_gpu::cuda::cudarc::driver::CudaSlice<f32>,
    cfg: tracing_gpu::cuda::cudarc::driver::LaunchConfig,
    /// n, tiles, work
    args: [u32; 3],
}

impl Rig {
    fn new() -> Rig {
        use tracing_gpu::cuda::cudarc::driver::LaunchConfig;
        let profiler = tracing_gpu::cuda::Profiler::builder()
            .device(0)
            .registry(quickstart::registry())
            .capacity(32)
            .build()
            .unwrap();
        let kernel = quickstart::Kernel::load(&profiler, false).unwrap();
        let ctx = profiler.context().clone();
        let stream = ctx.new_stream().unwrap();
        let (blocks, threads, tiles, work) = (4u32, 128u32, 2u32, 64u32);
        let n = blocks * threads * tiles;
        let x = stream.clone_htod(&vec![0.5f32; n as usize]).unwrap();
        let y = stream.alloc_zeros::<f32>(n as usize).unwrap();
        stream.synchronize().unwrap();
        // SAFETY: x and y are used on `stream` alone and freed after its last
        // synchronize. (Tracking would put event nodes in the graph.)
        unsafe { ctx.disable_event_tracking() };
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: threads * 4,
        };
        Rig {
            profiler,
            kernel,
            stream,
            x,
            y,
            cfg,
            args: [n, tiles, work],
        }
    }

    /// One profiled launch of the kernel on the rig's stream (captured, if it captures).
    fn launch(&mut self) -> Result<(), tracing_gpu::cuda::ProfilerError> {
        let Rig {
            profiler,
            kernel,
            stream,
            x,
            y,
            cfg,
            args,
        } = self;
        // SAFETY: x and y hold n elements; 4 bytes of shared memory per thread.
        tracing_gpu::cuda::gpu_profile!(profiler, &*stream, "tiled_poly", *cfg, |trace| unsafe {
            kernel.launch(stream, *cfg, (&*x, y), *args, &trace)
        })
    }
}

/// The application's stream begins capturing a graph right after profiled launches
/// on it, before the collector has marked them (it marks launches when it looks,
/// every few milliseconds), and the capture stays open across the collector's looks:
/// the collector must mark those launches only after the capture, so that the
/// capture stays valid and nothing fails; every launch and replay is delivered or
/// counted as skipped.
#[test]
fn a_capture_begun_right_after_profiled_launches_on_its_stream_stays_valid() {
    use tracing_gpu::cuda::cudarc::driver::sys;

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    let mut rig = Rig::new();
    let stream = rig.stream.clone();
    let rounds = 30;
    let (direct, nodes) = (3, 2);
    for _ in 0..rounds {
        for _ in 0..direct {
            rig.launch().unwrap();
        }
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .unwrap();
        let captured = (0..nodes).try_for_each(|_| rig.launch());
        // Longer than the collector's look interval (5 ms): it looks while the
        // stream captures, with the direct launches still unmarked.
        std::thread::sleep(std::time::Duration::from_millis(12));
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        captured.unwrap();
        let graph = graph.expect("the capture stayed valid").expect("a graph");
        let graph = rig.profiler.graph(graph).unwrap();
        rig.profiler
            .launch_graph(&graph, &stream, "captured")
            .unwrap();
        stream.synchronize().unwrap();
    }
    let profiler = &rig.profiler;
    profiler.flush().unwrap();
    let st = profiler.stats();
    assert_eq!(st.failed, 0, "{st:?}");
    assert_eq!(st.replays, rounds);
    assert_eq!(st.launches, rounds * (direct + nodes), "{st:?}");
    assert_eq!(st.delivered + st.skipped, st.launches, "{st:?}");
    assert!(st.delivered >= rounds * direct, "{st:?}");
}

/// A profiled graph replayed once with `cuGraphLaunch` (cudarc's `CudaGraph::launch`)
/// between replays made through `Profiler::launch_graph`: the device's count of its
/// replays runs ahead of the host's, so the next flush returns `GraphOutOfStep` naming
/// the graph, `launch_graph` refuses it from then on, and every replay the profiler
/// made was delivered or counted as skipped.
#[test]
fn a_graph_replayed_outside_launch_graph_is_an_error_and_refused() {
    use tracing_gpu::cuda::cudarc::driver::sys;
    use tracing_gpu::cuda::ProfilerError;

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    let mut rig = Rig::new();
    let stream = rig.stream.clone();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .unwrap();
    for _ in 0..2 {
        rig.launch().unwrap();
    }
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    let profiler = &rig.profiler;
    let graph = profiler.graph(graph).unwrap();
    for _ in 0..3 {
        profiler.launch_graph(&graph, &stream, "step").unwrap();
        stream.synchronize().unwrap();
    }
    profiler.flush().unwrap();
    assert_eq!(profiler.stats().delivered, 6, "{:?}", profiler.stats());

    graph.graph().launch().unwrap();
    profiler.launch_graph(&graph, &stream, "step").unwrap();
    stream.synchronize().unwrap();
    let err = profiler.flush().unwrap_err();
    assert!(
        matches!(&err, ProfilerError::GraphOutOfStep { graph, replay: 3, device: 5, launched: 4 } if graph == "step"),
        "{err}"
    );
    let refused = profiler.launch_graph(&graph, &stream, "step").unwrap_err();
    assert!(
        matches!(refused, ProfilerError::GraphOutOfStep { .. }),
        "{refused}"
    );
    stream.synchronize().unwrap();
    profiler.flush().unwrap();
    let st = profiler.stats();
    assert_eq!((st.replays, st.launches), (4, 8), "{st:?}");
    assert_eq!((st.delivered, st.skipped, st.failed), (6, 2, 0), "{st:?}");
}

/// A `TracedKernel` runs the recorder's build when the launch records, and the
/// production build (no recorder) when its trace is null; a captured launch (a graph
/// node) records. Which build ran, the kernel writes into `which`.
#[test]
fn a_traced_kernel_runs_the_production_build_when_nothing_is_recorded() {
    use tracing_gpu::cuda::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
    use tracing_gpu::cuda::{gpu_profile, TracedKernel};
    use tracing_gpu::{KernelArg, KernelBuild};

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    const SOURCE: &str = r#"
#include "tracing_gpu.cuh"
TGPU_EVENT(Mark, 1);
extern "C" __global__ void mark(unsigned* which TGPU_TRACE_PARAM) {
    TGPU_RECORDER(rec, Mark);
    rec.begin<Mark>();
#if defined(TGPU_ENABLED) && TGPU_ENABLED
    which[blockIdx.x * blockDim.x + threadIdx.x] = 1u;
#else
    which[blockIdx.x * blockDim.x + threadIdx.x] = 2u;
#endif
    rec.end<Mark>();
}
extern "C" __global__ void spin(unsigned long long ns) {
    const unsigned long long t0 = tgpu::globaltimer();
    while (tgpu::globaltimer() - t0 < ns) {}
}
"#;
    let profiler = tracing_gpu::cuda::Profiler::builder()
        .device(0)
        .events([(1, "mark")])
        .build()
        .unwrap();
    let build = KernelBuild::new("mark.cu", profiler.arch());
    let kernel = TracedKernel::load(profiler.context(), SOURCE, &build, "mark").unwrap();
    let stream = profiler.context().new_stream().unwrap();
    let (blocks, threads) = (3u32, 64u32);
    let mut which = stream
        .alloc_zeros::<u32>((blocks * threads) as usize)
        .unwrap();
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let ran = |trace: &KernelArg, which: &mut CudaSlice<u32>| {
        // SAFETY: `which` holds one word per thread.
        unsafe {
            kernel
                .launch_builder(&stream, trace)
                .arg(&mut *which)
                .launch(cfg)
                .unwrap()
        };
        let got = stream.clone_dtoh(which).unwrap();
        assert!(got.iter().all(|&w| w == got[0]), "{got:?}");
        got[0]
    };
    assert_eq!(
        ran(&KernelArg::default(), &mut which),
        2,
        "a null trace: production"
    );
    let mut traced = 0;
    gpu_profile!(profiler, &stream, "mark", cfg, |trace| {
        traced = ran(&trace, &mut which);
        Ok::<_, tracing_gpu::cuda::cudarc::driver::DriverError>(())
    })
    .unwrap();
    assert_eq!(traced, 1, "a profiled launch: the recorder's build");

    // A graph node: its trace points at the word each replay's prologue writes.
    use tracing_gpu::cuda::cudarc::driver::sys;
    stream.memset_zeros(&mut which).unwrap();
    stream.synchronize().unwrap();
    // SAFETY: `which` is used on `stream` alone. (Tracking would put event nodes in
    // the graph.)
    unsafe { profiler.context().disable_event_tracking() };
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .unwrap();
    let captured = gpu_profile!(profiler, &stream, "mark", cfg, |trace| unsafe {
        kernel
            .launch_builder(&stream, &trace)
            .arg(&mut which)
            .launch(cfg)
    });
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured.unwrap();
    let graph = profiler.graph(graph.unwrap().expect("a graph")).unwrap();
    let replay = |recorded: bool, want: u32| {
        match recorded {
            true => profiler.launch_graph(&graph, &stream, "marks").unwrap(),
            false => profiler.launch_graph_unrecorded(&graph, &stream).unwrap(),
        }
        let got = stream.clone_dtoh(&which).unwrap();
        assert!(
            got.iter().all(|&w| w == want),
            "recorded {recorded}: {got:?}"
        );
    };
    replay(true, 1);
    // Without the recorder: the production build, no prologue; then recorded again, the
    // device's replay count still agreeing with the host's.
    assert!(graph.replays_unrecorded());
    replay(false, 2);
    replay(true, 1);

    // Behind a kernel that holds the stream for 300 ms, the first replays fill every
    // replay region (4, the default) before any has run: `launch_graph` knows the next
    // two cannot record and replays the production build, which runs last.
    profiler.flush().unwrap();
    let spin = profiler
        .context()
        .load_module(tracing_gpu::compile(SOURCE, &build).unwrap())
        .unwrap()
        .load_function("spin")
        .unwrap();
    // SAFETY: `spin` takes one u64.
    unsafe {
        stream
            .launch_builder(&spin)
            .arg(&300_000_000u64)
            .launch(LaunchConfig::for_num_elems(1))
            .unwrap()
    };
    for _ in 0..6 {
        profiler.launch_graph(&graph, &stream, "marks").unwrap();
    }
    let got = stream.clone_dtoh(&which).unwrap();
    assert!(got.iter().all(|&w| w == 2), "the last replay: {got:?}");

    profiler.flush().unwrap();
    let st = profiler.stats();
    assert_eq!((st.replays, st.launches), (9, 10), "{st:?}");
    assert_eq!((st.delivered, st.skipped, st.failed), (7, 3, 0), "{st:?}");
    // Two warps per block, one event each, in each recorded launch.
    assert_eq!(st.events, 7 * (blocks * 2) as u64, "{st:?}");
}

/// Per warp, in events: delivered + lost = produced, for v1 and v2, in fixed slots too
/// small for what each warp makes (issue #29's check). Every warp makes a different
/// number of events, of every shape: begin/end with and without payloads, nesting, a
/// `switch_to` chain, instants; the kernel writes how many it made into `made`.
#[test]
fn each_warp_counts_its_lost_events_exactly_in_fixed_slots() {
    use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
    use tracing_gpu::format::{wire, BufferHeader};
    use tracing_gpu::{compile, Buffer, KernelArg, KernelBuild};

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    const SOURCE: &str = r#"
#include "tracing_gpu.cuh"
TGPU_EVENT(A, 1);
TGPU_EVENT(B, 2);
TGPU_EVENT(C, 3);
extern "C" __global__ void losses(unsigned* made TGPU_TRACE_PARAM) {
    TGPU_RECORDER(rec, A, B, C);
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned rounds = 1 + warp % 13;
    unsigned n = 0;
    for (unsigned r = 0; r < rounds; ++r) {
        rec.begin<A>();
        rec.begin<B>();
        rec.end<B>(r);                 // B, with a payload
        rec.switch_to<A, C>();         // A ends, C opens
        rec.switch_to<C, A>(r);        // C ends (payload), A opens
        rec.instant<B>(r);
        rec.end<A>();
        n += 5;
    }
    if ((threadIdx.x & 31) == 0) made[warp] = n;
}
"#;
    let ctx = tracing_gpu::cuda::cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let arch = match ctx.compute_capability().unwrap() {
        (9, 0) => "sm_90",
        (8, 9) => "sm_89",
        (8, _) => "sm_80",
        _ => "sm_75",
    };
    let (blocks, threads) = (6u32, 128u32);
    let warps = blocks * threads / 32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    for format in [1, 2] {
        let build = KernelBuild::new("losses.cu", arch)
            .define("TGPU_ENABLED=1")
            .define(format!("TGPU_FORMAT={format}"));
        let module = ctx.load_module(compile(SOURCE, &build).unwrap()).unwrap();
        let f = module.load_function("losses").unwrap();
        for capacity in [0u32, 3, 7, 20, 200] {
            let size = wire::buffer_size(warps, capacity).unwrap();
            let buf = stream.alloc_zeros::<u8>(size).unwrap();
            let mut made = stream.alloc_zeros::<u32>(warps as usize).unwrap();
            let trace = KernelArg {
                base: {
                    use tracing_gpu::cuda::cudarc::driver::DevicePtr;
                    let (p, _sync) = buf.device_ptr(&stream);
                    p
                },
                capacity,
                slot_count: warps,
                ..KernelArg::default()
            };
            // SAFETY: `made` holds a word per warp; the buffer has a slot per warp.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&mut made)
                    .arg(&trace)
                    .launch(cfg)
                    .unwrap()
            };
            let mut bytes = stream.clone_dtoh(&buf).unwrap();
            let made = stream.clone_dtoh(&made).unwrap();
            BufferHeader {
                version: wire::VERSION,
                slot_capacity: capacity,
                slot_count: warps,
                warps_per_block: threads / 32,
                launch_id: 1,
                grid: [blocks, 1, 1],
                block: [threads, 1, 1],
                flags: 0,
                sampling: Default::default(),
            }
            .write_to(&mut bytes[..wire::BUFFER_HEADER_SIZE]);
            let decoded = Buffer::decode(&bytes, None)
                .unwrap_or_else(|e| panic!("v{format}, capacity {capacity}: {e}"));
            let mut seen = 0;
            for slot in decoded.slots() {
                let (got, lost) = (slot.events().count() as u64, u64::from(slot.events_lost()));
                assert_eq!(
                    got + lost,
                    u64::from(made[slot.index as usize]),
                    "v{format}, capacity {capacity}, warp {}: {got} delivered + {lost} lost",
                    slot.index
                );
                seen += 1;
            }
            assert_eq!(seen, warps, "v{format}, capacity {capacity}: slots flushed");
        }
    }
}

/// Per warp, in events, streamed: delivered + lost = produced, for a kernel whose warps
/// outrun their rings (issue #29's check). Each warp makes a different number of events
/// (a `switch_to` chain, payloads on some) as fast as it can into rings of 32 records,
/// which the drain reads every millisecond; the kernel writes how many it made.
#[test]
fn each_warp_counts_its_lost_events_exactly_when_streamed() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use tracing_gpu::batch::{Batch, BatchSink};
    use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
    use tracing_gpu::deliver::SinkLayer;
    use tracing_gpu::{compile, gpu_profile, KernelBuild};
    use tracing_subscriber::layer::SubscriberExt;

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    const SOURCE: &str = r#"
#include "tracing_gpu.cuh"
TGPU_EVENT(A, 1);
TGPU_EVENT(B, 2);
extern "C" __global__ void outrun(unsigned* made TGPU_TRACE_PARAM) {
    TGPU_RECORDER(rec, A, B);
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned n = 3000 + 37 * warp;
    rec.begin<A>();
    for (unsigned i = 0; i < n; ++i) {
        if (i % 2 == 0) {
            if (i % 7 == 0) rec.switch_to<A, B>(i); else rec.switch_to<A, B>();
        } else {
            rec.switch_to<B, A>();
        }
    }
    if (n % 2 == 0) rec.end<A>(); else rec.end<B>();
    if ((threadIdx.x & 31) == 0) made[warp] = n + 1;
}
"#;
    /// Per warp slot: events delivered and events lost, over every part.
    #[derive(Clone, Default)]
    struct Tally(Arc<Mutex<HashMap<u32, (u64, u64)>>>);
    impl BatchSink for Tally {
        fn on_batch(&self, batch: &Arc<Batch>) {
            let mut t = self.0.lock().unwrap();
            for slot in batch.buffer.view().slots() {
                let e = t.entry(slot.index).or_default();
                e.0 += slot.events().count() as u64;
                e.1 += u64::from(slot.events_lost());
            }
        }
        fn flush(&self) {}
    }
    let tally = Tally::default();
    let subscriber =
        tracing_subscriber::registry().with(SinkLayer::new(tally.clone()).expect("a sink slot"));
    let _default = tracing::subscriber::set_default(subscriber);
    let profiler = tracing_gpu::cuda::Profiler::builder()
        .device(0)
        .events([(1, "a"), (2, "b")])
        .stream_capacity(32)
        .build()
        .unwrap();
    let build = KernelBuild::new("outrun.cu", profiler.arch())
        .define("TGPU_ENABLED=1")
        .define("TGPU_STREAM=1");
    let module = profiler
        .context()
        .load_module(compile(SOURCE, &build).unwrap())
        .unwrap();
    let f = module.load_function("outrun").unwrap();
    let stream = profiler.context().new_stream().unwrap();
    let (blocks, threads) = (8u32, 128u32);
    let warps = blocks * threads / 32;
    let mut made = stream.alloc_zeros::<u32>(warps as usize).unwrap();
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `made` holds a word per warp.
    gpu_profile!(
        profiler.streamed(),
        &stream,
        "outrun",
        cfg,
        |trace| unsafe {
            stream
                .launch_builder(&f)
                .arg(&mut made)
                .arg(&trace)
                .launch(cfg)
        }
    )
    .unwrap();
    stream.synchronize().unwrap();
    profiler.flush().unwrap();
    let made = stream.clone_dtoh(&made).unwrap();
    let t = tally.0.lock().unwrap();
    assert_eq!(t.len(), warps as usize, "every warp delivered a part");
    let mut lost = 0;
    for (warp, &(got, gone)) in t.iter() {
        assert_eq!(
            got + gone,
            u64::from(made[*warp as usize]),
            "warp {warp}: {got} delivered + {gone} lost"
        );
        lost += gone;
    }
    assert!(lost > 0, "the warps outran their rings");
    let st = profiler.stats();
    assert_eq!(
        st.events + st.events_lost,
        made.iter().map(|&m| u64::from(m)).sum::<u64>()
    );
}

/// Issue #32: a pipeline that deadlocks on purpose (`kernels/examples/deadlock.cu`, built
/// with `TGPU_WATCH=1`) in one block of 64; its waits give up after 3 s. The watchdog's
/// snapshot, 1 s after the launch, comes within a second of that and names each stuck
/// warp's phase and the payload it closed last, as the kernel reports them when it gives
/// up; the other 63 blocks are done. The stuck warps' timelines arrive whole: each
/// stuck consumer's last `wait`, longer than 2³¹ ns (2.1 s), is one range.
#[test]
fn a_deadlocked_pipeline_shows_its_stuck_warps_at_the_deadline() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
    use tracing_gpu::registry::EventRegistry;
    use tracing_gpu::{compile, gpu_profile, KernelBuild};
    use tracing_subscriber::layer::SubscriberExt;

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    /// The watchdog's ERROR events: their message and when they came.
    #[derive(Clone, Default)]
    struct Alarms(Arc<Mutex<Vec<(String, Instant)>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Alarms {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            if e.metadata().target() == "tracing_gpu::watchdog" {
                assert_eq!(*e.metadata().level(), tracing::Level::ERROR);
                let mut m = Message(String::new());
                e.record(&mut m);
                self.0.lock().unwrap().push((m.0, Instant::now()));
            }
        }
    }
    let alarms = Alarms::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(alarms.clone()));
    let names = [(1, "load"), (2, "wait"), (3, "compute")];
    let registry = EventRegistry::from_pairs(names)
        .and_then(|r| r.with_payload(1, "k_tile"))
        .and_then(|r| r.with_payload(3, "k_tile"))
        .unwrap();
    let deadline = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("deadlock.tgpu");
    let profiler = tracing_gpu::cuda::Profiler::builder()
        .device(0)
        .registry(registry)
        .watchdog(deadline)
        .capture_to(&capture)
        .build()
        .unwrap();
    let build = KernelBuild::new("deadlock.cu", profiler.arch())
        .define("TGPU_ENABLED=1")
        .define("TGPU_WATCH=1");
    let source = include_str!("../kernels/examples/deadlock.cu");
    let module = profiler
        .context()
        .load_module(compile(source, &build).unwrap())
        .unwrap();
    let f = module.load_function("deadlock").unwrap();
    let stream = profiler.context().new_stream().unwrap();
    let (blocks, threads, tiles) = (64u32, 128u32, 64u32);
    // The stuck warps give up after 3 s: longer than the 2³¹ ns (2.1 s) that a chunk's
    // entries may be apart, so that the recorder must end a chunk before the give-up
    // (docs/format.md, "Reading a ring"), or the flush fails on an undecodable chunk.
    let (bad_block, bad_tile, limit_ns) = (5u32, 17u32, 3_000_000_000u64);
    let warps = blocks * threads / 32;
    let mut report = stream.alloc_zeros::<u32>(3 * warps as usize).unwrap();
    let mut out = stream
        .alloc_zeros::<f32>((blocks * (threads - 32)) as usize)
        .unwrap();
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let launched = Instant::now();
    // SAFETY: `report` holds 3 words per warp, `out` a float per consumer thread.
    gpu_profile!(
        profiler.streamed(),
        &stream,
        "deadlock",
        cfg,
        |trace| unsafe {
            stream
                .launch_builder(&f)
                .arg(&mut out)
                .arg(&mut report)
                .arg(&tiles)
                .arg(&bad_block)
                .arg(&bad_tile)
                .arg(&limit_ns)
                .arg(&trace)
                .launch(cfg)
        }
    )
    .unwrap();
    stream.synchronize().unwrap();
    let ran = launched.elapsed();
    profiler.flush().unwrap();
    assert!(
        ran >= Duration::from_nanos(limit_ns),
        "the kernel gave up after {ran:?}"
    );
    // What the kernel knows: per stuck warp, its phase and what it closed last.
    let report = stream.clone_dtoh(&report).unwrap();
    let mut stuck: BTreeMap<(u32, u32, u32), u32> = BTreeMap::new();
    for w in report.chunks(3).filter(|w| w[0] != 0) {
        *stuck.entry((w[0], w[1], w[2])).or_default() += 1;
    }
    let consumers = threads / 32 - 1;
    assert_eq!(
        stuck,
        BTreeMap::from([((1, 1, bad_tile + 1), 1), ((2, 3, bad_tile - 1), consumers)]),
        "the kernel's own report"
    );
    let got = alarms.0.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "one snapshot (no period set): {got:?}");
    let (text, at) = &got[0];
    let after = at.duration_since(launched);
    assert!(
        after >= deadline && after < deadline + Duration::from_secs(1),
        "the snapshot came {after:?} after the launch:\n{text}"
    );
    let name = |id: u32| names.iter().find(|n| n.0 == id as u16).unwrap().1;
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(lines.len(), 2 + stuck.len(), "{text}");
    for ((phase, closed, payload), n) in &stuck {
        let warps = if *n == 1 { "warp" } else { "warps" };
        let head = format!("{n} {warps} in {} for ", name(*phase));
        let tail = format!(", after {} (k_tile {payload})", name(*closed));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&head) && l.ends_with(&tail)),
            "no line \"{head}... {tail}\" in:\n{text}"
        );
    }
    assert_eq!(lines.last(), Some(&"63 blocks done"), "{text}");
    assert_eq!(profiler.stats().snapshots, 1);
    // The capture keeps it, for `tracing-gpu report`.
    drop(profiler);
    let back = tracing_gpu::Capture::read(&capture).unwrap();
    let kept: Vec<_> = back
        .snapshots()
        .map(|(_, n, t)| (n, t.to_string()))
        .collect();
    assert_eq!(kept, [(0, text.clone())]);
    // Each stuck consumer's timeline, whole: its last `wait` (the one it gave up in, on
    // bad_tile) lasted about limit_ns, after a `compute` of bad_tile - 1.
    let batches = back.batches().unwrap();
    for warp in 1..=consumers {
        let mut events = Vec::new();
        for b in &batches {
            for slot in b.buffer.view().slots() {
                if (slot.header.block_linear, slot.header.warp) == (bad_block, warp) {
                    events.extend(slot.events());
                }
            }
        }
        let computes = events.iter().filter(|e| e.id == 3).count() as u32;
        assert_eq!(computes, bad_tile, "warp {warp}: its compute ranges");
        let last = events.last().unwrap();
        let waited = last.end_ns - last.start_ns;
        assert!(
            last.id == 2 && waited > (1 << 31) && waited <= limit_ns,
            "warp {warp}: its last event {last:?}, {waited} ns"
        );
    }
    // It keeps every warp (the text above is told again from them), which `report
    // --svg` draws: each stuck phase's warps and the done ones counted.
    let picture = tracing_gpu::Timeline::new()
        .snapshots_svg(&back, None)
        .expect("the warps kept");
    let mut legend = vec![format!(">done: {} warps<", 63 * (threads / 32))];
    for ((phase, _, _), n) in &stuck {
        let warps = if *n == 1 { "warp" } else { "warps" };
        legend.push(format!(">{}: {n} {warps}<", name(*phase)));
    }
    for l in legend {
        assert!(picture.contains(&l), "{l} in:\n{picture}");
    }
}

/// Sampling on the device (issue #31): a kernel recorded with a warp mask and a block
/// stride, v1, v2 and v2 streamed, one launch in two. Every sampled warp arrives with
/// exactly the events it made (their payloads say which), no other warp arrives at all,
/// and the launch left out is counted, not delivered; then as a graph node, v1 and v2,
/// replayed twice.
#[test]
fn a_sampled_launch_records_its_sampled_warps_exactly_and_no_other() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use tracing_gpu::batch::{Batch, BatchSink};
    use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
    use tracing_gpu::cuda::Sampler;
    use tracing_gpu::deliver::SinkLayer;
    use tracing_gpu::format::Sampling;
    use tracing_gpu::{compile, gpu_profile, KernelBuild};
    use tracing_subscriber::layer::SubscriberExt;

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    // Every warp makes 2 + (its index mod 5) ranges, payload block * 1000 + warp * 10 + k,
    // and writes how many it made.
    const SOURCE: &str = r#"
#include "tracing_gpu.cuh"
TGPU_EVENT(A, 1);
extern "C" __global__ void sampled(unsigned* made TGPU_TRACE_PARAM) {
    TGPU_RECORDER(rec, A);
    const unsigned warp = threadIdx.x >> 5;
    const unsigned n = 2 + (blockIdx.x * (blockDim.x >> 5) + warp) % 5;
    for (unsigned k = 0; k < n; ++k) {
        rec.begin<A>();
        rec.end<A>(blockIdx.x * 1000 + warp * 10 + k);
    }
    if ((threadIdx.x & 31) == 0) made[blockIdx.x * (blockDim.x >> 5) + warp] = n;
}
"#;
    /// Each delivered slot's (block, warp) → its payloads, events lost, and the
    /// sampling its batch says.
    type Seen = BTreeMap<(u32, u32), (Vec<u32>, u32, Sampling)>;
    #[derive(Clone, Default)]
    struct Keep(Arc<Mutex<Seen>>);
    impl BatchSink for Keep {
        fn on_batch(&self, batch: &Arc<Batch>) {
            let buffer = batch.buffer.view();
            let sampling = buffer.header().sampling;
            let mut seen = self.0.lock().unwrap();
            // A streamed warp may come in several parts, in order.
            for slot in buffer.slots() {
                let at = (slot.header.block_linear, slot.header.warp);
                let e = seen.entry(at).or_insert((Vec::new(), 0, sampling));
                e.0.extend(slot.events().map(|e| e.payload));
                e.1 += slot.events_lost();
                assert_eq!(e.2, sampling, "{at:?}: another sampling");
            }
        }
        fn flush(&self) {}
    }
    let keep = Keep::default();
    let subscriber =
        tracing_subscriber::registry().with(SinkLayer::new(keep.clone()).expect("a sink slot"));
    let _default = tracing::subscriber::set_default(subscriber);
    let profiler = tracing_gpu::cuda::Profiler::builder()
        .device(0)
        .events([(1, "a")])
        .build()
        .unwrap();
    let stream = profiler.context().new_stream().unwrap();
    let (blocks, warps) = (10u32, 8u32);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (warps * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    // What the sampled warps made, as the kernel counted it in `made`.
    let expected = |made: &[u32], sampling: Sampling| {
        let mut expected = Seen::new();
        for block in [1, 4, 7] {
            for warp in [0, 4, 7] {
                let n = made[(block * warps + warp) as usize];
                let payloads = (0..n).map(|k| block * 1000 + warp * 10 + k).collect();
                expected.insert((block, warp), (payloads, 0, sampling));
            }
        }
        expected
    };
    // Warps 0, 4 and 7 (one per warpgroup, and the last) of blocks 1, 4 and 7.
    let sampling = Sampling::default()
        .warps(0b1001_0001)
        .blocks(3, 1)
        .launches(2);
    let builds = [("v1", 1, false), ("v2", 2, false), ("v2 streamed", 2, true)];
    for (name, format, streamed) in builds {
        let build = KernelBuild::new("sampled.cu", profiler.arch())
            .define("TGPU_ENABLED=1")
            .define(format!("TGPU_FORMAT={format}"))
            .define(format!("TGPU_STREAM={}", u8::from(streamed)));
        let module = profiler
            .context()
            .load_module(compile(SOURCE, &build).unwrap())
            .unwrap();
        let f = module.load_function("sampled").unwrap();
        let sampler = Sampler::new(sampling);
        let mut made = stream
            .alloc_zeros::<u32>((blocks * warps) as usize)
            .unwrap();
        // The first launch records, the second (one in two) is left out.
        for _ in 0..2 {
            let run = |trace| unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&mut made)
                    .arg(&trace)
                    .launch(cfg)
            };
            let streaming = profiler.streamed().sampled(&sampler);
            match streamed {
                true => gpu_profile!(streaming, &stream, "sampled", cfg, run),
                false => gpu_profile!(profiler.sampled(&sampler), &stream, "sampled", cfg, run),
            }
            .unwrap();
        }
        let made = stream.clone_dtoh(&made).unwrap();
        profiler.flush().unwrap();
        let seen = std::mem::take(&mut *keep.0.lock().unwrap());
        assert_eq!(seen, expected(&made, sampling), "{name}");
    }
    let st = profiler.stats();
    assert_eq!(
        (st.launches, st.delivered, st.unsampled),
        (6, 3, 3),
        "{st:?}"
    );
    assert_eq!((st.skipped, st.failed, st.events_lost), (0, 0, 0), "{st:?}");

    // A graph node captured with the sampler samples the same blocks and warps at
    // every replay (one in n applies to the capture: this node records).
    use tracing_gpu::cuda::cudarc::driver::sys;
    // One stream: no slice needs cudarc's events, and with them the capture's launch
    // would wait on `made`'s zeroing, recorded before the capture (an isolation error).
    // SAFETY: every use of the slices below is on `stream`, in order.
    unsafe { profiler.context().disable_event_tracking() };
    let every = sampling.launches(0);
    let sampler = Sampler::new(every);
    for format in [1, 2] {
        let build = KernelBuild::new("sampled.cu", profiler.arch())
            .define("TGPU_ENABLED=1")
            .define(format!("TGPU_FORMAT={format}"));
        let module = profiler
            .context()
            .load_module(compile(SOURCE, &build).unwrap())
            .unwrap();
        let f = module.load_function("sampled").unwrap();
        let mut made = stream
            .alloc_zeros::<u32>((blocks * warps) as usize)
            .unwrap();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .unwrap();
        let run = |trace| unsafe {
            stream
                .launch_builder(&f)
                .arg(&mut made)
                .arg(&trace)
                .launch(cfg)
        };
        let captured = gpu_profile!(profiler.sampled(&sampler), &stream, "sampled", cfg, run);
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        captured.unwrap();
        let graph = profiler.graph(graph.unwrap().expect("a graph")).unwrap();
        for replay in 0..2 {
            profiler
                .launch_graph(&graph, &stream, "sampled graph")
                .unwrap();
            stream.synchronize().unwrap();
            profiler.flush().unwrap();
            let made = stream.clone_dtoh(&made).unwrap();
            let seen = std::mem::take(&mut *keep.0.lock().unwrap());
            assert_eq!(
                seen,
                expected(&made, every),
                "graph node, v{format}, replay {replay}"
            );
        }
    }
    let st = profiler.stats();
    assert_eq!((st.skipped, st.failed, st.events_lost), (0, 0, 0), "{st:?}");
}

/// Issue #32: a persistent kernel that crawls for 10 s (each warp inside `loop`, a
/// `work` then a `pause` of 1 ms each, over and over), built with `TGPU_WATCH=1`,
/// streamed, with a snapshot every second. Each snapshot agrees with the trace streamed
/// afterwards (`WatchdogSnapshot::disagreements`): every running warp's open ranges began
/// when the trace says, and it closed last what the trace ended last, with its payload.
/// Only the innermost depth of a warp's cell changes while it runs, so a cell read while
/// the warp moves is still one state of it.
#[test]
fn a_crawling_kernels_snapshots_agree_with_its_streamed_trace() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tracing_gpu::batch::{Batch, BatchSink};
    use tracing_gpu::cuda::__private::WatchdogSnapshot;
    use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
    use tracing_gpu::deliver::SinkLayer;
    use tracing_gpu::{compile, gpu_profile, KernelBuild};
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;

    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    const SOURCE: &str = r#"
#include "tracing_gpu.cuh"
TGPU_EVENT(Loop, 1);
TGPU_EVENT(Work, 2);
TGPU_EVENT(Pause, 3);
__device__ __forceinline__ void spin(unsigned long long ns) {
    const unsigned long long t = tgpu::globaltimer();
    while (tgpu::globaltimer() - t < ns) {}
}
extern "C" __global__ void crawl(unsigned long long run_ns, unsigned long long step_ns
                                 TGPU_TRACE_PARAM) {
    TGPU_RECORDER(rec, Loop, Work, Pause);
    const unsigned long long start = tgpu::globaltimer();
    unsigned k = 0;
    rec.begin<Loop>();
    while (tgpu::globaltimer() - start < run_ns) {
        rec.begin<Work>();
        spin(step_ns);
        rec.switch_to<Work, Pause>(k);
        spin(step_ns);
        rec.end<Pause>();
        ++k;
    }
    rec.end<Loop>(k);
}
"#;
    #[derive(Clone, Default)]
    struct Held(Arc<Mutex<Vec<WatchdogSnapshot>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Held {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if let Some(s) = WatchdogSnapshot::of(e) {
                self.0.lock().unwrap().push(s);
            }
        }
    }
    #[derive(Clone, Default)]
    struct Keep(Arc<Mutex<Vec<Arc<Batch>>>>);
    impl BatchSink for Keep {
        fn on_batch(&self, batch: &Arc<Batch>) {
            self.0.lock().unwrap().push(batch.clone());
        }
        fn flush(&self) {}
    }
    let (held, keep) = (Held::default(), Keep::default());
    let subscriber = tracing_subscriber::registry()
        .with(LevelFilter::INFO)
        .with(held.clone())
        .with(SinkLayer::new(keep.clone()).expect("a sink slot"));
    let _default = tracing::subscriber::set_default(subscriber);
    let profiler = tracing_gpu::cuda::Profiler::builder()
        .device(0)
        .events([(1, "loop"), (2, "work"), (3, "pause")])
        .watchdog(Duration::from_secs(1))
        .watchdog_every(Duration::from_secs(1))
        .build()
        .unwrap();
    let build = KernelBuild::new("crawl.cu", profiler.arch())
        .define("TGPU_ENABLED=1")
        .define("TGPU_WATCH=1");
    let module = profiler
        .context()
        .load_module(compile(SOURCE, &build).unwrap())
        .unwrap();
    let f = module.load_function("crawl").unwrap();
    let stream = profiler.context().new_stream().unwrap();
    let sms = profiler.device().sm_count;
    let cfg = LaunchConfig {
        grid_dim: (sms, 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    let (run_ns, step_ns) = (10_000_000_000u64, 1_000_000u64);
    gpu_profile!(profiler.streamed(), &stream, "crawl", cfg, |trace| unsafe {
        stream
            .launch_builder(&f)
            .arg(&run_ns)
            .arg(&step_ns)
            .arg(&trace)
            .launch(cfg)
    })
    .unwrap();
    stream.synchronize().unwrap();
    profiler.flush().unwrap();
    let st = profiler.stats();
    assert_eq!((st.failed, st.events_lost), (0, 0), "{st:?}");
    let snapshots = held.0.lock().unwrap().clone();
    let batches = keep.0.lock().unwrap().clone();
    assert!(
        (8..=11).contains(&snapshots.len()),
        "{} snapshots in 10 s, one a second",
        snapshots.len()
    );
    let mut bad = Vec::new();
    for s in &snapshots {
        bad.extend(s.disagreements(&batches));
    }
    assert!(
        bad.is_empty(),
        "{} disagreements over {} snapshots of {} warps:\n{}",
        bad.len(),
        snapshots.len(),
        sms * 2,
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    // They are of this launch, one a second, in order.
    for (n, s) in snapshots.iter().enumerate() {
        assert_eq!(s.index(), n as u32);
        assert!(s.text().contains("(crawl, grid "), "{}", s.text());
    }
}
