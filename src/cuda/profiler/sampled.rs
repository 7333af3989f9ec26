//! [`Profiler::sampled`]: launches sampled by a [`Sampler`] of their own,
//! `gpu_profile!(profiler.sampled(&sampler), ..)`, rather than the profiler's.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig};

use super::sampler::Sampler;
use super::Profiler;
use crate::batch::DeviceInfo;
use crate::cuda::error::ProfilerError;
use crate::format::KernelArg;

impl Profiler {
    /// Launches sampled by `sampler` instead of the profiler's own sampler:
    /// `gpu_profile!(profiler.sampled(&sampler), ..)`.
    pub fn sampled<'a>(&'a self, sampler: &'a Sampler) -> Sampled<'a> {
        Sampled {
            profiler: self,
            sampler,
        }
    }
}

/// A [`Profiler`] that samples its launches with a [`Sampler`] of their own;
/// made by [`Profiler::sampled`].
#[derive(Debug, Clone, Copy)]
pub struct Sampled<'a> {
    profiler: &'a Profiler,
    sampler: &'a Sampler,
}

impl Sampled<'_> {
    /// The profiled GPU.
    pub fn device(&self) -> &Arc<DeviceInfo> {
        self.profiler.device()
    }

    /// As [`Profiler::launch`], sampled by this sampler.
    pub fn launch<T, E, F>(
        &self,
        stream: &Arc<CudaStream>,
        kernel: &str,
        cfg: LaunchConfig,
        launch_id: u64,
        span: tracing::Span,
        launch: F,
    ) -> Result<T, ProfilerError>
    where
        F: FnOnce(KernelArg) -> Result<T, E>,
        E: Into<ProfilerError>,
    {
        self.profiler
            .launch_sampled(self.sampler, (stream, kernel, cfg, launch_id, span), launch)
    }
}
