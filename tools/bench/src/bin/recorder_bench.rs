//! recorder_bench: what the device recorder (`kernels/include/tracing_gpu.cuh`) costs on a
//! GPU, beside a reimplementation of the seed's scheme, and whether what it writes decodes
//! exactly.
//!
//! ```sh
//! cargo build --release -p tracing-gpu-bench --bin recorder_bench
//! target/release/recorder_bench [--events N] [--repeats R] [--warmup W] [--json PATH] [--check-only]
//!     [--header FILE] [--define NAME=VALUE]
//! compute-sanitizer --tool memcheck --error-exitcode 1 target/release/recorder_bench --check-only
//! ```
//!
//! **Checks** (always first; alone with `--check-only`, the memcheck run):
//! - overflow, for recorder v1 and v2: capacities too small (37 records and 0, for 100
//!   ranges), the last warps without a slot, and a launch with `base == 0`; the buffers
//!   decode strictly to exactly what each warp keeps (v2's expectation is the library's
//!   own writer fed the entries the calls make), with exact drop counts;
//! - the example kernels (`kernels/examples/`: phases, warp-specialized, persistent) with
//!   the gate on (v1, then v2) and off: the same outputs (and the CPU's), and the traces
//!   decode to exactly the events each warp's role records.
//!
//! **Bench** (`tools/bench/kernels/recorder_bench.cu`): every warp runs N ranges, each around 64
//! dependent FMAs, on every SM at 1, 4, 16 and 64 warps per SM, event loop unrolled 1 and
//! 4 times. Builds: the gate off (timed twice: the second is the noise floor), two bare
//! timer reads per range (the floor any recorder pays), the bound (two stamps, one 16-byte
//! store and one address step per range, and nothing else: the least a recorder of
//! records does), recorder v1 with begin/end and with switch_to, recorder v2 the same
//! with the index as payload and without (`-bare`), the seed-style recorder,
//! FlashInfer's (an 8-byte entry per boundary, stored by lane 0), and what takes v2's cost
//! apart, without payloads: `staging`, the least that staging entries in the lanes does
//! per entry (the stamp, the word and the turn: `staging::Recorder` in baselines.cuh), and
//! `v2[-switch]-bare-idle`, v2's own kernels given a trace whose base is 0 (every entry's
//! code runs, with its count, group test and branch; no stamp is read, no group stored).
//! Each is warmed up, then the builds are
//! interleaved (the order rotates each repeat) and timed with CUDA events; the figures are
//! medians. Per build: the latency a warp sees, (t − t_off) / events per warp, and the SM
//! throughput cost, that divided by warps per SM. Outputs must match the gate-off build bit
//! for bit, and the traced builds' buffers must decode to every event, with each SM
//! running exactly the warps asked for.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use tracing_gpu::cuda::{compile, KernelBuild};
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::{BufferBuilder, Event, EventKind, KernelArg};
use tracing_gpu::registry::EventRegistry;
use tracing_gpu_bench::kernels::{
    BASELINES, PERSISTENT, PHASES, RECORDER_BENCH as BENCH, WARP_SPECIALIZED,
};
use tracing_gpu_bench::stats::median;
use tracing_gpu_bench::{cli, device, device::Timer};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The seed-style recorder's argument (`seed::Buffer` in the bench kernel).
#[repr(C)]
#[derive(Clone, Copy)]
struct SeedBuffer {
    records: u64,
    counters: u64,
    capacity: u32,
    slot_count: u32,
}
// SAFETY: repr(C) plain data with the layout of seed::Buffer.
unsafe impl DeviceRepr for SeedBuffer {}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
    sms: u32,
    name: String,
    /// `--header`: the recorder's builds include it in place of the embedded header.
    header: Option<cli::Header>,
    /// `--define`s: added to the v2 recorder's builds (not v1's, not the baselines').
    defines: Vec<String>,
}

impl Gpu {
    fn new(header: Option<cli::Header>, defines: Vec<String>) -> Result<Gpu> {
        let ctx = device::open(0)?;
        // One stream and explicit synchronization: no per-launch tracking events between
        // the timing events.
        // SAFETY: every buffer is used on this one stream only.
        unsafe { ctx.disable_event_tracking() };
        Ok(Gpu {
            stream: ctx.default_stream(),
            arch: device::arch(&ctx)?,
            sms: device::sm_count(&ctx)?,
            name: ctx.name()?,
            header,
            defines,
            ctx,
        })
    }

    /// Compiles `source` with NVRTC and loads its entry point `entry`; a build with the
    /// recorder on includes `--header`'s file, if any, and v2's the `--define`s.
    fn load(&self, source: &str, entry: &str, defines: &[String]) -> Result<CudaFunction> {
        let mut build = KernelBuild::new(entry, self.arch).header("baselines.cuh", BASELINES);
        for d in defines {
            build = build.define(d.clone());
        }
        let v2 = !defines.iter().any(|d| d == "TGPU_FORMAT=1");
        let (source, build) = match defines.iter().any(|d| d == "TGPU_ENABLED=1") {
            true => {
                let extra: &[String] = if v2 { &self.defines } else { &[] };
                cli::variant(source, build, extra, self.header.as_ref())
            }
            false => (source.to_owned(), build),
        };
        let module = self.ctx.load_module(compile(&source, &build)?)?;
        Ok(module.load_function(entry)?)
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }
}

/// A trace buffer on the device, its header written as the host does before a launch.
struct TraceBuffer {
    dev: CudaSlice<u8>,
    capacity: u32,
    slot_count: u32,
}

impl TraceBuffer {
    fn new(gpu: &Gpu, cfg: &LaunchConfig, capacity: u32, slot_count: u32) -> Result<TraceBuffer> {
        Ok(TraceBuffer {
            dev: device::trace_buffer(&gpu.stream, cfg, capacity, slot_count)?,
            capacity,
            slot_count,
        })
    }

    fn arg(&self, gpu: &Gpu) -> KernelArg {
        KernelArg {
            base: gpu.ptr(&self.dev),
            capacity: self.capacity,
            slot_count: self.slot_count,
            ..KernelArg::default()
        }
    }

    fn read(&self, gpu: &Gpu) -> Result<Vec<u8>> {
        Ok(gpu.stream.clone_dtoh(&self.dev)?)
    }
}

/// `warps_per_sm` warps on every SM: one block per SM, or two of 1024 threads for 64.
fn placement(gpu: &Gpu, warps_per_sm: u32) -> LaunchConfig {
    let blocks_per_sm = warps_per_sm.div_ceil(32);
    LaunchConfig {
        grid_dim: (gpu.sms * blocks_per_sm, 1, 1),
        block_dim: (32 * warps_per_sm / blocks_per_sm, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn registry(pairs: &[(u16, &str)]) -> Result<EventRegistry> {
    let mut r = EventRegistry::new();
    for (id, name) in pairs {
        r.register(*id, name)?;
    }
    Ok(r)
}

/// Deterministic, non-zero inputs in [-1, 1).
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

// ------------------------------------------------------------------------------------
// The bench kernel's builds.
// ------------------------------------------------------------------------------------

/// The bench kernel's FMA coefficients: a contraction, so the chain neither grows nor dies.
const FMA_A: f32 = 0.999_023_4;
const FMA_B: f32 = 0.001_220_7;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Build {
    Off,
    OffAgain,
    Floor,
    Bound,
    /// Recorder v1 (`TGPU_FORMAT=1`), begin/end with the index as payload.
    V1,
    /// Recorder v1, one switch_to per range.
    V1Switch,
    /// Recorder v2, begin/end with the index as payload (a payload entry per range).
    V2,
    /// Recorder v2, one switch_to per range, with the payload.
    V2Switch,
    /// Recorder v2, begin/end without payload.
    V2Bare,
    /// Recorder v2, switch_to without payload: back-to-back phases, one entry each.
    V2SwitchBare,
    Seed,
    /// FlashInfer's recorder: an 8-byte entry per boundary, stored by lane 0.
    FlashInfer,
    /// Staging alone, begin/end: stamp, word and turn per entry; no count, no group test,
    /// no stores.
    Staging,
    /// The same, one switch_to per range.
    StagingSwitch,
    /// `V2Bare`'s kernel launched with a trace whose base is 0: v2's per-entry code
    /// without a stamp read or a group stored.
    V2BareIdle,
    /// The same for `V2SwitchBare`.
    V2SwitchBareIdle,
}

impl Build {
    const ALL: [Build; 16] = [
        Build::Off,
        Build::OffAgain,
        Build::Floor,
        Build::Bound,
        Build::V1,
        Build::V1Switch,
        Build::V2,
        Build::V2Switch,
        Build::V2Bare,
        Build::V2SwitchBare,
        Build::Seed,
        Build::FlashInfer,
        Build::Staging,
        Build::StagingSwitch,
        Build::V2BareIdle,
        Build::V2SwitchBareIdle,
    ];
    /// The builds that write a tgpu trace buffer, v1 or v2.
    const OURS: [Build; 6] = [
        Build::V1,
        Build::V1Switch,
        Build::V2,
        Build::V2Switch,
        Build::V2Bare,
        Build::V2SwitchBare,
    ];

    fn name(self) -> &'static str {
        match self {
            Build::Off => "off",
            Build::OffAgain => "off-again",
            Build::Floor => "floor",
            Build::Bound => "bound",
            Build::V1 => "v1",
            Build::V1Switch => "v1-switch",
            Build::V2 => "v2",
            Build::V2Switch => "v2-switch",
            Build::V2Bare => "v2-bare",
            Build::V2SwitchBare => "v2-switch-bare",
            Build::Seed => "seed-style",
            Build::FlashInfer => "flashinfer",
            Build::Staging => "staging",
            Build::StagingSwitch => "staging-switch",
            Build::V2BareIdle => "v2-bare-idle",
            Build::V2SwitchBareIdle => "v2-switch-bare-idle",
        }
    }

    fn defines(self) -> &'static [&'static str] {
        const ON: &str = "TGPU_ENABLED=1";
        const SWITCH: &str = "TGPU_BENCH_SWITCH=1";
        const BARE: &str = "TGPU_BENCH_PAYLOAD=0";
        match self {
            Build::Off | Build::OffAgain => &[],
            Build::Floor => &["TGPU_BENCH_FLOOR=1"],
            Build::Bound => &["TGPU_BENCH_BOUND=1"],
            Build::V1 => &[ON, "TGPU_FORMAT=1"],
            Build::V1Switch => &[ON, "TGPU_FORMAT=1", SWITCH],
            Build::V2 => &[ON],
            Build::V2Switch => &[ON, SWITCH],
            Build::V2Bare => &[ON, BARE],
            Build::V2SwitchBare => &[ON, SWITCH, BARE],
            Build::Seed => &["TGPU_BENCH_SEED=1"],
            Build::FlashInfer => &["TGPU_BENCH_FLASHINFER=1"],
            Build::Staging => &["TGPU_BENCH_STAGING=1", BARE],
            Build::StagingSwitch => &["TGPU_BENCH_STAGING=1", SWITCH, BARE],
            Build::V2BareIdle => Build::V2Bare.defines(),
            Build::V2SwitchBareIdle => Build::V2SwitchBare.defines(),
        }
    }

    fn switch(self) -> bool {
        matches!(
            self,
            Build::V1Switch
                | Build::V2Switch
                | Build::V2SwitchBare
                | Build::StagingSwitch
                | Build::V2SwitchBareIdle
        )
    }

    /// Whether each range carries its index as payload (else 0).
    fn payload(self) -> bool {
        !matches!(self, Build::V2Bare | Build::V2SwitchBare)
    }

    /// What one warp of this build records for `events` ranges into `capacity`
    /// records: the events a reader sees (id, kind, payload), the drops, and whether
    /// a range is left open. v2's comes from the library's own writer and reader,
    /// fed the entries the recorder's calls make.
    fn expected(self, events: u32, capacity: u32) -> (Vec<(u16, EventKind, u32)>, u32, bool) {
        let payload = |i: u32| if self.payload() { i } else { 0 };
        if matches!(self, Build::V1 | Build::V1Switch) {
            let kept = events.min(capacity);
            let shape = (0..kept)
                .map(|i| (1, EventKind::Range, payload(i)))
                .collect();
            return (shape, events - kept, self.switch());
        }
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], capacity);
        let w = b.warp_v2(0, 0).expect("one warp");
        let mut t = 0;
        let mut tick = || {
            t += 1;
            t
        };
        if self.switch() {
            w.begin(1, tick());
        }
        for i in 0..events {
            if self.switch() {
                w.switch(1, tick());
            } else {
                w.begin(1, tick()).end(1, tick());
            }
            if self.payload() {
                w.payload(i);
            }
        }
        let bytes = b.finish();
        let capture = Buffer::decode(&bytes, None).expect("the writer's buffers decode");
        let slot = capture.slots().next().expect("one slot");
        let shape = slot.events().map(|e| (e.id, e.kind, e.payload)).collect();
        (shape, slot.events_lost(), slot.open_at_flush())
    }
}

fn load_bench(gpu: &Gpu, build: Build, unroll: u32) -> Result<CudaFunction> {
    let mut defines: Vec<String> = build.defines().iter().map(|d| d.to_string()).collect();
    defines.push(format!("TGPU_BENCH_UNROLL={unroll}"));
    gpu.load(BENCH, "recorder_bench", &defines)
}

/// Launches the bench kernel; `trace` for ours, `seed` for the seed-style build.
fn launch_bench(
    gpu: &Gpu,
    f: &CudaFunction,
    cfg: LaunchConfig,
    out: &CudaSlice<f32>,
    events: i32,
    trace: Option<KernelArg>,
    seed: Option<SeedBuffer>,
) -> Result<()> {
    let mut l = gpu.stream.launch_builder(f);
    l.arg(out).arg(&FMA_A).arg(&FMA_B).arg(&events);
    if let Some(t) = trace.as_ref() {
        l.arg(t);
    }
    if let Some(s) = seed.as_ref() {
        l.arg(s);
    }
    // SAFETY: the arguments match the kernel's parameter list for this build.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Checks a traced bench build's buffer: every warp flushed, holding exactly what
/// [`Build::expected`] says. Returns the mean range duration in ns, and whether each SM
/// ran exactly `warps_per_sm` warps (the block scheduler's placement, which the figures
/// assume).
fn check_bench_trace(
    gpu: &Gpu,
    bytes: &[u8],
    reg: &EventRegistry,
    build: Build,
    (events, capacity): (u32, u32),
    warps_per_sm: u32,
) -> Result<(f64, Result<()>)> {
    let capture = Buffer::decode(bytes, Some(reg))?;
    let slots = gpu.sms * warps_per_sm;
    ensure(capture.flushed_slot_count() == slots as usize, || {
        format!("{} of {slots} slots flushed", capture.flushed_slot_count())
    })?;
    let (want, drops, open) = build.expected(events, capacity);
    let mut per_sm: BTreeMap<u32, u32> = BTreeMap::new();
    let mut total_ns = 0u64;
    for slot in capture.slots() {
        let h = &slot.header;
        let got: Vec<Event> = slot.events().collect();
        ensure(
            shape(&got) == want
                && h.events_lost == drops
                && slot.open_at_flush() == open
                && !slot.migrated(),
            || {
                format!(
                    "slot {}: {} events ({} expected), {} dropped, open {}, migrated {}",
                    slot.index,
                    got.len(),
                    want.len(),
                    h.events_lost,
                    slot.open_at_flush(),
                    slot.migrated()
                )
            },
        )?;
        total_ns += got.iter().map(Event::duration_ns).sum::<u64>();
        *per_sm.entry(h.sm_first).or_default() += 1;
    }
    let placement = ensure(
        per_sm.len() == gpu.sms as usize && per_sm.values().all(|&n| n == warps_per_sm),
        || {
            format!(
                "warps per SM: {per_sm:?}, wanted {warps_per_sm} on each of {} SMs",
                gpu.sms
            )
        },
    );
    Ok((total_ns as f64 / (slots as f64 * events as f64), placement))
}

struct Cell {
    unroll: u32,
    warps_per_sm: u32,
    /// Every repeat's time in ms, per build.
    times: BTreeMap<Build, Vec<f64>>,
    /// Mean decoded range duration (ns), per traced build.
    durations: BTreeMap<Build, f64>,
    /// Checks that failed: printed with the table, and the run exits with an error.
    findings: Vec<String>,
}

impl Cell {
    fn median(&self, b: Build) -> f64 {
        median(&mut self.times[&b].clone())
    }

    /// (t_build − t_off) per event per warp, in ns.
    fn latency_ns(&self, b: Build, events: u32) -> f64 {
        (self.median(b) - self.median(Build::Off)) * 1e6 / events as f64
    }
}

/// The device recorder's cost beside the seed-style one and the bound, and whether
/// what it writes decodes exactly.
#[derive(Parser, Debug)]
#[command(name = "recorder_bench")]
struct Options {
    /// Ranges per warp.
    #[arg(long, default_value_t = 4096, value_parser = cli::positive::<u32>)]
    events: u32,
    /// Timed repeats per cell (interleaved); the figures are medians.
    #[arg(long, default_value_t = 21, value_parser = cli::positive::<u32>)]
    repeats: u32,
    /// Untimed repeats first.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Also write every figure and sample as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Run the checks only (the compute-sanitizer run).
    #[arg(long)]
    check_only: bool,
    /// The recorder's builds (v1, v2) include this file instead of the embedded
    /// `tracing_gpu.cuh` (a variant of the header, beside the shipped one in one call).
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// A define added to the v2 recorder's builds, checks and bench alike (`NAME=VALUE`,
    /// such as a candidate's switch); repeatable.
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
}

fn bench(gpu: &Gpu, o: &Options) -> Result<Vec<Cell>> {
    let reg = registry(&[(1, "work")])?;
    let unrolls = [1u32, 4];
    let mut funcs: BTreeMap<(u32, Build), CudaFunction> = BTreeMap::new();
    for &u in &unrolls {
        for b in Build::ALL {
            // The same kernel, timed again or given another argument.
            let f = match b {
                Build::OffAgain => funcs[&(u, Build::Off)].clone(),
                Build::V2BareIdle => funcs[&(u, Build::V2Bare)].clone(),
                Build::V2SwitchBareIdle => funcs[&(u, Build::V2SwitchBare)].clone(),
                _ => load_bench(gpu, b, u)?,
            };
            funcs.insert((u, b), f);
        }
    }
    let events = o.events;
    let mut cells = Vec::new();
    for warps_per_sm in [1u32, 4, 16, 64] {
        let cfg = placement(gpu, warps_per_sm);
        let threads = cfg.block_dim.0;
        let blocks_per_sm = cfg.grid_dim.0 / gpu.sms;
        for (&(u, b), f) in &funcs {
            let fit = f.occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
            ensure(fit >= blocks_per_sm, || {
                format!(
                    "{} unroll {u}: {fit} blocks of {threads} fit on an SM, {blocks_per_sm} needed",
                    b.name()
                )
            })?;
        }
        let slots = gpu.sms * warps_per_sm;
        let outs: Vec<CudaSlice<f32>> = Build::ALL
            .iter()
            .map(|_| gpu.stream.alloc_zeros::<f32>((slots * 32) as usize))
            .collect::<std::result::Result<_, _>>()?;
        // Room for every event in either format: v2's begin/end with payload takes
        // three 8-byte entries per range.
        let capacity = 2 * events;
        let traces: BTreeMap<Build, TraceBuffer> = Build::OURS
            .into_iter()
            .map(|b| Ok((b, TraceBuffer::new(gpu, &cfg, capacity, slots)?)))
            .collect::<Result<_>>()?;
        let seed_records = gpu
            .stream
            .alloc_zeros::<u64>(slots as usize * events as usize * 5)?;
        let mut seed_counters = gpu.stream.alloc_zeros::<u64>(slots as usize * 16)?;
        let seed_arg = SeedBuffer {
            records: gpu.ptr(&seed_records),
            counters: gpu.ptr(&seed_counters),
            capacity: events,
            slot_count: slots,
        };
        let marks = Timer::many(&gpu.ctx, Build::ALL.len())?;
        for &u in &unrolls {
            let mut times: BTreeMap<Build, Vec<f64>> = BTreeMap::new();
            let launch = |b: Build, out: &CudaSlice<f32>| {
                launch_bench(
                    gpu,
                    &funcs[&(u, b)],
                    cfg,
                    out,
                    events as i32,
                    match b {
                        Build::V2BareIdle | Build::V2SwitchBareIdle => Some(KernelArg {
                            base: 0,
                            ..traces[&Build::V2Bare].arg(gpu)
                        }),
                        _ => traces.get(&b).map(|t| t.arg(gpu)),
                    },
                    // The bound, FlashInfer's and staging write into the seed's record
                    // region (baselines.cuh), which has room for them.
                    matches!(
                        b,
                        Build::Seed
                            | Build::Bound
                            | Build::FlashInfer
                            | Build::Staging
                            | Build::StagingSwitch
                    )
                    .then_some(seed_arg),
                )
            };
            for rep in 0..o.warmup + o.repeats {
                // An untimed launch first, so the GPU is busy while the host queues the
                // timed ones: no launch gap falls between a start event and its kernel.
                launch(Build::Off, &outs[0])?;
                let n = Build::ALL.len();
                for k in 0..n {
                    let i = (k + rep as usize) % n;
                    let b = Build::ALL[i];
                    if b == Build::Seed {
                        // The seed's counters start at zero each launch, as in a fresh buffer.
                        gpu.stream.memset_zeros(&mut seed_counters)?;
                    }
                    marks[i].around(&gpu.stream, || launch(b, &outs[i]))?;
                }
                for (i, b) in Build::ALL.iter().enumerate() {
                    let ms = marks[i].ms()?;
                    if rep >= o.warmup {
                        times.entry(*b).or_default().push(ms);
                    }
                }
            }
            let mut cell = Cell {
                unroll: u,
                warps_per_sm,
                times,
                durations: BTreeMap::new(),
                findings: Vec::new(),
            };
            // What each build computed and wrote: a failure is reported with the figures.
            let mut finding = |r: Result<()>| {
                if let Err(e) = r {
                    cell.findings.push(e.to_string());
                }
            };
            let reference = gpu.stream.clone_dtoh(&outs[0])?;
            finding(ensure(
                reference.iter().all(|x| x.is_finite() && *x != 0.0),
                || "bench output has zeros or non-finite values".into(),
            ));
            for (i, b) in Build::ALL.iter().enumerate().skip(1) {
                let got = gpu.stream.clone_dtoh(&outs[i])?;
                finding(ensure(
                    got.iter()
                        .zip(&reference)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    || format!("{}: output differs from the gate-off build", b.name()),
                ));
            }
            let counters = gpu.stream.clone_dtoh(&seed_counters)?;
            finding(ensure(
                counters.iter().step_by(16).all(|&c| c == events as u64),
                || "seed-style: a warp's counter is not the event count".into(),
            ));
            let mut durations = BTreeMap::new();
            for (&b, t) in &traces {
                let bytes = t.read(gpu)?;
                match check_bench_trace(gpu, &bytes, &reg, b, (events, capacity), warps_per_sm) {
                    Ok((d, placement)) => {
                        durations.insert(b, d);
                        finding(placement.map_err(|e| format!("{}: {e}", b.name()).into()));
                    }
                    Err(e) => finding(Err(format!("{}: {e}", b.name()).into())),
                }
            }
            cell.durations = durations;
            eprintln!(
                "unroll {u}, {warps_per_sm:>2} warps/SM: off {:.3} ms, v1 {:+.2}, v2 {:+.2}, seed-style {:+.2} ns/event{}",
                cell.median(Build::Off),
                cell.latency_ns(Build::V1, events),
                cell.latency_ns(Build::V2, events),
                cell.latency_ns(Build::Seed, events),
                if cell.findings.is_empty() { "" } else { " (FINDINGS below)" }
            );
            cells.push(cell);
        }
    }
    Ok(cells)
}

fn report(gpu: &Gpu, o: &Options, cells: &[Cell]) -> String {
    let ev = o.events;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "recorder_bench: {}, {} SMs, {}; {} ranges per warp of 64 dependent FMAs; medians of {} interleaved repeats",
        gpu.name, gpu.sms, gpu.arch, ev, o.repeats
    );
    let builds = &Build::ALL[1..];
    // Two tables: what a warp sees, then the SM's throughput cost.
    for (title, per_sm) in [
        (
            "latency a warp sees, (t - t_off) / ranges per warp, ns",
            false,
        ),
        (
            "SM throughput cost, latency / warps per SM, ns per range",
            true,
        ),
    ] {
        let _ = writeln!(s, "\n{title} (off-again: the noise)");
        let _ = write!(s, "{:>6} {:>5} {:>9}", "unroll", "W/SM", "off ms");
        for b in builds {
            let _ = write!(s, " {:>14}", b.name());
        }
        let _ = writeln!(s, " {:>10} {:>10}", "seed/v1", "seed/v2sb");
        for c in cells {
            let div = if per_sm { c.warps_per_sm as f64 } else { 1.0 };
            let lat = |b| c.latency_ns(b, ev) / div;
            let _ = write!(
                s,
                "{:>6} {:>5} {:>9.4}",
                c.unroll,
                c.warps_per_sm,
                c.median(Build::Off)
            );
            for &b in builds {
                let _ = write!(s, " {:>14.3}", lat(b));
            }
            let _ = writeln!(
                s,
                " {:>10.1} {:>10.1}",
                lat(Build::Seed) / lat(Build::V1),
                lat(Build::Seed) / lat(Build::V2SwitchBare)
            );
        }
    }
    let _ = writeln!(s, "\nmean decoded range, ns (v1 / v2):");
    for c in cells {
        let d = |b| c.durations.get(&b).copied().unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "unroll {} {:>2} W/SM: {:.1} / {:.1}",
            c.unroll,
            c.warps_per_sm,
            d(Build::V1),
            d(Build::V2)
        );
    }
    for c in cells {
        for f in &c.findings {
            let _ = writeln!(
                s,
                "FINDING unroll {} {} warps/SM: {f}",
                c.unroll, c.warps_per_sm
            );
        }
    }
    s
}

fn json(gpu: &Gpu, o: &Options, cells: &[Cell]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"device\":{},\"sms\":{},\"arch\":\"{}\",\"events_per_warp\":{},\"repeats\":{},\"warmup\":{},\"cells\":[",
        cli::json_string(&gpu.name),
        gpu.sms,
        gpu.arch,
        o.events, o.repeats, o.warmup
    );
    for (i, c) in cells.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"unroll\":{},\"warps_per_sm\":{},\"builds\":{{",
            if i > 0 { "," } else { "" },
            c.unroll,
            c.warps_per_sm
        );
        for (j, (b, t)) in c.times.iter().enumerate() {
            let lat = c.latency_ns(*b, o.events);
            let samples: Vec<String> = t.iter().map(|x| format!("{x:.6}")).collect();
            let _ = write!(
                s,
                "{}\"{}\":{{\"median_ms\":{:.6},\"latency_ns_per_event\":{:.4},\"sm_cost_ns_per_event\":{:.5},\"samples_ms\":[{}]}}",
                if j > 0 { "," } else { "" },
                b.name(),
                c.median(*b),
                lat,
                lat / c.warps_per_sm as f64,
                samples.join(",")
            );
        }
        let findings: Vec<String> = c
            .findings
            .iter()
            .map(|f| format!("\"{}\"", f.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        let duration = |b| match c.durations.get(&b) {
            Some(d) => format!("{d:.2}"),
            None => "null".into(),
        };
        let durations: Vec<String> = Build::OURS
            .iter()
            .map(|&b| format!("\"{}\":{}", b.name(), duration(b)))
            .collect();
        let _ = write!(
            s,
            "}},\"mean_range_ns\":{{{}}},\"findings\":[{}]}}",
            durations.join(","),
            findings.join(",")
        );
    }
    s.push_str("]}\n");
    s
}

// ------------------------------------------------------------------------------------
// Checks.
// ------------------------------------------------------------------------------------

/// Capacities too small, warps without a slot, and `base == 0`: decoded strictly, with
/// exact counts.
fn check_overflow(gpu: &Gpu) -> Result<()> {
    let reg = registry(&[(1, "work")])?;
    let cfg = placement(gpu, 4);
    let warps = cfg.grid_dim.0 * cfg.block_dim.0 / 32;
    let slot_count = warps - 5;
    let events = 100u32;
    let out = gpu.stream.alloc_zeros::<f32>((warps * 32) as usize)?;
    for build in Build::OURS {
        let f = load_bench(gpu, build, 1)?;
        for capacity in [37u32, 0] {
            let t = TraceBuffer::new(gpu, &cfg, capacity, slot_count)?;
            launch_bench(gpu, &f, cfg, &out, events as i32, Some(t.arg(gpu)), None)?;
            let bytes = t.read(gpu)?;
            let capture = Buffer::decode(&bytes, Some(&reg))?;
            let what = format!("{} capacity {capacity}", build.name());
            ensure(capture.flushed_slot_count() == slot_count as usize, || {
                format!("{what}: {} slots flushed", capture.flushed_slot_count())
            })?;
            let (want, drops, open) = build.expected(events, capacity);
            ensure(
                capture.event_count() == slot_count as u64 * want.len() as u64
                    && capture.events_lost() == slot_count as u64 * drops as u64,
                || {
                    format!(
                        "{what}: {} events, {} drops",
                        capture.event_count(),
                        capture.events_lost()
                    )
                },
            )?;
            for slot in capture.slots() {
                let got: Vec<Event> = slot.events().collect();
                ensure(
                    shape(&got) == want
                        && slot.events_lost() == drops
                        && slot.open_at_flush() == open,
                    || format!("{what}: slot {} header {:?}", slot.index, slot.header),
                )?;
            }
        }
        // base == 0: the kernel runs and writes nothing (memcheck sees any stray store).
        let off = KernelArg {
            base: 0,
            capacity: 37,
            slot_count: warps,
            ..KernelArg::default()
        };
        launch_bench(gpu, &f, cfg, &out, events as i32, Some(off), None)?;
        gpu.stream.synchronize()?;
    }
    eprintln!("check: overflow, v1 and v2 (capacity 37 and 0 records for {events} ranges, {slot_count} of {warps} warps with a slot, base 0): exact");
    Ok(())
}

/// One warp's events as (id, kind, payload).
fn shape(events: &[Event]) -> Vec<(u16, EventKind, u32)> {
    events.iter().map(|e| (e.id, e.kind, e.payload)).collect()
}

/// An example kernel's launch: `(const float* in, float* out, int ints...)`.
struct Example<'a> {
    source: &'a str,
    entry: &'a str,
    cfg: LaunchConfig,
    ints: &'a [i32],
    out_len: usize,
    /// The record format of the recording build: 1 or 2.
    format: u8,
}

/// Records per slot for the examples: more than any of their warps records.
const EXAMPLE_CAPACITY: u32 = 64;

/// Runs an example kernel gate on and off with the same inputs; returns the output (the
/// same bits both ways) and the decoded trace's events per (block, warp).
#[allow(clippy::type_complexity)]
fn run_example(
    gpu: &Gpu,
    ex: &Example,
    input: &[f32],
    reg: &EventRegistry,
) -> Result<(Vec<f32>, BTreeMap<(u32, u32), Vec<Event>>)> {
    let recording = [
        "TGPU_ENABLED=1".to_string(),
        format!("TGPU_FORMAT={}", ex.format),
    ];
    let Example {
        source,
        entry,
        cfg,
        ints,
        out_len,
        ..
    } = *ex;
    let on = gpu.load(source, entry, &recording)?;
    let off = gpu.load(source, entry, &[])?;
    let dev_in = gpu.stream.clone_htod(input)?;
    let out_on = gpu.stream.alloc_zeros::<f32>(out_len)?;
    let out_off = gpu.stream.alloc_zeros::<f32>(out_len)?;
    let warps = cfg.grid_dim.0 * cfg.block_dim.0.div_ceil(32);
    let trace = TraceBuffer::new(gpu, &cfg, EXAMPLE_CAPACITY, warps)?;
    for (f, out, t) in [(&on, &out_on, Some(trace.arg(gpu))), (&off, &out_off, None)] {
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&dev_in).arg(out);
        for i in ints {
            l.arg(i);
        }
        if let Some(t) = t.as_ref() {
            l.arg(t);
        }
        // SAFETY: the arguments match the example's parameter list, gate on or off.
        unsafe { l.launch(cfg) }?;
    }
    let a = gpu.stream.clone_dtoh(&out_on)?;
    let b = gpu.stream.clone_dtoh(&out_off)?;
    ensure(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        || format!("{entry}: gate on and off compute different outputs"),
    )?;
    let bytes = trace.read(gpu)?;
    let capture = Buffer::decode(&bytes, Some(reg))?;
    ensure(capture.events_lost() == 0, || format!("{entry}: drops"))?;
    let mut warps_events = BTreeMap::new();
    for slot in capture.slots() {
        warps_events.insert(
            (slot.header.block_linear, slot.header.warp),
            slot.events().collect::<Vec<_>>(),
        );
    }
    ensure(warps_events.len() == warps as usize, || {
        format!("{entry}: {} of {warps} warps flushed", warps_events.len())
    })?;
    Ok((a, warps_events))
}

fn check_examples(gpu: &Gpu, format: u8) -> Result<()> {
    use EventKind::{Instant, Range};

    // phases: every warp the same sequence; Loop encloses the iterations.
    let (n, iters) = (4096usize, 16u32);
    let input = inputs(n, 1);
    let cfg = LaunchConfig {
        grid_dim: (n as u32 / 128, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let reg = registry(&[
        (1, "load"),
        (2, "compute"),
        (3, "store"),
        (4, "step"),
        (5, "loop"),
    ])?;
    let ex = Example {
        source: PHASES,
        entry: "phases",
        cfg,
        ints: &[n as i32, iters as i32],
        out_len: n,
        format,
    };
    let (out, traces) = run_example(gpu, &ex, &input, &reg)?;
    let mut want = Vec::new();
    for k in 0..iters {
        want.extend([(1, Range, k), (2, Range, k), (4, Instant, k)]);
    }
    want.extend([(5, Range, iters), (3, Range, 0)]);
    for (w, ev) in &traces {
        ensure(shape(ev) == want, || {
            format!("phases warp {w:?}: {:?}", shape(ev))
        })?;
        let (outer, first, last) = (ev[ev.len() - 2], ev[0], ev[ev.len() - 3]);
        ensure(
            outer.start_ns <= first.start_ns && outer.end_ns >= last.end_ns,
            || format!("phases warp {w:?}: Loop does not enclose the iterations"),
        )?;
    }
    for (i, &o) in out.iter().enumerate() {
        let mut acc = 0.0f32;
        for k in 0..iters as usize {
            acc = acc.mul_add(0.5, input[(i + k) % n]);
        }
        ensure(o.to_bits() == acc.to_bits(), || {
            format!("phases out[{i}] = {o}, CPU {acc}")
        })?;
    }

    // warp_specialized: the producer's and the consumers' own phases.
    let (blocks, consumers, tiles, tile) = (8u32, 2u32, 8u32, 256usize);
    let input = inputs(blocks as usize * tiles as usize * tile, 2);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32 * (1 + consumers), 1, 1),
        shared_mem_bytes: 0,
    };
    let reg = registry(&[(1, "load"), (2, "wait"), (3, "reduce")])?;
    let width = 32 * consumers as usize;
    let ex = Example {
        source: WARP_SPECIALIZED,
        entry: "warp_specialized",
        cfg,
        ints: &[tiles as i32],
        out_len: blocks as usize * width,
        format,
    };
    let (out, traces) = run_example(gpu, &ex, &input, &reg)?;
    let producer: Vec<_> = (0..tiles)
        .flat_map(|t| {
            let wait = (t >= 2).then_some((2, Range, t));
            wait.into_iter().chain([(1, Range, t)])
        })
        .collect();
    let consumer: Vec<_> = (0..tiles)
        .flat_map(|t| [(2, Range, t), (3, Range, t)])
        .collect();
    for ((block, warp), ev) in &traces {
        let want = if *warp == 0 { &producer } else { &consumer };
        ensure(&shape(ev) == want, || {
            format!(
                "warp_specialized block {block} warp {warp}: {:?}",
                shape(ev)
            )
        })?;
    }
    for b in 0..blocks as usize {
        for c in 0..width {
            let mut acc = 0.0f32;
            for t in 0..tiles as usize {
                for j in (c..tile).step_by(width) {
                    acc += input[(b * tiles as usize + t) * tile + j];
                }
            }
            let o = out[b * width + c];
            ensure(o.to_bits() == acc.to_bits(), || {
                format!("warp_specialized out[{b},{c}] = {o}, CPU {acc}")
            })?;
        }
    }

    // persistent: each warp's tiles, claimed and recorded in order.
    let (blocks, tiles, elems) = (4u32, 10u32, 1000usize);
    let input = inputs(tiles as usize * elems, 3);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let reg = registry(&[(1, "tile"), (2, "claim")])?;
    let ex = Example {
        source: PERSISTENT,
        entry: "persistent",
        cfg,
        ints: &[tiles as i32, elems as i32],
        out_len: tiles as usize,
        format,
    };
    let (out, traces) = run_example(gpu, &ex, &input, &reg)?;
    for ((block, warp), ev) in &traces {
        let want: Vec<_> = (*block..tiles)
            .step_by(blocks as usize)
            .flat_map(|t| [(2, Instant, t), (1, Range, t)])
            .collect();
        ensure(shape(ev) == want, || {
            format!("persistent block {block} warp {warp}: {:?}", shape(ev))
        })?;
    }
    for (t, &o) in out.iter().enumerate() {
        let sum: f64 = input[t * elems..(t + 1) * elems]
            .iter()
            .map(|&x| x as f64)
            .sum();
        ensure((o as f64 - sum).abs() <= 1e-4 * (1.0 + sum.abs()), || {
            format!("persistent out[{t}] = {o}, CPU {sum}")
        })?;
    }
    eprintln!("check: examples (phases, warp_specialized, persistent), recorder v{format}: outputs equal gate on/off and CPU; traces exact");
    Ok(())
}

fn main() -> ExitCode {
    cli::exit("recorder_bench", run(&Options::parse()).map(|()| true))
}

fn run(o: &Options) -> Result<()> {
    let header = cli::Header::read(o.header.as_deref())?;
    let gpu = match Gpu::new(header, o.defines.clone()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: no GPU ({e})");
            return Ok(());
        }
    };
    eprintln!("device: {}, {} SMs, {}", gpu.name, gpu.sms, gpu.arch);
    if let Some(path) = &o.header {
        eprintln!("recorder header: {}", path.display());
    }
    if !o.defines.is_empty() {
        eprintln!("v2 builds also define: {}", o.defines.join(" "));
    }
    // A failed check is reported and fails the run, after the bench has run too.
    let checks = check_overflow(&gpu)
        .and_then(|()| check_examples(&gpu, 1))
        .and_then(|()| check_examples(&gpu, 2));
    if let Err(e) = &checks {
        eprintln!("CHECK FAILED: {e}");
    }
    if o.check_only {
        return checks;
    }
    let cells = bench(&gpu, o)?;
    let table = report(&gpu, o, &cells);
    if let Some(path) = &o.json {
        std::fs::write(path, json(&gpu, o, &cells))?;
    }
    print!("{table}");
    let findings: usize = cells.iter().map(|c| c.findings.len()).sum();
    checks?;
    ensure(findings == 0, || format!("{findings} findings (above)"))
}
