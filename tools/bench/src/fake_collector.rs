//! A stand-in for the profiler's collector thread that makes its driver calls and
//! nothing else (`storm`'s *floor + collector calls* variant, issue #12): it tells
//! whether the collector's driver calls, made beside a storm of launch calls, slow
//! those calls down inside the driver, apart from everything else the profiler does
//! (its locks, its channel, the longer recorded kernels).
//!
//! The launching threads record one event per launch from a ring of their own
//! ([`Marks::record`], no lock: an event pool's lock is one of the other suspects).
//! The [`FakeCollector`] makes the calls of the real collector's pass
//! (`src/cuda/collector/pass.rs`, `device/cuda.rs`), at least as often: one `cuEventQuery` per
//! finished launch plus one per stream for the first unfinished one; then, when some
//! have finished, one `cuMemcpyDtoHAsync` of their trace bytes and one
//! `cuMemsetD8Async` on a non-blocking stream of its own, each waited for through a
//! blocking-sync event; when none has, it sleeps 100 µs. It does not decode, so its
//! passes come at least as often as the real one's, each bringing back fewer launches.
//!
//! [`Queries::Bisect`] asks fewer events than the real collector does, as a
//! collector could: the newest of each stream first (if it has finished, so have all
//! before it), else a binary search for the first unfinished one; against
//! [`Queries::PerLaunch`], it says whether the event queries are what costs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cudarc::driver::{result, sys, CudaStream, DriverError};

/// Events per launching thread: more than a stream's queue of launches holds, so
/// that a thread does not record an event again before the collector has seen it.
const RING: usize = 4096;

/// How long the collector sleeps when nothing has finished (the real one's
/// `CudaDevice::POLL`).
const POLL: Duration = Duration::from_micros(100);

/// An owned driver event.
struct Event(sys::CUevent);

// SAFETY: a CUevent handle may be used from any thread of the process.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// A new event of the bound context.
    fn new(flags: sys::CUevent_flags) -> Result<Event, DriverError> {
        result::event::create(flags).map(Event)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// One launching thread's launch events, and how many it has recorded.
pub struct Marks {
    events: Vec<Event>,
    /// Events recorded so far (the next goes to `events[made % RING]`).
    made: AtomicU64,
}

impl Marks {
    /// A ring of events in the bound context.
    pub fn new() -> Result<Marks, DriverError> {
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        Ok(Marks {
            events: (0..RING)
                .map(|_| Event::new(flags))
                .collect::<Result<_, _>>()?,
            made: AtomicU64::new(0),
        })
    }

    /// What the profiled launch call does after the launch, on the driver's side:
    /// asks whether `stream` captures (not the legacy stream, which cannot) and
    /// records the next event of the ring on it. Only its own thread calls it.
    pub fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        let made = self.made.load(Ordering::Relaxed);
        let event = &self.events[made as usize % RING];
        // SAFETY: a live stream and event of the bound context.
        unsafe {
            if !stream.cu_stream().is_null() {
                result::stream::is_capturing(stream.cu_stream())?;
            }
            result::event::record(event.0, stream.cu_stream())?;
        }
        // Release: the collector queries only events recorded before it sees the count.
        self.made.store(made + 1, Ordering::Release);
        Ok(())
    }
}

/// Which events a pass asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queries {
    /// Each launch's, in order, up to the first unfinished one (the real collector).
    PerLaunch,
    /// The newest launch's, then a binary search: about log2(launches) per stream.
    Bisect,
}

/// What the fake collector did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Passes {
    /// Passes that found launches finished (each: one copy, one memset, two waits).
    pub bulk: u64,
    /// Passes that found none (each followed by a 100 µs sleep).
    pub idle: u64,
    /// Launches it saw finish.
    pub launches: u64,
    /// `cuEventQuery` calls.
    pub queries: u64,
}

/// The fake collector: device memory to copy back and zero, its pinned mirror, its
/// stream and its wait event.
pub struct FakeCollector {
    dptr: sys::CUdeviceptr,
    host: *mut u8,
    len: usize,
    stream: sys::CUstream,
    done: Event,
}

// SAFETY: driver handles and pinned memory may be used from any thread; only the
// collector's thread uses them once it runs.
unsafe impl Send for FakeCollector {}
unsafe impl Sync for FakeCollector {}

impl FakeCollector {
    /// `len` bytes of device memory and as much pinned host memory (the profiler's
    /// arena and mirror), a non-blocking stream and a blocking-sync event, in the
    /// bound context.
    pub fn new(len: usize) -> Result<FakeCollector, DriverError> {
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        let done = Event::new(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)?;
        // SAFETY: plain allocations, freed by Drop; zeroed before use.
        unsafe {
            let dptr = result::malloc_sync(len)?;
            let host = result::malloc_host(len, 0)?.cast::<u8>();
            result::memset_d8_async(dptr, 0, len, stream)?;
            result::stream::synchronize(stream)?;
            Ok(FakeCollector {
                dptr,
                host,
                len,
                stream,
                done,
            })
        }
    }

    /// Runs passes over `marks` (each thread's events) until `stop` is set and every
    /// recorded event has finished; each finished launch brings back `trace_bytes`.
    /// The calling thread must have bound the context.
    pub fn run(
        &self,
        marks: &[Marks],
        trace_bytes: usize,
        queries: Queries,
        stop: &AtomicBool,
    ) -> Result<Passes, DriverError> {
        let mut seen = vec![0u64; marks.len()];
        let mut passes = Passes::default();
        loop {
            let stopping = stop.load(Ordering::Acquire);
            let mut finished = 0usize;
            let mut pending = false;
            for (m, seen) in marks.iter().zip(&mut seen) {
                let made = m.made.load(Ordering::Acquire);
                let mut query = |i: u64| {
                    passes.queries += 1;
                    // SAFETY: a live event of the bound context.
                    match unsafe { sys::cuEventQuery(m.events[i as usize % RING].0) } {
                        sys::CUresult::CUDA_SUCCESS => Ok(true),
                        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                        e => Err(DriverError(e)),
                    }
                };
                // The first unfinished launch (launches on a stream finish in order).
                let first = match queries {
                    Queries::PerLaunch => {
                        let mut i = *seen;
                        while i < made && query(i)? {
                            i += 1;
                        }
                        i
                    }
                    Queries::Bisect if *seen == made || query(made - 1)? => made,
                    Queries::Bisect => {
                        // Finished below `lo`, unfinished at `hi`.
                        let (mut lo, mut hi) = (*seen, made - 1);
                        while lo < hi {
                            let mid = lo + (hi - lo) / 2;
                            match query(mid)? {
                                true => lo = mid + 1,
                                false => hi = mid,
                            }
                        }
                        lo
                    }
                };
                pending |= first < made;
                finished += (first - *seen) as usize;
                *seen = first;
            }
            if finished == 0 {
                if stopping && !pending {
                    return Ok(passes);
                }
                passes.idle += 1;
                std::thread::sleep(POLL);
                continue;
            }
            passes.bulk += 1;
            passes.launches += finished as u64;
            self.bring_back((finished * trace_bytes).min(self.len))?;
        }
    }

    /// The real collector's bulk calls for `len` bytes: copy back, wait, zero, wait.
    fn bring_back(&self, len: usize) -> Result<(), DriverError> {
        // SAFETY: our own device range, pinned mirror (only this thread touches
        // it), stream and event.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.host, len);
            result::memcpy_dtoh_async(dst, self.dptr, self.stream)?;
            result::event::record(self.done.0, self.stream)?;
            result::event::synchronize(self.done.0)?;
            result::memset_d8_async(self.dptr, 0, len, self.stream)?;
            result::event::record(self.done.0, self.stream)?;
            result::event::synchronize(self.done.0)
        }
    }
}

impl Drop for FakeCollector {
    fn drop(&mut self) {
        // SAFETY: owned, freed once; nothing is pending after `run` returned (each
        // pass waits for its work).
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            let _ = result::free_sync(self.dptr);
            let _ = result::free_host(self.host.cast());
            let _ = result::stream::destroy(self.stream);
        }
    }
}
