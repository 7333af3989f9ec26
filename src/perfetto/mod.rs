//! Perfetto output: host spans and device phases in one `.perfetto-trace`
//! file (TrackEvent protobuf), opened by <https://ui.perfetto.dev>.
//!
//! - [`PerfettoLayer`] is a `tracing-subscriber` layer. Host spans become
//!   slices on their threads' tracks; device batches (through
//!   [`crate::batch::BatchSink`]) become slices on GPU → SM → warp tracks,
//!   with a kernel slice per launch and a flow arrow from the launch span to
//!   it. A writer thread streams the file to disk in bounded memory, the
//!   batches encoded on several threads
//!   ([`PerfettoLayerBuilder::encoder_threads`]); [`PerfettoGuard`] finishes it.
//! - [`TraceWriter`] is the synchronous core, for writing batches without a
//!   subscriber (the CLI's `convert`), into a [`crate::output::AtomicFile`] or
//!   any `io::Write`;
//!   it also draws a capture's recorded host spans as the layer draws live
//!   ones ([`TraceWriter::write_host_spans`]).
//!
//! # What the trace holds
//!
//! - One clock: every timestamp is on `CLOCK_BOOTTIME` (the trace clock,
//!   declared by a `ClockSnapshot` with `primary_trace_clock = BOOTTIME`).
//!   Device times are mapped with [`crate::clock::Calibration::to_host`].
//!   Each writer sequence (a host thread, a warp lane) counts time on its own
//!   incremental clock, anchored to BOOTTIME by that sequence's snapshot, so a
//!   packet carries only the delta from the sequence's previous packet.
//! - Names are interned per sequence. A device event whose type declares a
//!   payload ([`crate::registry::EventRegistry::with_payload`]) carries it as
//!   an unsigned argument under the declared name (`k_tile = 3`); other
//!   types' slices have no argument (their payload is not written).
//! - Host spans: live, from the layer; replayed from a capture, by
//!   [`TraceWriter::write_host_spans`], with the same packets.
//! - Flow arrows: a span with a `gpu.launch_id` field (the launch span
//!   `gpu_profile!` opens) starts a flow; the kernel slice of the batch with
//!   that launch id ends it.
//! - Events lost (made by a warp, not in its slot or ring: `decode::Slot::events_lost`):
//!   an `events lost` instant on the warp's track at its last record (argument
//!   `events`: how many); a cumulative "events lost" counter under the GPU; and an
//!   `events_lost` argument on the kernel slice.
//! - A streamed launch ([`crate::batch::Part`]): each part's warps are
//!   written as the part arrives, on the same warp tracks (a range that
//!   encloses ranges of earlier parts opens after their packets, so it goes
//!   on a second lane of its warp); its kernel slice, events-lost counter values and
//!   flow once, at its last part, over every part.
//! - A watchdog's snapshot of a launch still running (issue #32): an instant
//!   `watchdog snapshot N of <kernel>` on the GPU's `watchdog` track, with its
//!   text and counts. If the trace ends before the launch does, its kernel slice
//!   and the ranges each warp had open at the latest snapshot are written as
//!   slices that never end (`unfinished.rs`): where each warp was stuck. A
//!   capture's snapshots are drawn the same way
//!   ([`TraceWriter::write_captured_batch`], `captured.rs`).
//! - Spans and events of target [`crate::batch::DEVICE_TARGET`] are ignored:
//!   they repeat, for other layers, what this layer gets in bulk.
//!
//! # A batch's way, one file per step
//!
//! `layer.rs` queues the batch (`state.rs` holds the queue and each host
//! thread's buffer); `writer_thread.rs` takes it off and either writes it
//! whole through [`TraceWriter::write_batch`] or writes its kernel slice
//! and hands its warps to the encoder threads of `parallel.rs`; `device.rs`
//! encodes what lies above the warps (GPU and SM tracks, kernel slice, drop
//! counter), `warps.rs` the warps' events (the hot path), `proto.rs` the
//! packets; `writer.rs` alone writes to the output (`output.rs`: the
//! layer's file or stream). Each step calls only the steps after it.

mod builder;
mod captured;
mod device;
mod error;
mod fields;
mod flows;
mod guard;
mod host;
mod layer;
mod output;
mod owners;
mod parallel;
mod parts;
pub(crate) mod proto;
mod state;
mod stats;
mod tracks;
mod unfinished;
mod warps;
mod writer;
mod writer_thread;

pub use builder::PerfettoLayerBuilder;
pub use error::PerfettoError;
pub use guard::PerfettoGuard;
pub use layer::PerfettoLayer;
pub use stats::WriteStats;
pub use writer::TraceWriter;
