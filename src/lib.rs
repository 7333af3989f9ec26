//! tracing-gpu: in-kernel phase recording for CUDA, aligned to the host clock and
//! bridged into the `tracing` ecosystem.
//!
//! One event's way, and the modules in the order it passes them (each imports
//! only from modules above it; `docs/architecture.md` has the details):
//!
//! | module | holds |
//! |---|---|
//! | [`format`](mod@format) | the wire format (v1 records, v2 entries): the bytes the device recorder writes, and an encoder |
//! | [`registry`] | event id → name, and the declared payload names |
//! | [`decode`] | bytes → a validated, zero-copy [`decode::Buffer`] |
//! | [`clock`] | device clock → host clock, with an error bound |
//! | [`batch`] | one launch as sinks receive it: [`batch::Batch`], [`batch::BatchSink`] |
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

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub mod otlp;

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
