//! tracing-gpu's benchmarks and experiments (not published): what the binaries of
//! `src/bin/` share. Each binary's own file says what it measures and how to run it:
//!
//! | binary | what |
//! |---|---|
//! | `recorder_bench` | the device recorder's cost per event beside the seed-style one and the bound, and exact decoding |
//! | `gemm` | the pipelined bf16 GEMM, checked and timed against cuBLAS, and traced live |
//! | `overhead` | what recording costs the GEMM, per k-tile, six builds interleaved |
//! | `profile_overhead` | what `gpu_profile!` costs the launching thread, against the gate-off kernel and the null trace |
//! | `delivery_rate` | the collector's decode-and-deliver rate per launch (no GPU) |
//! | `calibrate` | the GPU clocks against the host's: offset, drift, bounds, costs |
//! | `storm` | ≥ 100,000 short launches back to back, gate off, null trace and profiled: the launch call's p50 and p99, the GPU's busy fraction, memory, counts |
//! | `graph_replay` | a CUDA graph of 100 short kernels replayed 1,000 times, gate off, null trace and `Profiler::launch_graph` |
//! | `user_kernel` | a kernel from a user's own folder, compiled and profiled as the README shows (`scripts/ncu-check.sh`) |
//! | `causality` | every device event between its launch call (or graph replay) and the synchronize after it |
//! | `stream` | a persistent kernel streamed while it runs, against fixed slots and the gate off; `watch`: with watch mode and a snapshot every second |

pub mod cli;
pub mod decode;
pub mod device;
pub mod error;
pub mod fake_collector;
pub mod floor;
pub mod gemm;
pub mod host;
pub mod kernels;
pub mod probe;
pub mod quickstart_off;
pub mod short;
pub mod snapshots;
pub mod stats;
pub mod trace;

/// The library's quickstart example (`examples/quickstart.rs`): its kernel, which
/// `causality`, `profile_overhead` and the storms ([`short`]) launch (built without the
/// recorder: [`quickstart_off`]).
#[path = "../../../examples/quickstart.rs"]
#[allow(dead_code)] // the example's own `main`
pub mod quickstart;

pub use error::{BenchError, Result};
