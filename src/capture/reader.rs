//! Reading a capture: whole ([`Capture::read`]) or a launch at a time
//! ([`CaptureReader`]), through one decoder (`body.rs` and the sections below).

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::mem::size_of;
use std::path::Path;
use std::sync::Arc;

use super::body::{Body, Budget};
use super::codec::{check_launch, check_launch_ids, check_span, LaunchKey};
use super::replay::Replay;
use super::snapshot;
use super::trace::{read_trace_buffer, TraceError};
use super::{
    CalibrationRound, Capture, CaptureDevice, CaptureError, CaptureLaunch, CAPTURE_HEADER_SIZE,
    CAPTURE_MAGIC, CAPTURE_OLDEST_VERSION, CAPTURE_VERSION,
};
use crate::batch::{Batch, DeviceInfo, HostSpan, Part};
use crate::clock::Sample;
use crate::registry::{EventInfo, EventRegistry};

/// Reads the file header: the version and the declared body length.
fn read_header(r: &mut impl Read) -> Result<(u32, u64), CaptureError> {
    let mut head = Vec::with_capacity(CAPTURE_HEADER_SIZE);
    r.take(CAPTURE_HEADER_SIZE as u64).read_to_end(&mut head)?;
    if head.len() < CAPTURE_MAGIC.len() || head[..8] != CAPTURE_MAGIC {
        if CAPTURE_MAGIC.starts_with(&head) {
            return Err(CaptureError::Truncated {
                what: format!("{} bytes, inside the magic", head.len()),
            });
        }
        head.truncate(8);
        return Err(CaptureError::BadMagic { found: head });
    }
    if head.len() < CAPTURE_HEADER_SIZE {
        return Err(CaptureError::Truncated {
            what: format!("{} bytes, inside the header", head.len()),
        });
    }
    let mut word = [0u8; 4];
    word.copy_from_slice(&head[8..12]);
    let version = u32::from_le_bytes(word);
    if !(CAPTURE_OLDEST_VERSION..=CAPTURE_VERSION).contains(&version) {
        return Err(CaptureError::UnsupportedVersion { found: version });
    }
    let mut long = [0u8; 8];
    long.copy_from_slice(&head[12..20]);
    Ok((version, u64::from_le_bytes(long)))
}

/// `list<pair>`, kept.
fn read_pairs<R: BufRead>(
    b: &mut Body<R>,
    budget: &mut Budget,
) -> Result<Vec<(String, String)>, CaptureError> {
    let (n, mut pairs) = b.list(8, budget)?;
    for _ in 0..n {
        pairs.push((b.str(budget)?, b.str(budget)?));
    }
    Ok(pairs)
}

/// The sections before the launches (metadata, devices, registry) of a body
/// of file version `version` (version 1's registry entries have no payload
/// name), as a capture with no launches and no host spans.
fn read_head<R: BufRead>(
    b: &mut Body<R>,
    version: u32,
    budget: &mut Budget,
) -> Result<Capture, CaptureError> {
    let metadata = read_pairs(b, budget)?;
    snapshot::check(&metadata)?;
    let (n, mut devices) = b.list::<CaptureDevice>(32, budget)?;
    let mut ordinals = HashSet::new();
    for _ in 0..n {
        let info = DeviceInfo {
            ordinal: b.u32()?,
            name: b.name(budget, "device name")?,
            uuid: b.str(budget)?,
            sm_count: b.u32()?,
            driver_version: b.str(budget)?,
            compute_capability: (b.u32()?, b.u32()?),
        };
        if !ordinals.insert(info.ordinal) {
            return Err(CaptureError::DuplicateDevice {
                ordinal: info.ordinal,
            });
        }
        let (rounds, mut calibrations) = b.list::<CalibrationRound>(44, budget)?;
        for _ in 0..rounds {
            let mut c = CalibrationRound {
                samples: Vec::new(),
                realtime_offset_ns: b.i64()?,
                monotonic_offset_ns: b.i64()?,
                monotonic_raw_offset_ns: b.i64()?,
                offset_uncertainty_ns: b.u64()?,
                timer_step_ns: b.u64()?,
            };
            let (ns, samples) = b.list::<Sample>(24, budget)?;
            c.samples = samples;
            for _ in 0..ns {
                c.samples.push(Sample {
                    host_before: b.u64()?,
                    device: b.u64()?,
                    host_after: b.u64()?,
                });
            }
            calibrations.push(c);
        }
        devices.push(CaptureDevice { info, calibrations });
    }
    let mut registry = EventRegistry::new();
    let n = b.count(8)?;
    budget.take(n.saturating_mul(size_of::<(u16, EventInfo)>()), b.pos() - 4)?;
    for _ in 0..n {
        let id = b.u16()?;
        let name = b.name(budget, "event name")?;
        let category = b.opt(|b| b.name(budget, "event category"))?;
        let description = b.opt(|b| b.str(budget))?;
        let payload = if version >= 2 {
            b.opt(|b| b.name(budget, "payload name"))?
        } else {
            None
        };
        registry.register_with(id, &name, category.as_deref(), description.as_deref())?;
        if let Some(p) = payload {
            registry.declare_payload(id, &p)?;
        }
    }
    Ok(Capture {
        metadata,
        devices,
        registry,
        launches: Vec::new(),
        host_spans: Vec::new(),
    })
}

/// The ordinals of a capture's devices: what a launch may name.
fn ordinals(head: &Capture) -> HashSet<u32> {
    head.devices.iter().map(|d| d.info.ordinal).collect()
}

/// The launches' count: each launch is at least 68 bytes.
fn read_launch_count<R: BufRead>(b: &mut Body<R>) -> Result<usize, CaptureError> {
    b.count(68)
}

/// A launch up to its trace buffer, whose length comes next.
struct Fields {
    device: u32,
    launch_id: u64,
    kernel: String,
    host_launch_ns: u64,
    host_complete_ns: u64,
    grid: [u32; 3],
    block: [u32; 3],
    host_thread: String,
    part: Option<Part>,
}

/// Reads a launch's [`Fields`] (of a file of version `version`: parts since
/// 3), its names charged to `budget`.
fn read_launch_fields<R: BufRead>(
    b: &mut Body<R>,
    version: u32,
    index: usize,
    ordinals: &HashSet<u32>,
    budget: &mut Budget,
) -> Result<Fields, CaptureError> {
    let device = b.u32()?;
    if !ordinals.contains(&device) {
        return Err(CaptureError::UnknownDevice {
            launch: index,
            ordinal: device,
        });
    }
    Ok(Fields {
        device,
        launch_id: b.u64()?,
        kernel: b.name(budget, "kernel name")?,
        host_launch_ns: b.u64()?,
        host_complete_ns: b.u64()?,
        grid: b.xyz()?,
        block: b.xyz()?,
        host_thread: b.name(budget, "thread name")?,
        part: match version >= 3 {
            true => b.opt(read_part)?,
            false => None,
        },
    })
}

/// A launch's part: u32 index, u8 last (0 or 1).
fn read_part<R: BufRead>(b: &mut Body<R>) -> Result<Part, CaptureError> {
    let index = b.u32()?;
    let last = match b.u8()? {
        0 => false,
        1 => true,
        _ => return Err(b.corrupt("a part's last flag is neither 0 nor 1")),
    };
    Ok(Part { index, last })
}

/// A launch, its trace buffer decoded (structure only: the registry names ids,
/// it does not filter them, so a run that registered no names still replays,
/// as "event 3") and checked against the launch; what it keeps charged to
/// `budget`.
fn read_launch<R: BufRead>(
    b: &mut Body<R>,
    version: u32,
    index: usize,
    ordinals: &HashSet<u32>,
    budget: &mut Budget,
) -> Result<CaptureLaunch, CaptureError> {
    let f = read_launch_fields(b, version, index, ordinals, budget)?;
    let n = b.bytes_len()?;
    let buffer = read_trace_buffer(b, n, budget).map_err(|e| match e {
        TraceError::Capture(e) => e,
        TraceError::Decode(source) => CaptureError::Decode {
            launch: index,
            source,
        },
    })?;
    let launch = CaptureLaunch {
        device: f.device,
        launch_id: f.launch_id,
        kernel: f.kernel,
        host_launch_ns: f.host_launch_ns,
        host_complete_ns: f.host_complete_ns,
        grid: f.grid,
        block: f.block,
        host_thread: f.host_thread,
        part: f.part,
        buffer: Arc::new(buffer),
    };
    check_launch(index, &launch)?;
    Ok(launch)
}

/// Passes over a launch, its trace buffer unread: its launch id and part.
fn skip_launch<R: BufRead>(
    b: &mut Body<R>,
    version: u32,
    index: usize,
    ordinals: &HashSet<u32>,
) -> Result<LaunchKey, CaptureError> {
    let f = read_launch_fields(b, version, index, ordinals, &mut Budget::new())?;
    let n = b.bytes_len()?;
    b.skip(n)?;
    Ok(LaunchKey::new(f.launch_id, f.part))
}

/// The host spans, kept.
fn read_spans<R: BufRead>(
    b: &mut Body<R>,
    budget: &mut Budget,
) -> Result<Vec<HostSpan>, CaptureError> {
    let (n, mut spans) = b.list(42, budget)?;
    for index in 0..n {
        let s = HostSpan {
            name: b.name(budget, "span name")?,
            target: b.name(budget, "span target")?,
            thread_name: b.name(budget, "thread name")?,
            thread_id: b.u64()?,
            start_ns: b.u64()?,
            end_ns: b.u64()?,
            parent: b.opt(Body::u32)?,
            launch_id: b.opt(Body::u64)?,
            fields: read_pairs(b, budget)?,
        };
        check_span(index, &s)?;
        spans.push(s);
    }
    Ok(spans)
}

/// The whole body, in one pass.
fn read_whole<R: BufRead>(b: &mut Body<R>, version: u32) -> Result<Capture, CaptureError> {
    let mut budget = Budget::new();
    let mut capture = read_head(b, version, &mut budget)?;
    let ordinals = ordinals(&capture);
    for index in 0..read_launch_count(b)? {
        let launch = read_launch(b, version, index, &ordinals, &mut budget)?;
        capture.launches.push(launch);
    }
    capture.host_spans = read_spans(b, &mut budget)?;
    b.end()?;
    Ok(capture)
}

impl Capture {
    /// Reads and validates a capture file, all of it into memory;
    /// [`CaptureReader`] reads one of any size a launch at a time.
    pub fn read(path: impl AsRef<Path>) -> Result<Capture, CaptureError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| CaptureError::File {
            path: path.to_path_buf(),
            source,
        })?;
        Capture::from_reader(file)
    }

    /// Reads and validates a capture from any reader.
    pub fn from_reader(r: impl Read) -> Result<Capture, CaptureError> {
        let mut r = BufReader::new(r);
        let (version, len) = read_header(&mut r)?;
        let mut body = Body::new(r, len);
        let capture = read_whole(&mut body, version).map_err(|e| body.settle(e))?;
        check_launch_ids(capture.launch_keys())?;
        Ok(capture)
    }
}

/// A capture file read in bounded memory, whatever the number of its launches:
/// everything but the launches when it opens ([`CaptureReader::head`]), then
/// the launches one at a time ([`CaptureReader::launches`], or as batches,
/// [`CaptureReader::batches`]), each decoded and checked as it comes.
///
/// It reads the file twice. Opening reads all of it and checks what
/// [`Capture::read`] checks but the trace buffers, which it passes over: the
/// stream, every section's structure, device references, host spans, launch
/// ids (no two alike but the parts of a streamed launch, in order: their
/// sorted list, 16 bytes a launch record, is kept until they are checked). The host spans come after the launches in the file, and a
/// trace needs them first (a launch's span starts the flow its kernel ends).
/// Each iteration over the launches reads the file again, decoding each
/// trace buffer in turn, so it holds one launch at a time besides what
/// [`CAPTURE_MEMORY_LIMIT`](super::CAPTURE_MEMORY_LIMIT) bounds. A capture
/// [`Capture::read`] accepts, this reader accepts, with the same launches.
///
/// A Perfetto trace of a capture of any size (what `tracing-gpu convert` does):
///
/// ```no_run
/// use tracing_gpu::capture::CaptureReader;
/// use tracing_gpu::output::AtomicFile;
/// use tracing_gpu::perfetto::TraceWriter;
/// let mut reader = CaptureReader::open("run.tgpu")?;
/// let mut trace = TraceWriter::new(AtomicFile::create("run.perfetto-trace")?)?;
/// let batches = reader.batches()?;
/// let head = batches.head(); // at hand while the batches come
/// trace.write_host_spans(head.process_name(), &head.host_spans)?;
/// for batch in batches {
///     let batch = batch?; // one launch at a time
///     trace.write_batch(&batch)?;
/// }
/// trace.finish()?.0.commit()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CaptureReader<R = File> {
    source: R,
    /// Where the capture starts in `source`.
    start: u64,
    /// The file's version (what a launch holds depends on it).
    version: u32,
    /// Everything but the launches.
    head: Capture,
    ordinals: HashSet<u32>,
    launch_count: usize,
    /// Body offset of the first launch.
    launches_at: u64,
    /// The body's length.
    len: u64,
    /// What each launch may keep: the memory limit less what `head` keeps.
    budget: Budget,
}

impl<R> fmt::Debug for CaptureReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureReader")
            .field("launch_count", &self.launch_count)
            .field("devices", &self.head.devices.len())
            .field("host_spans", &self.head.host_spans.len())
            .finish_non_exhaustive()
    }
}

/// The most a capture read from a pipe, a FIFO or a device is spooled to: what such
/// a source holds is read into an unnamed temporary file first, since the reader goes
/// through a capture twice.
const SPOOL_LIMIT: u64 = 16 << 30;

impl CaptureReader<File> {
    /// Opens and checks a capture file (everything but its trace buffers). A path that
    /// is not a regular file (a pipe such as `/dev/stdin`, a FIFO) is read into an
    /// unnamed temporary file first, at most 16 GiB; the disk holds it,
    /// not the memory, and nothing is left behind.
    pub fn open(path: impl AsRef<Path>) -> Result<CaptureReader<File>, CaptureError> {
        let path = path.as_ref();
        let file_error = |source| CaptureError::File {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(file_error)?;
        let regular = file.metadata().map_err(file_error)?.is_file();
        CaptureReader::new(if regular {
            file
        } else {
            spool(file, SPOOL_LIMIT).map_err(file_error)?
        })
    }
}

/// `source`'s bytes, up to `limit` of them, in an unnamed temporary file, rewound.
pub(super) fn spool(source: File, limit: u64) -> io::Result<File> {
    let mut spooled = tempfile::tempfile()?;
    let copied = io::copy(&mut source.take(limit + 1), &mut spooled)?;
    if copied > limit {
        return Err(io::Error::other(format!(
            "a capture that is not a regular file is read into a temporary file first, \
             and this one is longer than {limit} bytes: write it to a file"
        )));
    }
    spooled.seek(SeekFrom::Start(0))?;
    Ok(spooled)
}

impl<R: Read + Seek> CaptureReader<R> {
    /// Reads a capture that starts at `source`'s position, as
    /// [`CaptureReader::open`] does.
    pub fn new(mut source: R) -> Result<CaptureReader<R>, CaptureError> {
        let start = source.stream_position()?;
        let mut r = BufReader::new(&mut source);
        let (version, len) = read_header(&mut r)?;
        let mut body = Body::new(r, len);
        let mut pass = || -> Result<_, CaptureError> {
            let mut budget = Budget::new();
            let mut head = read_head(&mut body, version, &mut budget)?;
            let ordinals = ordinals(&head);
            let count = read_launch_count(&mut body)?;
            let launches_at = body.pos();
            let mut ids = Vec::with_capacity(count.min(1024));
            for index in 0..count {
                ids.push(skip_launch(&mut body, version, index, &ordinals)?);
            }
            head.host_spans = read_spans(&mut body, &mut budget)?;
            body.end()?;
            Ok((head, ordinals, count, launches_at, ids, budget))
        };
        let (head, ordinals, launch_count, launches_at, ids, budget) =
            pass().map_err(|e| body.settle(e))?;
        check_launch_ids(ids)?;
        Ok(CaptureReader {
            source,
            start,
            version,
            head,
            ordinals,
            launch_count,
            launches_at,
            len,
            budget,
        })
    }

    /// Everything but the launches: metadata, devices and their calibrations,
    /// registry, host spans; its `launches` is empty.
    pub fn head(&self) -> &Capture {
        &self.head
    }

    /// How many launches the capture holds.
    pub fn launch_count(&self) -> usize {
        self.launch_count
    }

    /// The launches, in order, read from the file again: each decoded and
    /// checked as it comes (a trace buffer that does not decode, or disagrees
    /// with its launch, is an `Err`, and the last item).
    pub fn launches(&mut self) -> Result<Launches<'_, R>, CaptureError> {
        let CaptureReader {
            source,
            start,
            version,
            head,
            ordinals,
            launch_count,
            launches_at,
            len,
            budget,
        } = self;
        source.seek(SeekFrom::Start(*start))?;
        let mut r = BufReader::new(source);
        io::copy(
            &mut (&mut r).take(CAPTURE_HEADER_SIZE as u64),
            &mut io::sink(),
        )?;
        let mut body = Body::new(r, *len);
        body.skip(*launches_at)?;
        Ok(Launches {
            body,
            version: *version,
            head,
            ordinals,
            next: 0,
            count: *launch_count,
            budget: *budget,
        })
    }

    /// The replay, a launch at a time: one [`Batch`] per launch, in order, as
    /// [`Capture::batches`] makes them (each device's calibration fitted once,
    /// here, and shared; a launch on a device with none is an `Err`).
    pub fn batches(&mut self) -> Result<Batches<'_, R>, CaptureError> {
        let replay = Replay::new(&self.head)?;
        Ok(Batches {
            launches: self.launches()?,
            replay,
        })
    }
}

/// The launches of a [`CaptureReader`], one at a time.
pub struct Launches<'a, R> {
    body: Body<BufReader<&'a mut R>>,
    version: u32,
    head: &'a Capture,
    ordinals: &'a HashSet<u32>,
    /// Index of the next launch; `count` after an error.
    next: usize,
    count: usize,
    /// What each launch may keep.
    budget: Budget,
}

impl<R> fmt::Debug for Launches<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launches")
            .field("next", &self.next)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl<'a, R> Launches<'a, R> {
    /// [`CaptureReader::head`], borrowed for as long as the reader is: at
    /// hand while the launches are read.
    pub fn head(&self) -> &'a Capture {
        self.head
    }
}

impl<R: Read> Iterator for Launches<'_, R> {
    type Item = Result<CaptureLaunch, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        let index = self.next;
        if index >= self.count {
            return None;
        }
        let mut budget = self.budget;
        let launch = read_launch(
            &mut self.body,
            self.version,
            index,
            self.ordinals,
            &mut budget,
        );
        self.next = if launch.is_ok() {
            index + 1
        } else {
            self.count
        };
        Some(launch)
    }
}

/// The batches of a [`CaptureReader`], one at a time.
pub struct Batches<'a, R> {
    launches: Launches<'a, R>,
    replay: Replay,
}

impl<R> fmt::Debug for Batches<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batches")
            .field("launches", &self.launches)
            .finish_non_exhaustive()
    }
}

impl<'a, R> Batches<'a, R> {
    /// [`CaptureReader::head`], borrowed for as long as the reader is: at
    /// hand while the batches are read (a trace writes the host spans first).
    pub fn head(&self) -> &'a Capture {
        self.launches.head
    }
}

impl<R: Read> Iterator for Batches<'_, R> {
    type Item = Result<Arc<Batch>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        let index = self.launches.next;
        let batch = self
            .launches
            .next()?
            .and_then(|l| self.replay.batch(index, &l));
        if batch.is_err() {
            self.launches.next = self.launches.count;
        }
        Some(batch)
    }
}
