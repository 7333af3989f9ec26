//! Live capture on NVIDIA GPUs (feature `cuda`): kernel compilation through
//! NVRTC, and the device side of profiling.
//!
//! cudarc loads libcuda and libnvrtc at first use and panics when they are
//! missing; every entry point here checks for them first
//! ([`ensure_libraries`]) and returns [`CudaError::LibraryMissing`] instead.

use std::sync::Arc;

pub mod calibrate;

pub use cudarc;
use cudarc::nvrtc::{CompileOptions, Ptx};

/// The recorder header, embedded so that one binary is all a GPU machine needs.
pub const HEADER_SOURCE: &str = include_str!("../../kernels/include/tracing_gpu.cuh");
/// The header's file name, as kernels `#include` it.
pub const HEADER_NAME: &str = "tracing_gpu.cuh";
/// Path of the header in this crate's source tree, for users' own nvcc builds.
pub const HEADER_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/kernels/include/tracing_gpu.cuh"
);

/// Errors from the CUDA side.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda or libnvrtc could not be loaded.
    #[error("{0} could not be loaded: no NVIDIA driver or CUDA toolkit on this machine (or not on the library path)")]
    LibraryMissing(&'static str),
    /// A driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC rejected a kernel.
    #[error("NVRTC could not compile {name}: {message}")]
    Compile {
        /// The program's name.
        name: String,
        /// NVRTC's log, or the failure.
        message: String,
    },
    /// cuBLAS failed.
    #[error("cuBLAS error: {0:?}")]
    Cublas(cudarc::cublas::result::CublasError),
    /// Anything else that is wrong with a request (sizes, arguments).
    #[error("{0}")]
    Invalid(String),
}

/// Checks that libcuda and libnvrtc can be loaded, before cudarc would panic on them.
pub fn ensure_libraries() -> Result<(), CudaError> {
    // SAFETY: these only try to dlopen the library and drop the handle.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::LibraryMissing("libcuda (the NVIDIA driver)"));
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::LibraryMissing("libnvrtc"));
    }
    Ok(())
}

/// Checks for libnvrtc alone: enough to compile, with no GPU.
pub fn ensure_nvrtc() -> Result<(), CudaError> {
    // SAFETY: as in `ensure_libraries`.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::LibraryMissing("libnvrtc"));
    }
    Ok(())
}

/// How to compile a kernel.
#[derive(Debug, Clone)]
pub struct KernelBuild {
    /// Program name; also the file name that line info points to.
    pub name: String,
    /// Target, such as `"sm_90"` or `"sm_90a"`.
    pub arch: &'static str,
    /// Emit `.file`/`.loc` line info (`-lineinfo`), so ncu maps SASS to source. On by default.
    pub lineinfo: bool,
    /// Preprocessor definitions, `NAME` or `NAME=VALUE`.
    pub defines: Vec<String>,
    /// Other NVRTC options, passed as they are.
    pub extra: Vec<String>,
}

impl KernelBuild {
    /// A build of `name` for `arch`, with line info.
    pub fn new(name: impl Into<String>, arch: &'static str) -> Self {
        KernelBuild {
            name: name.into(),
            arch,
            lineinfo: true,
            defines: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// Adds a preprocessor definition.
    pub fn define(mut self, d: impl Into<String>) -> Self {
        self.defines.push(d.into());
        self
    }
}

/// Compiles `source` to PTX with NVRTC. `#include "tracing_gpu.cuh"` resolves to
/// the embedded header: it is written once to a private folder that is put on the
/// include path, so line info names the header by its own file name.
pub fn compile(source: &str, build: &KernelBuild) -> Result<Ptx, CudaError> {
    ensure_nvrtc()?;
    let include = header_dir().map_err(|e| CudaError::Compile {
        name: build.name.clone(),
        message: format!("cannot write the embedded header: {e}"),
    })?;
    let mut options: Vec<String> = build.defines.iter().map(|d| format!("-D{d}")).collect();
    options.push("-std=c++17".into());
    if build.lineinfo {
        options.push("-lineinfo".into());
    }
    options.extend(build.extra.iter().cloned());
    let opts = CompileOptions {
        arch: Some(build.arch),
        include_paths: vec![include.to_string_lossy().into_owned()],
        options,
        name: Some(build.name.clone()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| CudaError::Compile {
        name: build.name.clone(),
        message: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => other.to_string(),
        },
    })
}

/// The private include folder holding the embedded header (made once per process).
fn header_dir() -> std::io::Result<Arc<std::path::PathBuf>> {
    static DIR: parking_lot::Mutex<Option<Arc<std::path::PathBuf>>> = parking_lot::Mutex::new(None);
    let mut dir = DIR.lock();
    if let Some(d) = dir.as_ref() {
        return Ok(d.clone());
    }
    let d = std::env::temp_dir().join(format!("tracing-gpu-include-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join(HEADER_NAME), HEADER_SOURCE)?;
    let d = Arc::new(d);
    *dir = Some(d.clone());
    Ok(d)
}

mod archive;
mod collector;
mod pool;
mod profiler;

pub use archive::{DumpLayer, DumpRecorder};
pub use profiler::{
    next_launch_id, Profiler, ProfilerBuilder, ProfilerError, ProfilerStats, DEFAULT_CAPACITY,
    DEFAULT_MEMORY_LIMIT, DEFAULT_RECALIBRATION,
};

/// `gpu_profile!`, re-exported here beside [`Profiler`] (it is defined at the crate root).
pub use crate::gpu_profile;

#[doc(hidden)]
pub mod __private {
    //! What `gpu_profile!` expands to needs; not public API.
    pub use tracing;
}
