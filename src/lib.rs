//! tracing-gpu: in-kernel phase recording for CUDA, aligned to the host clock and
//! bridged into the `tracing` ecosystem.
//!
//! See `docs/architecture.md` for one event's path from the kernel to the file.
#![deny(missing_docs)]

pub mod bridge;
pub mod clock;
pub mod decode;
pub mod dump;
pub mod format;
pub mod perfetto;
pub mod registry;
pub mod report;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "otlp")]
pub mod otlp;

/// The README's Rust code blocks, compiled (and, unless `no_run`, run) as doctests;
/// its main example needs the `cuda` feature (`scripts/test.sh` tests with all).
#[cfg(all(doctest, feature = "cuda"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
