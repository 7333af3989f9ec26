//! Sampling a GPU's `%globaltimer` against the host clock (feature `cuda`).
//!
//! A [`Calibrator`] plays ping-pong with the GPU through pinned, device-mapped
//! host memory (`kernels/calibrate.cu`):
//!
//! 1. the host reads its clock (`host_before`) and writes round number `i + 1`
//!    to a flag, with a full barrier, then reads its clock again;
//! 2. a GPU thread (or several, one per warp, staggered: [`Calibrator::set_pollers`]),
//!    with one read of the flag in flight over PCIe, spins on it; the first to
//!    see the new round reads `%globaltimer` and writes the value back to host memory;
//! 3. the host, spinning on that word, sees it and reads its clock (`host_after`).
//!
//! Each round gives a two-sided [`Sample`]. The GPU's polls that still saw the
//! old flag give one-sided ones ([`Sample::at_most`]): such a read reached host
//! memory before the flag was written, so the timer read just before it was
//! issued maps to no later than the host stamp taken right after the write.
//! [`ClockMap::fit`] turns them into a map with a bound (see [`crate::clock`]).
//!
//! A round that goes unanswered for the timeout (2 s) is not waited on (the
//! kernel may be queued behind a kernel that runs for minutes): its stream and
//! memory are abandoned with STOP written there, and the next launch goes to a
//! fresh stream and memory; with [`LANES`] kernels abandoned and still queued,
//! a calibration fails at once ([`CalibrateError::Stuck`]).
//! docs/calibration.md has the details.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tracing_gpu::clock::{Calibration, HostClock};
//! use tracing_gpu::cuda::calibrate::Calibrator;
//! let ctx = tracing_gpu::cuda::cudarc::driver::CudaContext::new(0)?;
//! let mut calibrator = Calibrator::new(&ctx)?;
//! let mut calibration = Calibration::new(calibrator.calibrate(Calibrator::INITIAL_ROUNDS)?);
//! // ... work on the GPU; then, periodically and after the work to be mapped:
//! calibration.push(calibrator.calibrate(Calibrator::PERIODIC_ROUNDS)?)?;
//! # let device_ns = 0;
//! let host_ns = calibration.to_host(HostClock::Boottime, device_ns);
//! # Ok(()) }
//! ```

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};

use crate::clock::{
    Checkpoint, ClockError, ClockMap, FitOptions, HostClock, HostOffsets, Sample,
    GLOBALTIMER_STEP_NS,
};
use crate::cuda::compile::{compile, ensure_libraries, KernelBuild};
use crate::cuda::error::CalibrateError;

mod lanes;

use lanes::Lanes;

/// The calibration kernels' source, embedded; public for `tests/calibrate.rs`,
/// which compiles it as the calibrator does.
#[doc(hidden)]
pub const CALIBRATE_SOURCE: &str = include_str!("../../../kernels/calibrate.cu");

/// Pinned host memory mapped into the device's address space.
struct MappedHost {
    ctx: Arc<CudaContext>,
    host: *mut u64,
    device: sys::CUdeviceptr,
    words: usize,
}

// SAFETY: the allocation is owned by this value and freed once, in `drop`; the
// words are only accessed through atomics.
unsafe impl Send for MappedHost {}

impl MappedHost {
    fn new(ctx: &Arc<CudaContext>, words: usize) -> Result<MappedHost, CalibrateError> {
        ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation; its contents are zeroed below before any use.
        let host = unsafe { result::malloc_host(words * 8, flags) }? as *mut u64;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was returned by cuMemHostAlloc with DEVICEMAP just above.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) }
                .result();
        let mem = MappedHost {
            ctx: ctx.clone(),
            host,
            device,
            words,
        };
        mapped?;
        for i in 0..words {
            mem.word(i).store(0, Ordering::Relaxed);
        }
        Ok(mem)
    }

    /// Word `i` (< `words`), shared with the device.
    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.words, "mapped word {i} out of {}", self.words);
        // SAFETY: in bounds; cuMemHostAlloc returns page-aligned memory, so every
        // word is 8-byte aligned; it lives as long as `self`.
        unsafe { AtomicU64::from_ptr(self.host.add(i)) }
    }

    fn device_ptr(&self, word: usize) -> sys::CUdeviceptr {
        self.device + 8 * word as u64
    }

    /// Never unpins the pages (a kernel may still use them): they go with the
    /// context.
    fn keep_pinned(&mut self) {
        self.host = std::ptr::null_mut();
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        if self.host.is_null() {
            // Left pinned (`Calibrator`'s drop says why).
            return;
        }
        // Nothing to report to from a drop: a failure leaks the page.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_host` in `new`, freed only here.
        let _ = unsafe { result::free_host(self.host as *mut c_void) };
    }
}

/// Layout of a lane's slot of mapped words: the flag on its own 128-byte line,
/// then the answers, then the stale-poll times.
const CMD: usize = 0;
const ACK: usize = 16;
/// Rounds per kernel launch; longer requests run several launches.
const ROUNDS_PER_LAUNCH: usize = 4096;
/// Rounds run and thrown away at the start of each launch: the first waits for
/// the kernel to start, and the next ones warm the path.
const WARMUP_ROUNDS: usize = 8;
const LAUNCH_ROUNDS: usize = ROUNDS_PER_LAUNCH + WARMUP_ROUNDS;
const STALE: usize = ACK + LAUNCH_ROUNDS.next_multiple_of(16);
const WORDS: usize = STALE + LAUNCH_ROUNDS;
/// A slot's stride: whole 128-byte lines, so each flag has its line.
const SLOT_WORDS: usize = WORDS.next_multiple_of(16);
/// Lanes (stream + slot): the one in use and those abandoned after a timeout
/// whose kernel has not run yet. All slots are pinned when the calibrator is
/// made (4 × 66 KB): pinning and unpinning host memory while a kernel runs may
/// wait for the GPU, which is what a timeout must not do. Four allow four
/// recalibrations that time out before one fails at once.
pub const LANES: usize = 4;
/// What the kernel takes as "stop now".
const STOP: u64 = u64::MAX;

/// Samples one GPU's clock against the host's. Create one per device and keep
/// it: creation compiles the kernel and pins host memory (tens of ms);
/// [`Calibrator::calibrate`] then costs about the rounds' round trips plus a
/// kernel launch (see docs/calibration.md for measured costs).
pub struct Calibrator {
    ctx: Arc<CudaContext>,
    lanes: Lanes<Arc<CudaStream>>,
    /// The streams' priority: the context's highest.
    priority: i32,
    calibrate: CudaFunction,
    calibrate_pollers: CudaFunction,
    /// [`LANES`] slots of [`SLOT_WORDS`].
    mem: MappedHost,
    timer_step_ns: u64,
    options: FitOptions,
    timeout: Duration,
    pollers: u32,
}

impl std::fmt::Debug for Calibrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calibrator")
            .field("ordinal", &self.ctx.ordinal())
            .field("timer_step_ns", &self.timer_step_ns)
            .field("pollers", &self.pollers)
            .field("abandoned", &self.lanes.abandoned())
            .field("options", &self.options)
            .finish()
    }
}

impl Calibrator {
    /// Rounds for a first, thorough calibration.
    pub const INITIAL_ROUNDS: usize = 2000;
    /// Rounds for a cheap periodic recalibration.
    pub const PERIODIC_ROUNDS: usize = 128;
    /// GPU pollers by default (see [`Calibrator::set_pollers`]): two. On the
    /// H200 two pollers kept the bound over a burst's window under 1 µs in
    /// every burst and the profiler's median bound at 0.9 µs, where one gave
    /// up to 1.12 and 1.28 µs; more than two add nothing (docs/calibration.md).
    pub const DEFAULT_POLLERS: u32 = 2;
    /// How long a round may go unanswered by default: long enough for a
    /// kernel queued behind short ones to start.
    pub const TIMEOUT: Duration = Duration::from_secs(2);
    /// The timeout the profiler's collector uses while a streamed launch runs.
    /// On the H200 no kernel started beside a persistent kernel within 3 s, on
    /// any stream or priority, and a module load blocked until it ended
    /// (`stream --probe`, docs/performance.md): a round that is not answered
    /// within this will not be, and the collector does not stop for longer.
    /// A round answered at all takes microseconds.
    pub const TIMEOUT_BESIDE_STREAM: Duration = Duration::from_millis(50);

    /// A calibrator for the context's device: checks that the CUDA libraries
    /// load, compiles the kernels with NVRTC, pins the ping-pong memory, and
    /// measures the timer's step (which sets [`FitOptions::timer_step_ns`]).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Calibrator, CalibrateError> {
        Self::with_lineinfo(ctx, true)
    }

    /// [`Calibrator::new`], with the kernels' line info on or off
    /// ([`KernelBuild::lineinfo()`]).
    pub fn with_lineinfo(
        ctx: &Arc<CudaContext>,
        lineinfo: bool,
    ) -> Result<Calibrator, CalibrateError> {
        ensure_libraries()?;
        // A virtual architecture: the driver JIT-compiles this PTX for any newer GPU.
        let ptx = compile(
            CALIBRATE_SOURCE,
            &KernelBuild::new("calibrate.cu", "compute_75").lineinfo(lineinfo),
        )?;
        let module = ctx.load_module(ptx)?;
        let calibrate = module.load_function("tgpu_calibrate")?;
        let calibrate_pollers = module.load_function("tgpu_calibrate_pollers")?;
        let step_fn = module.load_function("tgpu_timer_step")?;
        ctx.bind_to_thread()?;
        let (_, priority) = result::stream::get_priority_range()?;
        let stream = new_stream(ctx, priority)?;
        let mem = MappedHost::new(ctx, LANES * SLOT_WORDS)?;
        let mut me = Calibrator {
            ctx: ctx.clone(),
            lanes: Lanes::new(stream, LANES),
            priority,
            calibrate,
            calibrate_pollers,
            mem,
            timer_step_ns: GLOBALTIMER_STEP_NS,
            options: FitOptions::default(),
            timeout: Calibrator::TIMEOUT,
            pollers: Self::DEFAULT_POLLERS,
        };
        me.timer_step_ns = me.measure_timer_step(&step_fn)?;
        me.options.timer_step_ns = me.timer_step_ns;
        Ok(me)
    }

    /// The smallest step `%globaltimer` was seen to take (ns): 32 on Hopper.
    pub fn timer_step_ns(&self) -> u64 {
        self.timer_step_ns
    }

    /// The options [`Calibrator::fit`] uses (the timer step is the measured one).
    pub fn fit_options(&self) -> &FitOptions {
        &self.options
    }

    /// Replaces the fit options.
    pub fn set_fit_options(&mut self, options: FitOptions) {
        self.options = options;
    }

    /// How long a round may go unanswered before its kernel is given up on
    /// ([`Calibrator::TIMEOUT`] by default), with [`CalibrateError::Timeout`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// How many GPU threads poll the flag (1 to 32, each in its own warp),
    /// staggered so that a read reaches host memory every read latency /
    /// `pollers`. With one, the read that sees the flag has usually just
    /// missed it, and only about 1 round in 200 has a fast forward path; with
    /// two or more (`tgpu_calibrate_pollers`) fast rounds are the rule
    /// (docs/calibration.md).
    pub fn set_pollers(&mut self, pollers: u32) -> Result<(), CalibrateError> {
        if !(1..=32).contains(&pollers) {
            return Err(CalibrateError::Invalid("pollers must be 1 to 32"));
        }
        self.pollers = pollers;
        Ok(())
    }

    /// How many GPU threads poll the flag.
    pub fn pollers(&self) -> u32 {
        self.pollers
    }

    /// `n` ping-pong rounds stamped with the trace clock (BOOTTIME): `n`
    /// two-sided samples, followed by the one-sided ones from stale polls.
    ///
    /// Never waits on a kernel that does not answer: see the module's docs.
    pub fn sample(&mut self, n: usize) -> Result<Vec<Sample>, CalibrateError> {
        self.sample_with(HostClock::Boottime, n)
    }

    /// As [`Calibrator::sample`], stamped with any host clock (to compare them;
    /// a [`crate::clock::Calibration`] wants BOOTTIME).
    pub fn sample_with(
        &mut self,
        clock: HostClock,
        n: usize,
    ) -> Result<Vec<Sample>, CalibrateError> {
        if n == 0 {
            return Err(CalibrateError::Invalid(
                "a calibration needs at least one round",
            ));
        }
        let mut two = Vec::with_capacity(n);
        let mut one = Vec::with_capacity(n);
        let mut left = n;
        while left > 0 {
            let rounds = left.min(ROUNDS_PER_LAUNCH);
            self.launch_rounds(clock, rounds, &mut two, &mut one)?;
            left -= rounds;
        }
        two.append(&mut one);
        Ok(two)
    }

    /// Fits samples with this calibrator's options.
    pub fn fit(&self, samples: &[Sample]) -> Result<ClockMap, ClockError> {
        ClockMap::fit_with(samples, &self.options)
    }

    /// A checkpoint from samples taken just now with [`Calibrator::sample`]:
    /// their map, and the host clocks' offsets read now.
    pub fn checkpoint(&self, samples: &[Sample]) -> Result<Checkpoint, ClockError> {
        Ok(Checkpoint {
            map: self.fit(samples)?,
            host_offsets: HostOffsets::measure(),
        })
    }

    /// Samples `n` rounds and fits them: one checkpoint, to start a
    /// [`crate::clock::Calibration`] with or to push onto one. Use
    /// [`Calibrator::INITIAL_ROUNDS`] first and [`Calibrator::PERIODIC_ROUNDS`] after.
    pub fn calibrate(&mut self, n: usize) -> Result<Checkpoint, CalibrateError> {
        let samples = self.sample(n)?;
        Ok(self.checkpoint(&samples)?)
    }

    /// One launch of `rounds` (+ warm-up) ping-pongs, on the current lane (a
    /// fresh one after a timeout).
    fn launch_rounds(
        &mut self,
        clock: HostClock,
        rounds: usize,
        two: &mut Vec<Sample>,
        one: &mut Vec<Sample>,
    ) -> Result<(), CalibrateError> {
        let (stream, slot) = self.lane()?;
        self.ping_pong(&stream, slot, clock, rounds, two, one)
    }

    /// The lane to launch on (its stream and slot), after freeing the slots of
    /// abandoned lanes whose kernel has run: the current one, or a new stream
    /// on a free slot if the last was abandoned.
    fn lane(&mut self) -> Result<(Arc<CudaStream>, usize), CalibrateError> {
        self.ctx.bind_to_thread()?;
        // An error is no proof the kernel will not run: such a lane stays.
        let done = self
            .lanes
            .reap(|stream| matches!(stream_done(stream), Ok(true)));
        let (ctx, priority) = (&self.ctx, self.priority);
        let lane = match self.lanes.current_or_open(|| new_stream(ctx, priority)) {
            Ok(Some(lane)) => Ok((lane.stream.clone(), lane.slot)),
            Ok(None) => Err(CalibrateError::Stuck {
                kernels: self.lanes.abandoned(),
            }),
            Err(e) => Err(e),
        };
        // Destroyed only now: cudarc synchronizes the whole context when it
        // makes a stream while it counts none, which would wait for the kernel
        // that the last lane was stuck behind.
        drop(done);
        lane
    }

    /// One launch on the lane (`stream`, `slot`). On a timeout the lane is
    /// abandoned, not waited on, and [`CalibrateError::Timeout`] returned.
    fn ping_pong(
        &mut self,
        stream: &CudaStream,
        slot: usize,
        clock: HostClock,
        rounds: usize,
        two: &mut Vec<Sample>,
        one: &mut Vec<Sample>,
    ) -> Result<(), CalibrateError> {
        let total = rounds + WARMUP_ROUNDS;
        let base = slot * SLOT_WORDS;
        let mem = &self.mem;
        mem.word(base + CMD).store(0, Ordering::SeqCst);
        for i in 0..total {
            mem.word(base + ACK + i).store(0, Ordering::Relaxed);
            mem.word(base + STALE + i).store(0, Ordering::Relaxed);
        }
        let (cmd_ptr, ack_ptr, stale_ptr) = (
            mem.device_ptr(base + CMD),
            mem.device_ptr(base + ACK),
            mem.device_ptr(base + STALE),
        );
        let (total_u32, slot_u32) = (total as u32, slot as u32);
        // One poller: the single-thread kernel; more: one thread per warp, and
        // the slot, whose claim word they share (kernels/calibrate.cu).
        let (function, threads) = match self.pollers {
            1 => (&self.calibrate, 1),
            p => (&self.calibrate_pollers, 32 * p),
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&cmd_ptr)
            .arg(&ack_ptr)
            .arg(&stale_ptr)
            .arg(&total_u32);
        if self.pollers > 1 {
            launch.arg(&slot_u32);
        }
        // SAFETY: the kernel takes (const u64*, u64*, u64*, unsigned[, unsigned]) as passed; the
        // pointers map the lane's slot of `mem`, which outlives the kernel: it is
        // synchronized below once it has answered every round, or else its lane
        // is abandoned, and the slot is neither used again nor freed until the
        // stream is found done (`Calibrator`'s drop leaves `mem` pinned otherwise).
        unsafe { launch.launch(cfg) }?;

        let mut stamps: Vec<(u64, u64, u64, u64)> = Vec::with_capacity(total);
        for i in 0..total {
            let ack = mem.word(base + ACK + i);
            let before = clock.now_ns();
            // A locked store: it is visible to the device before `posted` is read.
            mem.word(base + CMD).swap(i as u64 + 1, Ordering::SeqCst);
            let posted = clock.now_ns();
            let mut spins = 0u32;
            let mut deadline: Option<Instant> = None;
            let device = loop {
                let v = ack.load(Ordering::Acquire);
                if v != 0 {
                    break v;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) {
                    let now = Instant::now();
                    match deadline {
                        None => deadline = Some(now + self.timeout),
                        Some(d) if now > d => {
                            // The kernel returns on STOP, in its own slot,
                            // whenever it runs. Waiting for that could take
                            // as long as the kernel it is queued behind.
                            mem.word(base + CMD).store(STOP, Ordering::SeqCst);
                            self.lanes.abandon();
                            // A kernel (this one or another) that failed shows here.
                            stream_done(stream)?;
                            return Err(CalibrateError::Timeout {
                                round: i,
                                timeout: self.timeout,
                            });
                        }
                        Some(_) => {}
                    }
                }
            };
            let after = clock.now_ns();
            stamps.push((before, posted, device, after));
        }
        // Every round is answered: the kernel is returning.
        stream.synchronize()?;
        for (i, &(before, posted, device, after)) in stamps.iter().enumerate().skip(WARMUP_ROUNDS) {
            two.push(Sample {
                host_before: before,
                device,
                host_after: after,
            });
            let stale = mem.word(base + STALE + i).load(Ordering::Acquire);
            if stale != 0 {
                one.push(Sample::at_most(stale, posted));
            }
        }
        Ok(())
    }

    /// Runs `tgpu_timer_step` (in the first lane, which no kernel has used
    /// yet) and returns the smallest non-zero step of `%globaltimer`.
    fn measure_timer_step(&mut self, step_fn: &CudaFunction) -> Result<u64, CalibrateError> {
        let (stream, slot) = self.lane()?;
        let out = slot * SLOT_WORDS + STALE;
        for i in 0..3 {
            self.mem.word(out + i).store(0, Ordering::Relaxed);
        }
        let out_ptr = self.mem.device_ptr(out);
        let reads: u32 = 1 << 16;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(step_fn);
        launch.arg(&out_ptr).arg(&reads);
        // SAFETY: the kernel takes (u64*, unsigned); it writes three words of `mem`
        // and is synchronized before they are read.
        unsafe { launch.launch(cfg) }?;
        stream.synchronize()?;
        let step = self.mem.word(out).load(Ordering::Acquire);
        let changes = self.mem.word(out + 1).load(Ordering::Acquire);
        if changes == 0 || step == 0 || step == u64::MAX || step > 1_000_000 {
            return Err(CalibrateError::Invalid(
                "%globaltimer did not advance in steps of at most 1 ms",
            ));
        }
        Ok(step)
    }
}

impl Drop for Calibrator {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        self.lanes
            .reap(|stream| matches!(stream_done(stream), Ok(true)));
        if self.lanes.abandoned() > 0 {
            // Kernels given up on are still queued (behind a kernel that may run
            // for minutes) and will read their slots and run the module's code.
            // Waiting is what a timeout must not do, and unpinning the memory or
            // unloading the module under them is unsafe. So both are kept until
            // the process ends: at most LANES slots' worth of pinned pages, once
            // per calibrator dropped in that state (the context stays retained).
            // Destroying the streams is safe: the driver releases a stream once
            // its work is done.
            self.mem.keep_pinned();
            std::mem::forget(self.calibrate.clone());
        }
    }
}

/// A non-blocking stream of the context at `priority` (its highest, from
/// `cuCtxGetStreamPriorityRange`). Priority orders the blocks waiting for an
/// SM, so on a GPU busy with large grids the calibration kernel's one block
/// starts before their later waves. It is not documented to change which
/// hardware queue a stream is fed through, so it does nothing against false
/// serialization behind a long kernel in the same queue, nor against a kernel
/// whose blocks hold every SM's room for their whole run (blocks are not
/// preempted for priority). Not measured on a GPU.
fn new_stream(ctx: &Arc<CudaContext>, priority: i32) -> Result<Arc<CudaStream>, CalibrateError> {
    Ok(ctx.new_stream_with_priority(priority)?)
}

/// Whether the stream has nothing left to run: a cheap query that never waits.
/// An error is a failed launch or kernel, there or elsewhere in the context.
fn stream_done(stream: &CudaStream) -> Result<bool, CalibrateError> {
    // SAFETY: a live stream of the context bound to this thread; the query
    // only reads its state.
    match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => {
            r.result()?;
            Ok(true)
        }
    }
}
