//! Kernels from source: the recorder header, and NVRTC compilation with it.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{CompileOptions, Ptx};

use super::error::CudaError;

/// The recorder header, embedded so that one binary is all a GPU machine needs.
pub const HEADER_SOURCE: &str = include_str!("../../kernels/include/tracing_gpu.cuh");
/// The header's file name, as kernels `#include` it.
pub const HEADER_NAME: &str = "tracing_gpu.cuh";
/// Path of the header in this crate's source tree, for users' own nvcc builds.
pub const HEADER_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/kernels/include/tracing_gpu.cuh"
);

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
#[must_use = "a KernelBuild does nothing until passed to `compile`"]
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
    /// Headers the kernel `#include`s besides the recorder's: (file name, contents). See
    /// [`KernelBuild::header`].
    pub headers: Vec<(String, String)>,
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
            headers: Vec::new(),
        }
    }

    /// Adds a preprocessor definition.
    pub fn define(mut self, d: impl Into<String>) -> Self {
        self.defines.push(d.into());
        self
    }

    /// Turns line info on or off (on by default): off, the PTX carries no `.file` or
    /// `.loc`; the machine code is the same.
    pub fn lineinfo(mut self, on: bool) -> Self {
        self.lineinfo = on;
        self
    }

    /// Supplies a header that the kernel includes as `#include "name"`, so that a
    /// binary that embeds its kernels' sources needs no files beside it. `name` is a
    /// relative path (`"util.cuh"`, `"bench/util.cuh"`) without `..`; line info names the
    /// file by that path under a private folder.
    pub fn header(mut self, name: impl Into<String>, source: impl Into<String>) -> Self {
        self.headers.push((name.into(), source.into()));
        self
    }
}

/// Compiles `source` to PTX with NVRTC. `#include "tracing_gpu.cuh"` resolves to
/// the embedded header, and the build's own [`KernelBuild::headers`] to theirs: each is
/// written once to a private folder that is put on the include path, so line info names
/// a header by its own file name.
pub fn compile(source: &str, build: &KernelBuild) -> Result<Ptx, CudaError> {
    ensure_nvrtc()?;
    let include = include_dirs(&build.headers).map_err(|e| CudaError::Compile {
        name: build.name.clone(),
        message: format!("cannot write the kernel's headers: {e}"),
    })?;
    let mut options: Vec<String> = build.defines.iter().map(|d| format!("-D{d}")).collect();
    options.push("-std=c++17".into());
    if build.lineinfo {
        options.push("-lineinfo".into());
    }
    options.extend(build.extra.iter().cloned());
    let opts = CompileOptions {
        arch: Some(build.arch),
        include_paths: include
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect(),
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

/// The private include folders: the one holding the recorder's header, then, if the
/// build brings headers of its own, one holding those (named by a hash of their names
/// and contents, so builds that bring different files under one name never see each
/// other's). Each folder is written once per process.
fn include_dirs(headers: &[(String, String)]) -> std::io::Result<Vec<PathBuf>> {
    static WRITTEN: parking_lot::Mutex<Option<(PathBuf, HashSet<u64>)>> =
        parking_lot::Mutex::new(None);
    let mut state = WRITTEN.lock();
    let (root, written) = match state.as_mut() {
        Some(s) => s,
        None => {
            let root =
                std::env::temp_dir().join(format!("tracing-gpu-include-{}", std::process::id()));
            std::fs::create_dir_all(&root)?;
            std::fs::write(root.join(HEADER_NAME), HEADER_SOURCE)?;
            state.insert((root, HashSet::new()))
        }
    };
    let mut dirs = vec![root.clone()];
    if headers.is_empty() {
        return Ok(dirs);
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    headers.hash(&mut hasher);
    let key = hasher.finish();
    let dir = root.join(format!("h{key:016x}"));
    if !written.contains(&key) {
        for (name, source) in headers {
            let rel = Path::new(name);
            let plain = rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain || name.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("header name {name:?} is not a relative path without `..`"),
                ));
            }
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, source)?;
        }
        written.insert(key);
    }
    dirs.push(dir);
    Ok(dirs)
}
