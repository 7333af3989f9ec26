//! `storm`'s floor variants: the driver calls a profiled launch makes besides the
//! launch itself, made bare, so that a storm can subtract them.

use tracing_gpu::cuda::cudarc::driver::{result, sys, CudaStream, DriverError};

/// The floor variants' driver calls: a capture check, as `Profiler::launch` makes
/// it, and a mark of its own: none (as `Profiler::launch`, whose collector marks
/// launches), an event, or a cell of mapped host memory written by the stream.
pub struct Floor {
    event: sys::CUevent,
    cell: *mut std::ffi::c_void,
    cell_dptr: sys::CUdeviceptr,
}

/// What the floor marks a launch with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Nothing.
    None,
    /// An event recorded on the stream.
    Event,
    /// A cell of mapped host memory the stream writes.
    Cell,
}

impl Default for Floor {
    fn default() -> Floor {
        Floor {
            event: std::ptr::null_mut(),
            cell: std::ptr::null_mut(),
            cell_dptr: 0,
        }
    }
}

impl Floor {
    /// Its event and its cell, made in the bound context.
    pub fn new() -> Result<Floor, DriverError> {
        let mut f = Floor::default();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointers; the thread has bound the profiler's context;
        // what is made is owned by `f`, freed by its drop.
        unsafe {
            sys::cuEventCreate(&mut f.event, flags).result()?;
            f.cell = result::malloc_host(4, sys::CU_MEMHOSTALLOC_DEVICEMAP)?;
            sys::cuMemHostGetDevicePointer_v2(&mut f.cell_dptr, f.cell, 0).result()?;
        }
        Ok(f)
    }

    /// The capture check, then the mark.
    pub fn after_capture_check(&self, stream: &CudaStream, mark: Mark) -> Result<(), DriverError> {
        let write = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: a live stream, event and mapped cell of the bound context.
        unsafe {
            if !stream.cu_stream().is_null() {
                result::stream::is_capturing(stream.cu_stream())?;
            }
            match mark {
                Mark::None => Ok(()),
                Mark::Cell => {
                    sys::cuStreamWriteValue32_v2(stream.cu_stream(), self.cell_dptr, 1, write)
                        .result()
                }
                Mark::Event => sys::cuEventRecord(self.event, stream.cu_stream()).result(),
            }
        }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once; the storm synchronized its streams.
        unsafe {
            if !self.event.is_null() {
                let _ = sys::cuEventDestroy_v2(self.event);
            }
            if !self.cell.is_null() {
                let _ = result::free_host(self.cell);
            }
        }
    }
}
