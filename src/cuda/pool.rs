//! Trace buffers and the pool that reuses them.
//!
//! A [`TraceBuffer`] is device memory for one launch's records, a pinned host
//! mirror of the same size (the target of the asynchronous copy back), and the two
//! events that order its life: `done`, recorded on the application's stream right
//! after the launch, and `copied`, recorded on the profiler's copy stream once the
//! buffer has been copied back and zeroed again. A buffer leaves the pool zeroed,
//! so the launch path adds no copy and no memset to the application's stream.
//!
//! Raw driver calls are used on purpose: cudarc's safe buffers track reads and
//! writes with events of their own and switch the application's context to its
//! multi-stream mode, which a profiler must not do behind the application's back.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};
use parking_lot::{Condvar, Mutex};

/// An owned driver event.
pub(crate) struct Event {
    raw: sys::CUevent,
}

// SAFETY: a CUevent handle may be used from any thread of the process.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// A new event without timing; `blocking` makes `synchronize` sleep rather
    /// than spin (the collector thread must not burn a core while it waits).
    pub(crate) fn new(blocking: bool) -> Result<Event, DriverError> {
        let mut flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        if blocking {
            flags |= sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the caller has bound a context.
        unsafe { sys::cuEventCreate(&mut raw, flags).result()? };
        Ok(Event { raw })
    }

    /// Records the event on `stream`.
    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: both handles are live; the caller has bound their context.
        unsafe { result::event::record(self.raw, stream) }
    }

    /// Waits until the work recorded before the event has finished.
    pub(crate) fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: the event is live.
        unsafe { result::event::synchronize(self.raw) }
    }

    /// Makes `stream` wait for the event.
    pub(crate) fn wait_on(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: both handles are live.
        unsafe {
            result::stream::wait_event(
                stream,
                self.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is live and dropped once. Destroying an event that is
        // still pending is allowed; its resources go when it completes.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// An owned non-blocking stream (it never synchronises with the legacy default
/// stream, so the application's work on stream 0 does not wait for ours).
pub(crate) struct Stream {
    ctx: Arc<CudaContext>,
    raw: sys::CUstream,
}

// SAFETY: a CUstream handle may be used from any thread of the process.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Stream, DriverError> {
        ctx.bind_to_thread()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the stream is live and destroyed once; pending work still runs.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// Device memory, its pinned host mirror, and the events of one launch.
pub(crate) struct TraceBuffer {
    ctx: Arc<CudaContext>,
    /// Device address of the buffer.
    pub(crate) dptr: sys::CUdeviceptr,
    host: NonNull<u8>,
    /// Size in bytes (of both the device memory and the mirror).
    pub(crate) size: usize,
    /// Recorded on the application's stream after the launch.
    pub(crate) done: Event,
    /// Recorded on the copy stream after the copy back and the zeroing.
    pub(crate) copied: Event,
    /// Whether the device memory is known to be zero (false only when new).
    zeroed: bool,
}

// SAFETY: the buffer is owned by one launch at a time; the pinned mirror is plain
// host memory that only the owner touches, once `copied` has completed.
unsafe impl Send for TraceBuffer {}

impl TraceBuffer {
    /// Allocates `size` bytes on the device (not zeroed yet: see
    /// [`TraceBuffer::zero_before_use`]) and a pinned mirror.
    fn new(ctx: &Arc<CudaContext>, size: usize) -> Result<TraceBuffer, DriverError> {
        ctx.bind_to_thread()?;
        let done = Event::new(false)?;
        let copied = Event::new(true)?;
        // SAFETY: plain allocations; checked below, freed in Drop (or here on error).
        let dptr = unsafe { result::malloc_sync(size)? };
        let host = match unsafe { result::malloc_host(size, 0) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: just allocated, not shared.
                let _ = unsafe { result::free_sync(dptr) };
                return Err(e);
            }
        };
        let buf = TraceBuffer {
            ctx: ctx.clone(),
            dptr,
            host: NonNull::new(host.cast::<u8>()).expect("cuMemHostAlloc returned null on success"),
            size,
            done,
            copied,
            zeroed: false,
        };
        Ok(buf)
    }

    /// Zeroes a new buffer on the stream of its first launch, so that the
    /// launch is ordered after it (a synchronous `cuMemset` is not ordered with
    /// non-blocking streams). Returns whether it had to (the buffer is new).
    pub(crate) fn zero_before_use(&mut self, stream: sys::CUstream) -> Result<bool, DriverError> {
        if self.zeroed {
            return Ok(false);
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the device range is ours; the stream is live.
        unsafe { result::memset_d8_async(self.dptr, 0, self.size, stream)? };
        self.zeroed = true;
        Ok(true)
    }

    /// Enqueues on `stream`, after `done`: the copy of the first `used` bytes into
    /// the mirror, then zeroing them on the device; records `copied` after both.
    /// The caller has bound the context (`Profiler::launch` has, on the launching
    /// thread, just before).
    pub(crate) fn enqueue_copy_back(
        &mut self,
        used: usize,
        stream: &Stream,
    ) -> Result<(), DriverError> {
        assert!(used <= self.size);
        self.done.wait_on(stream.raw())?;
        // SAFETY: the mirror holds `size ≥ used` pinned bytes that nobody reads
        // until `copied` completes; the device range is ours.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.host.as_ptr(), used);
            result::memcpy_dtoh_async(dst, self.dptr, stream.raw())?;
            result::memset_d8_async(self.dptr, 0, used, stream.raw())?;
        }
        self.copied.record(stream.raw())
    }

    /// The mirror's first `used` bytes. Call only after `copied` has completed.
    pub(crate) fn mirror(&self, used: usize) -> &[u8] {
        assert!(used <= self.size);
        // SAFETY: pinned host memory of `size` bytes, not written by the device
        // once `copied` has completed (the caller's duty).
        unsafe { std::slice::from_raw_parts(self.host.as_ptr(), used) }
    }
}

impl Drop for TraceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: owned allocations, freed once. A buffer is dropped only when
            // no launch or copy uses it (or the context is already broken).
            unsafe {
                let _ = result::free_sync(self.dptr);
                let _ = result::free_host(self.host.as_ptr().cast());
            }
        }
    }
}

/// Reuses trace buffers across launches, within a byte limit on what is
/// allocated (free and in use together).
pub(crate) struct Pool {
    ctx: Arc<CudaContext>,
    state: Mutex<PoolState>,
    returned: Condvar,
    limit: usize,
}

struct PoolState {
    free: Vec<TraceBuffer>,
    /// Bytes allocated, free and in use.
    allocated: usize,
}

impl Pool {
    pub(crate) fn new(ctx: &Arc<CudaContext>, limit: usize) -> Pool {
        Pool {
            ctx: ctx.clone(),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                allocated: 0,
            }),
            returned: Condvar::new(),
            limit,
        }
    }

    /// The byte limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes allocated now, free and in use.
    pub(crate) fn allocated(&self) -> usize {
        self.state.lock().allocated
    }

    /// A buffer of at least `size` bytes: the smallest free one that fits,
    /// else a new one if the limit allows (dropping free buffers that are too
    /// small to make room). `Ok(None)` when everything is in use; with `wait`,
    /// waits for a buffer to come back instead.
    pub(crate) fn acquire(
        &self,
        size: usize,
        wait: bool,
    ) -> Result<Option<TraceBuffer>, DriverError> {
        if size > self.limit {
            return Ok(None);
        }
        let mut st = self.state.lock();
        loop {
            let best = st
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.size >= size)
                .min_by_key(|(_, b)| b.size)
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(Some(st.free.swap_remove(i)));
            }
            while st.allocated + size > self.limit && !st.free.is_empty() {
                let b = st.free.pop().expect("not empty");
                st.allocated -= b.size;
            }
            if st.allocated + size <= self.limit {
                st.allocated += size;
                drop(st);
                return match TraceBuffer::new(&self.ctx, size) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) => {
                        self.state.lock().allocated -= size;
                        Err(e)
                    }
                };
            }
            if !wait {
                return Ok(None);
            }
            self.returned.wait(&mut st);
        }
    }

    /// Allocates up to `count` more buffers of `size` bytes and keeps them free,
    /// within the limit; returns how many it allocated.
    pub(crate) fn reserve(&self, size: usize, count: usize) -> Result<usize, DriverError> {
        for made in 0..count {
            {
                let mut st = self.state.lock();
                if st.allocated + size > self.limit {
                    return Ok(made);
                }
                st.allocated += size;
            }
            match TraceBuffer::new(&self.ctx, size) {
                Ok(b) => self.release(b),
                Err(e) => {
                    self.state.lock().allocated -= size;
                    return Err(e);
                }
            }
        }
        Ok(count)
    }

    /// Puts a zeroed buffer back (its zeroing complete, as seen from the host).
    pub(crate) fn release(&self, buf: TraceBuffer) {
        self.state.lock().free.push(buf);
        self.returned.notify_all();
    }

    /// Forgets a buffer whose state is unknown (after an error): frees it.
    pub(crate) fn discard(&self, buf: TraceBuffer) {
        let size = buf.size;
        drop(buf);
        self.state.lock().allocated -= size;
        self.returned.notify_all();
    }
}
