//! [`Sampler`]: which launches record (one in n, or those a predicate takes),
//! and the [`Sampling`] it carries which blocks and warps of them
//! (`docs/format.md`, "Sampling"); set on the profiler
//! ([`ProfilerBuilder::sampler`](super::ProfilerBuilder::sampler)) or for some
//! launches (`sampled.rs`). A launch left out gets a null trace, the
//! recorder's not-recording path; a warp left out learns it once, when its
//! recorder is made. No kernel is compiled again.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::LaunchConfig;

use crate::format::Sampling;

/// Which launches pass, besides one in n.
type LaunchFilter = Arc<dyn Fn(&str, &LaunchConfig) -> bool + Send + Sync>;

/// Which launches, blocks and warps record: a [`Sampling`], and for the
/// launches a predicate. Clones share the count of launches that one in n
/// counts, so one sampler used at several call sites takes one launch in n of
/// them all; give each kernel its own to take one in n of each.
///
/// ```
/// use tracing_gpu::cuda::Sampler;
/// use tracing_gpu::format::Sampling;
/// // The first warp of each warpgroup, of every 4th block, of 1 launch in 10
/// // of the kernels whose name starts with "gemm".
/// let sampler = Sampler::new(Sampling::default().warps(0x1111).blocks(4, 0).launches(10))
///     .launch_if(|kernel, _cfg| kernel.starts_with("gemm"));
/// ```
#[derive(Clone, Default)]
pub struct Sampler {
    sampling: Sampling,
    filter: Option<LaunchFilter>,
    /// Launches that passed the filter so far.
    counted: Arc<AtomicU64>,
}

impl fmt::Debug for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler")
            .field("sampling", &self.sampling)
            .field("filter", &self.filter.is_some())
            .finish_non_exhaustive()
    }
}

impl Sampler {
    /// Records what `sampling` names: its blocks and warps, of one launch in
    /// its `launch_every`.
    pub fn new(sampling: Sampling) -> Sampler {
        Sampler {
            sampling,
            ..Sampler::default()
        }
    }

    /// Records only the launches `take(kernel name, launch shape)` takes (and
    /// of those one in n). It runs on the launching thread, at every launch.
    #[must_use]
    pub fn launch_if(
        mut self,
        take: impl Fn(&str, &LaunchConfig) -> bool + Send + Sync + 'static,
    ) -> Sampler {
        self.filter = Some(Arc::new(take));
        self
    }

    /// The blocks and warps it records, and one launch in how many.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// Whether this launch records: the filter, then one in n (the first
    /// launch that passes the filter records).
    pub(crate) fn takes(&self, kernel: &str, cfg: &LaunchConfig) -> bool {
        if self.filter.as_ref().is_some_and(|take| !take(kernel, cfg)) {
            return false;
        }
        match self.sampling.launch_every {
            0 | 1 => true,
            n => self
                .counted
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(u64::from(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(blocks: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    #[test]
    fn one_launch_in_n_of_those_the_filter_takes() {
        let s = Sampler::new(Sampling::default().launches(3))
            .launch_if(|kernel, cfg| kernel != "skip" && cfg.grid_dim.0 > 1);
        let taken: Vec<bool> = (0..7).map(|_| s.takes("gemm", &cfg(4))).collect();
        assert_eq!(taken, [true, false, false, true, false, false, true]);
        assert!(!s.takes("skip", &cfg(4)));
        assert!(!s.takes("gemm", &cfg(1)));
        // Neither counted: the next one taken is the 7th's third after.
        let clone = s.clone();
        assert!(!clone.takes("gemm", &cfg(4)));
        assert!(!s.takes("gemm", &cfg(4)));
        assert!(clone.takes("gemm", &cfg(4)));
        assert!(Sampler::default().takes("any", &cfg(1)));
    }
}
