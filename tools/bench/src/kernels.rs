//! The kernels' sources, embedded so that one binary is all a GPU machine needs.

/// The recorders ours is compared with (seed-style, FlashInfer-style, and the bound),
/// which the comparison builds include as `"baselines.cuh"`: benchmarks only.
pub const BASELINES: &str = include_str!("../kernels/baselines.cuh");
/// The recorder benchmark's kernel (`recorder_bench`).
pub const RECORDER_BENCH: &str = include_str!("../kernels/recorder_bench.cu");
/// Short-lived warps that record densely (`dense`).
pub const DENSE: &str = include_str!("../kernels/dense.cu");
/// A persistent, warp-specialized kernel that records for seconds, with a known number of
/// events per warp, for streaming traces (`stream_bench`).
pub const STREAM: &str = include_str!("../kernels/stream.cu");
/// The warp-specialized bf16 GEMM (`gemm`, `overhead`; host side in [`crate::gemm`]).
pub const GEMM: &str = include_str!("../kernels/gemm.cu");
/// The library's example kernels (`kernels/examples/`), which `recorder_bench` checks.
pub const PHASES: &str = include_str!("../../../kernels/examples/phases.cu");
/// See [`PHASES`].
pub const WARP_SPECIALIZED: &str = include_str!("../../../kernels/examples/warp_specialized.cu");
/// See [`PHASES`].
pub const PERSISTENT: &str = include_str!("../../../kernels/examples/persistent.cu");
/// The kernels of one LLM decode step (`decode_step`; host side in [`crate::decode`]).
pub const DECODE_STEP: &str = include_str!("../kernels/decode_step.cu");
