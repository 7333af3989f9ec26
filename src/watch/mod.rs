//! Where every warp of a running launch is: the watch cells of a streamed launch
//! whose kernel was built with `TGPU_WATCH=1` (docs/format.md, "Watch cells"),
//! read while it runs (`cell.rs`) into a [`Snapshot`] (`snapshot.rs`), grouped by what the
//! warps are doing, so that the stuck ones stand out, and told as text
//! (`summary.rs`), and checked against the trace streamed afterwards (`agree.rs`).
//! Nothing here knows CUDA: the profiler's watchdog reads mapped memory through
//! [`Words`], the tests a byte buffer; a capture keeps snapshots
//! (`capture/snapshot.rs`) and the report draws them (`report/watchdog.rs`).

#[cfg(any(test, feature = "cuda"))]
mod agree;
mod cell;
mod snapshot;
mod summary;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(any(test, feature = "cuda"))]
pub(crate) use agree::disagreements;
pub(crate) use cell::{Cells, Words};
pub(crate) use snapshot::{Last, Open, Snapshot, State, Warp};
pub(crate) use summary::{count, duration, group_line};

/// The target of the watchdog's events (an ERROR event per snapshot, under the
/// launch span); the OTLP layer marks that span unfinished when it sees one.
pub(crate) const TARGET: &str = "tracing_gpu::watchdog";
