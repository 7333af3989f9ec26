//! [`TraceWriter`]: device batches (and a capture's host spans) → TrackEvent
//! packets, written to any `io::Write`.
//!
//! The last step of a batch's way: whatever encodes packets (the batch's own
//! [`DeviceEncoder`], the host threads, the encoder threads of
//! `parallel.rs`) hands them here, and only this writes to the output.
//! [`super::PerfettoLayer`] runs one on its writer thread; the CLI's
//! `convert` uses one directly.

use std::io::Write;
use std::sync::Arc;

use super::captured::{self, Captured};
use super::device::DeviceEncoder;
use super::error::PerfettoError;
use super::flows::FlowOrigins;
use super::proto::{field, Enc};
use super::stats::WriteStats;
use super::tracks::Ids;
use super::warps::FLUSH_AT;
use crate::batch::{Batch, HostSpan};
use crate::capture::Capture;
use crate::deliver::watched::Watched;

/// Writes device batches, and a capture's host spans
/// ([`TraceWriter::write_host_spans`]), as a Perfetto trace into `W`.
///
/// ```no_run
/// use tracing_gpu::output::AtomicFile;
/// use tracing_gpu::perfetto::TraceWriter;
/// # fn batches() -> Vec<std::sync::Arc<tracing_gpu::batch::Batch>> { vec![] }
/// let mut w = TraceWriter::new(AtomicFile::create("gemm.perfetto-trace")?)?;
/// for b in batches() {
///     w.write_batch(&b)?;
/// }
/// let (file, stats) = w.finish()?;
/// file.commit()?; // only now does gemm.perfetto-trace exist
/// println!("{} events in {} bytes", stats.device_events, stats.bytes);
/// # Ok::<(), tracing_gpu::perfetto::PerfettoError>(())
/// ```
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
    core: DeviceEncoder,
    /// zlib level when output goes out as `compressed_packets`.
    compress: Option<u32>,
    zbuf: Vec<u8>,
    /// A capture's watchdog snapshots not written yet ([`TraceWriter::write_captured_batch`]).
    captured: Option<Captured>,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace: writes its clock snapshot (the trace clock, BOOTTIME).
    pub fn new(out: W) -> Result<TraceWriter<W>, PerfettoError> {
        Self::start(out, Arc::new(Ids::new()), Arc::default())
    }

    /// Starts a trace whose tracks take their uuids and sequences from `ids`,
    /// and whose kernel slices end the flows of `flows`, shared with the
    /// layer's host threads.
    pub(crate) fn start(
        out: W,
        ids: Arc<Ids>,
        flows: Arc<FlowOrigins>,
    ) -> Result<TraceWriter<W>, PerfettoError> {
        let mut w = TraceWriter {
            out,
            core: DeviceEncoder::new(ids, flows),
            compress: None,
            zbuf: Vec::new(),
            captured: None,
        };
        w.drain(0)?;
        Ok(w)
    }

    /// From now on, writes the packets zlib-compressed (level 0-9), about
    /// 1 MiB of them at a time, each piece as one `compressed_packets`
    /// packet: Perfetto inflates them on load. Smaller files, more CPU.
    pub fn compress(mut self, level: u32) -> Self {
        self.compress = Some(level.min(9));
        self
    }

    /// Writes one batch: the warps' events on their GPU / SM / warp tracks,
    /// the kernel slice, the events-lost counter.
    pub fn write_batch(&mut self, batch: &Batch) -> Result<(), PerfettoError> {
        self.encode(|core, sink| core.batch(batch, sink))
    }

    /// Runs `encode` with the device encoder and a sink that writes the
    /// packets it hands over, then writes what it left buffered once that
    /// passes [`FLUSH_AT`].
    fn encode(
        &mut self,
        encode: impl FnOnce(
            &mut DeviceEncoder,
            &mut dyn FnMut(&[u8]) -> Result<u64, PerfettoError>,
        ) -> Result<(), PerfettoError>,
    ) -> Result<(), PerfettoError> {
        let TraceWriter {
            out,
            core,
            compress,
            zbuf,
            ..
        } = self;
        encode(core, &mut |packets| {
            write_packets(out, *compress, zbuf, packets)
        })?;
        self.drain(FLUSH_AT)
    }

    /// Writes a batch of `capture` ([`crate::capture::CaptureReader::batches`]) as
    /// [`TraceWriter::write_batch`] does, after the watchdog's snapshots that `capture`
    /// keeps of its launch (issue #32) the first time the launch comes, drawn as a live
    /// run draws them: each an instant on its GPU's `watchdog` track, the latest kept
    /// until the launch's last part. Give every batch of one capture, then call
    /// [`TraceWriter::write_captured_end`].
    pub fn write_captured_batch(
        &mut self,
        capture: &Capture,
        batch: &Batch,
    ) -> Result<(), PerfettoError> {
        let notes = self
            .captured
            .get_or_insert_with(|| Captured::new(capture))
            .take(batch.launch.launch_id);
        for note in notes {
            let device = batch.device.clone();
            let registry = batch.registry.clone();
            if let Some(w) = captured::watched(capture, note, device, &batch.calibration, registry)
            {
                self.write_snapshot(w)?;
            }
        }
        self.write_batch(batch)
    }

    /// After the last of `capture`'s batches ([`TraceWriter::write_captured_batch`]):
    /// writes the snapshots of launches that left no record (they never finished; a
    /// snapshot does not name its GPU: they go on the capture's first GPU with a
    /// calibration, and without one they are not drawn), then, for each launch whose
    /// last part never came, its kernel slice and the ranges its warps had open at its
    /// latest snapshot, begun and never ended: where each warp was when the run ended.
    pub fn write_captured_end(&mut self, capture: &Capture) -> Result<(), PerfettoError> {
        let rest = self
            .captured
            .get_or_insert_with(|| Captured::new(capture))
            .rest();
        if let Some((device, calibration)) = (!rest.is_empty())
            .then(|| captured::first_gpu(capture))
            .flatten()
        {
            let registry = Arc::new(capture.registry.clone());
            for note in rest {
                let w = captured::watched(
                    capture,
                    note,
                    device.clone(),
                    &calibration,
                    registry.clone(),
                );
                if let Some(w) = w {
                    self.write_snapshot(w)?;
                }
            }
        }
        for w in self.write_unfinished()? {
            self.write_open(&w)?;
        }
        Ok(())
    }

    /// Writes a capture's host spans on their threads' tracks, under a process
    /// named after the recorded command, as [`super::PerfettoLayer`] draws
    /// live ones: one slice per span, its fields as (string) arguments, and a
    /// flow from each launch's span to its kernel slice. Write them before the
    /// batches: a kernel slice ends the flow of a launch span written earlier.
    ///
    /// Each span becomes one slice from its recorded start to its recorded
    /// end, placed so that slices nest strictly on each thread's track: a
    /// span whose end overlaps the end of the slice enclosing it is cut
    /// there, and a span recorded with no duration whose descendants on its
    /// thread end later (it was still open when the capture was written)
    /// lasts until they end. `docs/capture.md` has the details.
    pub fn write_host_spans(
        &mut self,
        process_name: &str,
        spans: &[HostSpan],
    ) -> Result<(), PerfettoError> {
        let core = &mut self.core;
        let origins = &core.flow_origins;
        let (packets, slices) =
            super::host::replay(&core.ids, process_name, spans, &mut |launch| {
                origins.start(launch)
            });
        core.stats.host_slices += slices;
        self.write_raw(&packets.buf)
    }

    /// Writes what lies above a batch's warps (its GPU and SM descriptors,
    /// kernel slice and events lost), for encoder threads to write the warps
    /// ([`super::parallel`]); returns the batch's device time window.
    pub(crate) fn write_head(&mut self, batch: &Batch) -> Result<(u64, u64), PerfettoError> {
        let head = self.core.head(batch);
        self.core.kernel(batch, &head);
        self.drain(FLUSH_AT)?;
        Ok(head.window)
    }

    /// Writes a watchdog's snapshot (an instant on its GPU's `watchdog` track) and
    /// keeps it while its launch runs.
    pub(crate) fn write_snapshot(&mut self, w: Arc<Watched>) -> Result<(), PerfettoError> {
        self.core.snapshot(w);
        self.drain(FLUSH_AT)
    }

    /// At the end of the trace: writes the kernel slice of each launch still
    /// running, left open, and returns their latest snapshots, whose warps'
    /// open ranges go next ([`TraceWriter::write_open`], or the encoder threads).
    pub(crate) fn write_unfinished(&mut self) -> Result<Vec<Arc<Watched>>, PerfettoError> {
        let all = self.core.unfinished();
        self.drain(FLUSH_AT)?;
        Ok(all)
    }

    /// Writes the ranges each warp of `w` had open, left open.
    pub(crate) fn write_open(&mut self, w: &Watched) -> Result<(), PerfettoError> {
        self.encode(|core, sink| core.open_warps(w, sink))
    }

    /// Appends packets encoded elsewhere (a host thread's chunk, an encoder
    /// thread's warps).
    pub(crate) fn write_raw(&mut self, bytes: &[u8]) -> Result<(), PerfettoError> {
        self.drain(0)?;
        self.emit(bytes)
    }

    /// Appends an encoder thread's output as it is: whole packets, some or
    /// all of them already compressed ([`compressed_packet`]) as the layer
    /// asked.
    pub(crate) fn write_encoded(&mut self, bytes: &[u8]) -> Result<(), PerfettoError> {
        self.drain(0)?;
        self.out.write_all(bytes)?;
        self.core.stats.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Counts device events that an encoder thread wrote.
    pub(crate) fn add_device_events(&mut self, n: u64) {
        self.core.stats.device_events += n;
    }

    /// Counts host slices that a thread of the layer wrote.
    pub(crate) fn add_host_slices(&mut self, n: u64) {
        self.core.stats.host_slices += n;
    }

    /// Hands buffered output to the writer once there is more than `above` bytes.
    fn drain(&mut self, above: usize) -> Result<(), PerfettoError> {
        if self.core.enc.len() > above {
            let r = write_packets(
                &mut self.out,
                self.compress,
                &mut self.zbuf,
                &self.core.enc.buf,
            );
            self.core.enc.clear();
            self.core.stats.bytes += r?;
        }
        Ok(())
    }

    /// Writes whole packets.
    fn emit(&mut self, packets: &[u8]) -> Result<(), PerfettoError> {
        self.core.stats.bytes +=
            write_packets(&mut self.out, self.compress, &mut self.zbuf, packets)?;
        Ok(())
    }

    /// Everything written so far, and the output flushed.
    pub fn flush(&mut self) -> Result<(), PerfettoError> {
        self.drain(0)?;
        self.out.flush()?;
        Ok(())
    }

    /// What has been written so far.
    pub fn stats(&self) -> WriteStats {
        let mut s = self.core.stats;
        s.bytes += self.core.enc.len() as u64;
        s
    }

    /// Writes what is buffered and gives the output back.
    pub fn finish(mut self) -> Result<(W, WriteStats), PerfettoError> {
        self.flush()?;
        Ok((self.out, self.core.stats))
    }
}

/// Writes whole packets to `out`, as they are or (`compress`: a zlib level)
/// as one `compressed_packets` packet; returns the bytes written.
fn write_packets(
    out: &mut impl Write,
    compress: Option<u32>,
    zbuf: &mut Vec<u8>,
    packets: &[u8],
) -> Result<u64, PerfettoError> {
    let Some(level) = compress else {
        out.write_all(packets)?;
        return Ok(packets.len() as u64);
    };
    let start = compressed_packet(level, packets, zbuf)?;
    out.write_all(&zbuf[start..])?;
    Ok((zbuf.len() - start) as u64)
}

/// Room kept ahead of a compressed body for its packet's head: the two keys
/// and two lengths of `Trace.packet { compressed_packets }`.
const HEAD_ROOM: usize = 16;

/// Deflates whole `packets` (zlib, `level`) into `buf` as one packet,
/// `Trace.packet { compressed_packets }`, which Perfetto inflates on load;
/// returns where in `buf` the packet starts (its body is deflated in place
/// after [`HEAD_ROOM`] bytes, the head written just before it). Encoder threads
/// call it on their own output ([`super::parallel`]), so that deflating, the
/// costly part, runs on every encoder rather than on the one writer.
pub(crate) fn compressed_packet(
    level: u32,
    packets: &[u8],
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    buf.clear();
    buf.resize(HEAD_ROOM, 0);
    let mut z =
        flate2::write::ZlibEncoder::new(std::mem::take(buf), flate2::Compression::new(level));
    z.write_all(packets)?;
    *buf = z.finish()?;
    let body = (buf.len() - HEAD_ROOM) as u64;
    let mut field50 = Enc::default();
    field50.varint(u64::from(field::PACKET_COMPRESSED << 3 | 2));
    field50.varint(body);
    let mut head = Enc::default();
    head.varint(u64::from(field::TRACE_PACKET << 3 | 2));
    head.varint(field50.len() as u64 + body);
    head.buf.extend_from_slice(&field50.buf);
    let start = HEAD_ROOM - head.len();
    buf[start..HEAD_ROOM].copy_from_slice(&head.buf);
    Ok(start)
}
