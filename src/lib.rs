//! tracing-gpu: in-kernel phase recording for CUDA, aligned to the host clock and
//! bridged into the `tracing` ecosystem.
//!
//! What a user needs is here, at the root:
//!
//! - **Live capture** (feature `cuda`): a `Profiler` per GPU, `gpu_profile!`
//!   around each launch, and `compile` with a `KernelBuild` for the kernel.
//!   The kernel's trace argument is a [`KernelArg`]; a `Sampler` (a
//!   [`Sampling`] of blocks and warps, one launch in n) records only some.
//! - **Sinks**: [`PerfettoLayer`] (and its [`TraceWriter`]), `OtlpLayer`
//!   (feature `otlp`), or your own [`BatchSink`] as a [`SinkLayer`] (a layer of
//!   your own holds a [`SinkHandle`]); each receives whole [`Batch`]es, with their
//!   [`DeviceInfo`], [`LaunchInfo`] and [`HostSpan`]s.
//! - **Offline**: [`EventRegistry`] (event id → name), [`Buffer`] (a decoded
//!   trace buffer), [`Capture`] and [`CaptureReader`] (a run recorded for
//!   replay), [`Timeline`] (statistics and an SVG picture).
//!
//! The rest (builders, errors, options, statistics) is in the modules, in the
//! order one event passes them (each imports only from modules above it;
//! `docs/architecture.md` has the details):
//!
//! | module | holds |
//! |---|---|
//! | [`format`](mod@format) | the wire format (v1 records, v2 entries): the bytes the device recorder writes, and an encoder |
//! | [`registry`] | event id → name, and the declared payload names |
//! | [`decode`] | bytes → a validated, zero-copy [`Buffer`] |
//! | [`clock`] | device clock → host clock, with an error bound |
//! | [`batch`] | one launch as sinks receive it: [`Batch`], [`BatchSink`] |
//! | [`deliver`] | batches to every sink in a subscriber; plain spans for the others |
//! | [`perfetto`], `otlp` | the sinks we ship |
//! | [`capture`] | the capture file: a run recorded for replay |
//! | [`report`] | statistics and an SVG timeline |
//! | `cuda` | the live path: `Profiler`, `gpu_profile!`, NVRTC compilation |
//! | [`output`] | files that are complete or absent |
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod batch;
pub mod capture;
pub mod clock;
pub mod decode;
pub mod deliver;
pub mod format;
pub mod output;
pub mod perfetto;
pub mod registry;
pub mod report;
// The profiler's watchdog reads it, a capture keeps it, the report draws it; CUDA-free.
#[cfg_attr(not(feature = "cuda"), allow(dead_code, unused_imports))]
pub(crate) mod watch;

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub mod otlp;

pub use batch::{Batch, BatchSink, DeviceInfo, HostSpan, LaunchInfo};
pub use capture::{Capture, CaptureReader};
pub use decode::Buffer;
pub use deliver::{SinkHandle, SinkLayer};
pub use format::{KernelArg, Sampling};
pub use perfetto::{PerfettoLayer, TraceWriter};
pub use registry::EventRegistry;
pub use report::Timeline;

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use cuda::{compile, KernelBuild, Profiler, Sampler};
#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub use otlp::OtlpLayer;

#[cfg(test)]
pub(crate) mod test_support;

/// The README's Rust code blocks, compiled (and, unless `no_run`, run) as doctests;
/// its main example needs the `cuda` feature (`scripts/test.sh` tests with all).
#[cfg(all(doctest, feature = "cuda"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/subscriber.md's Rust code blocks, compiled as doctests (the OTLP setup
/// needs the `otlp` feature).
#[cfg(all(doctest, feature = "otlp"))]
#[doc = include_str!("../docs/subscriber.md")]
pub struct SubscriberDoctests;

/// docs/otlp.md's Rust code block, compiled as a doctest.
#[cfg(all(doctest, feature = "otlp"))]
#[doc = include_str!("../docs/otlp.md")]
pub struct OtlpDoctests;

/// docs/calibration.md's Rust code block, compiled as a doctest.
#[cfg(all(doctest, feature = "cuda"))]
#[doc = include_str!("../docs/calibration.md")]
pub struct CalibrationDoctests;
