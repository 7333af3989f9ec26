//! `storm`'s floor variants: the driver calls a profiled launch makes besides the
//! launch itself, made bare, so that a storm can subtract them.

use tracing_gpu::cuda::cudarc::driver::{result, sys, CudaStream, DriverError};

/// A mark of its own, made after a capture check: the floor variants' driver calls,
/// as `Profiler::launch` makes them (an event), or with a cell of mapped host
/// memory written by the stream instead (`floor-cell`).
pub struct Floor {
    event: sys::CUevent,
    cell: *mut std::ffi::c_void,
    cell_dptr: sys::CUdeviceptr,
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

    /// The capture check, then the event (or the cell's write with `cell`).
    pub fn after_capture_check(&self, stream: &CudaStream, cell: bool) -> Result<(), DriverError> {
        let write = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: a live stream, event and mapped cell of the bound context.
        unsafe {
            if !stream.cu_stream().is_null() {
                result::stream::is_capturing(stream.cu_stream())?;
            }
            match cell {
                true => sys::cuStreamWriteValue32_v2(stream.cu_stream(), self.cell_dptr, 1, write)
                    .result(),
                false => sys::cuEventRecord(self.event, stream.cu_stream()).result(),
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
