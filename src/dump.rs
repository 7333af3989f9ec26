//! The capture file (`.tgpu`): everything needed to replay a profiled run without
//! the GPU — devices, raw clock calibration samples, the event registry, every
//! launch with its raw trace buffer, and the host spans recorded around them.
//! The CLI's `convert`, `report` and `demo` read it, and so do the tests.
//!
//! The layout is in `docs/dump.md`: a small uncompressed header (magic, version,
//! body length) and a zlib-compressed body of little-endian, length-prefixed
//! fields. Reading is strict and never panics: every trace buffer is decoded
//! (structure only; the registry names ids, it does not filter them), device
//! references, span parents and times are checked, and each fault is a
//! [`DumpError`].
//!
//! Clock samples are stored raw, as measured; a reader refits them, so a better
//! fit later improves old captures too.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flate2::bufread::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;

use crate::bridge::{Batch, DeviceInfo, LaunchInfo};
use crate::clock::{
    Calibration, Checkpoint, ClockError, ClockMap, FitOptions, HostOffsets, Sample,
};
use crate::decode::{DecodeError, OwnedCapture};
use crate::registry::{EventRegistry, RegistryError};

/// The first 8 bytes of every capture file.
pub const DUMP_MAGIC: [u8; 8] = *b"TGPUDUMP";
/// The version this crate writes. It also reads
/// [`DUMP_OLDEST_VERSION`] and every version in between.
pub const DUMP_VERSION: u32 = 2;
/// The oldest version this crate reads: version 1 has no payload names in its
/// registry (`docs/dump.md`).
pub const DUMP_OLDEST_VERSION: u32 = 1;
/// Bytes before the compressed body: magic, version, body length.
pub const DUMP_HEADER_SIZE: usize = 20;

/// Why a capture file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Opening, reading or writing the file failed.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Reading from or writing to a stream failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Not a capture file.
    #[error("not a tracing-gpu capture: magic {found:?}")]
    BadMagic {
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// A version this reader does not know.
    #[error("unsupported capture version {found} (this reader reads {DUMP_OLDEST_VERSION} to {DUMP_VERSION})")]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The file ends inside its header or its body.
    #[error("capture truncated: {what}")]
    Truncated {
        /// Where it ended.
        what: String,
    },
    /// The compressed body does not inflate.
    #[error("capture body is not a valid zlib stream: {0}")]
    CorruptStream(io::Error),
    /// The body does not parse.
    #[error("capture body corrupt at byte {offset}: {what}")]
    Corrupt {
        /// Offset within the uncompressed body.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// The registry holds one id twice with two names.
    #[error("capture registry: {0}")]
    Registry(#[from] RegistryError),
    /// Two devices with one ordinal.
    #[error("device ordinal {ordinal} appears twice")]
    DuplicateDevice {
        /// The ordinal.
        ordinal: u32,
    },
    /// A launch on a device the file does not describe.
    #[error("launch {launch}: device ordinal {ordinal} is not in the capture")]
    UnknownDevice {
        /// Index of the launch.
        launch: usize,
        /// The ordinal it names.
        ordinal: u32,
    },
    /// A launch's trace buffer does not decode.
    #[error("launch {launch}: {source}")]
    Decode {
        /// Index of the launch.
        launch: usize,
        /// The decoder's error.
        source: DecodeError,
    },
    /// A launch's metadata disagrees with its buffer header.
    #[error("launch {launch}: {field} differs from the trace buffer's header")]
    LaunchMismatch {
        /// Index of the launch.
        launch: usize,
        /// The field: `launch_id`, `grid` or `block`.
        field: &'static str,
    },
    /// A device's calibration samples do not fit a clock map.
    #[error("device {device}, calibration round {round}: {source}")]
    Clock {
        /// Device ordinal.
        device: u32,
        /// Index of the calibration round.
        round: usize,
        /// The fit's error.
        source: ClockError,
    },
    /// A launch on a device that has no calibration round.
    #[error("launch {launch}: device {device} has no calibration")]
    NoCalibration {
        /// Index of the launch.
        launch: usize,
        /// Device ordinal.
        device: u32,
    },
    /// A count or string too long for the format's 32-bit lengths.
    #[error("capture too large: a count or string exceeds 2^32 - 1")]
    TooLarge,
    /// A host span that is not well formed.
    #[error("host span {span}: {what}")]
    BadSpan {
        /// Index of the span.
        span: usize,
        /// What was wrong.
        what: &'static str,
    },
}

/// One calibration of a device: the raw samples, on the trace clock
/// ([`crate::clock::HostClock::Boottime`]), and the other host clocks' offsets
/// from it, measured right after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CalibrationRound {
    /// Host (BOOTTIME) before, device `%globaltimer`, host after.
    pub samples: Vec<Sample>,
    /// `CLOCK_REALTIME − CLOCK_BOOTTIME` (ns).
    pub realtime_offset_ns: i64,
    /// `CLOCK_MONOTONIC − CLOCK_BOOTTIME` (ns).
    pub monotonic_offset_ns: i64,
    /// `CLOCK_MONOTONIC_RAW − CLOCK_BOOTTIME` (ns).
    pub monotonic_raw_offset_ns: i64,
    /// How far each offset may be off (ns).
    pub offset_uncertainty_ns: u64,
    /// The device timer's step (ns) the live fit assumed (the calibrator
    /// measures it); the refit uses the same. 0: not measured, the
    /// [`FitOptions`] default applies.
    pub timer_step_ns: u64,
}

/// A GPU and its calibrations, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpDevice {
    /// What is known of the GPU.
    pub info: DeviceInfo,
    /// Calibration rounds in time order (the first before the first launch).
    pub calibrations: Vec<CalibrationRound>,
}

/// One profiled launch: [`LaunchInfo`] without its span id (which means nothing
/// outside the process), the device, and the validated trace buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpLaunch {
    /// Ordinal of the device (one of [`Dump::devices`]).
    pub device: u32,
    /// The host's id for the launch (the buffer header has the same).
    pub launch_id: u64,
    /// Kernel name.
    pub kernel: String,
    /// Trace-clock time just before the launch call (ns).
    pub host_launch_ns: u64,
    /// Trace-clock time just after completion was observed (ns).
    pub host_complete_ns: u64,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Name of the launching host thread.
    pub host_thread: String,
    /// The decoded trace buffer.
    pub capture: Arc<OwnedCapture>,
}

impl DumpLaunch {
    /// A launch record from the live [`LaunchInfo`] (its `parent` is dropped).
    pub fn new(device: u32, info: &LaunchInfo, capture: Arc<OwnedCapture>) -> DumpLaunch {
        DumpLaunch {
            device,
            launch_id: info.launch_id,
            kernel: info.kernel.clone(),
            host_launch_ns: info.host_launch_ns,
            host_complete_ns: info.host_complete_ns,
            grid: info.grid,
            block: info.block,
            host_thread: info.host_thread.clone(),
            capture,
        }
    }

    /// The [`LaunchInfo`] a replay hands on (`parent` is `None`: link replayed
    /// launches to host spans through [`HostSpan::launch_id`]).
    pub fn info(&self) -> LaunchInfo {
        LaunchInfo {
            launch_id: self.launch_id,
            kernel: self.kernel.clone(),
            host_launch_ns: self.host_launch_ns,
            host_complete_ns: self.host_complete_ns,
            grid: self.grid,
            block: self.block,
            parent: None,
            host_thread: self.host_thread.clone(),
        }
    }
}

/// A host `tracing` span recorded during the run, so a replay shows host and
/// device together. Times are on the trace clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSpan {
    /// Span name.
    pub name: String,
    /// `tracing` target.
    pub target: String,
    /// Name of the thread it ran on.
    pub thread_name: String,
    /// Id of that thread (OS thread id).
    pub thread_id: u64,
    /// Start (ns).
    pub start_ns: u64,
    /// End (ns), `≥ start_ns`.
    pub end_ns: u64,
    /// Index of the parent span in [`Dump::host_spans`]: always an earlier one
    /// (spans are stored in the order they were created).
    pub parent: Option<u32>,
    /// For the span that wraps a launch: that launch's id.
    pub launch_id: Option<u64>,
    /// Recorded fields, as strings.
    pub fields: Vec<(String, String)>,
}

/// A whole capture file, in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dump {
    /// Free-form key/value notes (tool version, command line, host name).
    pub metadata: Vec<(String, String)>,
    /// The GPUs, each with its calibrations.
    pub devices: Vec<DumpDevice>,
    /// Event id → name.
    pub registry: EventRegistry,
    /// The launches, in launch order.
    pub launches: Vec<DumpLaunch>,
    /// Host spans, in creation order.
    pub host_spans: Vec<HostSpan>,
}

// ---------------------------------------------------------------- encoding

struct Enc(Vec<u8>, bool);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        // A count or string past u32 has no encoding in v1: remembered, and
        // the write refused.
        self.1 |= n > u32::MAX as usize;
        self.u32(n as u32);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }
    fn xyz(&mut self, v: [u32; 3]) {
        v.iter().for_each(|&d| self.u32(d));
    }
    fn pairs(&mut self, p: &[(String, String)]) {
        self.len(p.len());
        for (k, v) in p {
            self.str(k);
            self.str(v);
        }
    }
}

struct Dec<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    fn corrupt(&self, what: &'static str) -> DumpError {
        DumpError::Corrupt {
            offset: self.pos,
            what,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DumpError> {
        match self.b.get(self.pos..).and_then(|r| r.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(DumpError::Truncated {
                what: format!(
                    "body needs {n} bytes at offset {}, has {}",
                    self.pos,
                    self.b.len() - self.pos
                ),
            }),
        }
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], DumpError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DumpError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DumpError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32, DumpError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, DumpError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn i64(&mut self) -> Result<i64, DumpError> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    fn len(&mut self) -> Result<usize, DumpError> {
        Ok(self.u32()? as usize)
    }
    fn bytes(&mut self) -> Result<&'a [u8], DumpError> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| self.corrupt("byte string longer than memory"))?;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, DumpError> {
        let n = self.len()?;
        let s = self.take(n)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => {
                self.pos -= n;
                Err(self.corrupt("string is not UTF-8"))
            }
        }
    }
    fn opt<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, DumpError>,
    ) -> Result<Option<T>, DumpError> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => {
                self.pos -= 1;
                Err(self.corrupt("option tag is neither 0 nor 1"))
            }
        }
    }
    fn xyz(&mut self) -> Result<[u32; 3], DumpError> {
        Ok([self.u32()?, self.u32()?, self.u32()?])
    }
    /// A count of items, each at least `min_size` bytes: refused early if the
    /// rest of the body cannot hold them, so no count makes us allocate.
    fn count(&mut self, min_size: usize) -> Result<usize, DumpError> {
        let n = self.len()?;
        if n.saturating_mul(min_size) > self.b.len() - self.pos {
            self.pos -= 4;
            return Err(self.corrupt("count larger than the rest of the body"));
        }
        Ok(n)
    }
    fn pairs(&mut self) -> Result<Vec<(String, String)>, DumpError> {
        let n = self.count(8)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((self.str()?, self.str()?));
        }
        Ok(v)
    }
}

impl Dump {
    /// Serializes the body (uncompressed), `docs/dump.md` § Body.
    fn encode_body(&self) -> Result<Vec<u8>, DumpError> {
        let mut e = Enc(Vec::new(), false);
        e.pairs(&self.metadata);
        e.len(self.devices.len());
        for d in &self.devices {
            let i = &d.info;
            e.u32(i.ordinal);
            e.str(&i.name);
            e.str(&i.uuid);
            e.u32(i.sm_count);
            e.str(&i.driver_version);
            e.u32(i.compute_capability.0);
            e.u32(i.compute_capability.1);
            e.len(d.calibrations.len());
            for c in &d.calibrations {
                e.i64(c.realtime_offset_ns);
                e.i64(c.monotonic_offset_ns);
                e.i64(c.monotonic_raw_offset_ns);
                e.u64(c.offset_uncertainty_ns);
                e.u64(c.timer_step_ns);
                e.len(c.samples.len());
                for s in &c.samples {
                    e.u64(s.host_before);
                    e.u64(s.device);
                    e.u64(s.host_after);
                }
            }
        }
        e.len(self.registry.len());
        for (id, info) in self.registry.iter() {
            e.u16(id);
            e.str(&info.name);
            e.opt_str(info.category.as_deref());
            e.opt_str(info.description.as_deref());
            e.opt_str(info.payload.as_deref());
        }
        e.len(self.launches.len());
        for l in &self.launches {
            e.u32(l.device);
            e.u64(l.launch_id);
            e.str(&l.kernel);
            e.u64(l.host_launch_ns);
            e.u64(l.host_complete_ns);
            e.xyz(l.grid);
            e.xyz(l.block);
            e.str(&l.host_thread);
            e.bytes(l.capture.bytes());
        }
        e.len(self.host_spans.len());
        for s in &self.host_spans {
            e.str(&s.name);
            e.str(&s.target);
            e.str(&s.thread_name);
            e.u64(s.thread_id);
            e.u64(s.start_ns);
            e.u64(s.end_ns);
            match s.parent {
                Some(p) => {
                    e.u8(1);
                    e.u32(p);
                }
                None => e.u8(0),
            }
            match s.launch_id {
                Some(id) => {
                    e.u8(1);
                    e.u64(id);
                }
                None => e.u8(0),
            }
            e.pairs(&s.fields);
        }
        if e.1 {
            return Err(DumpError::TooLarge);
        }
        Ok(e.0)
    }

    /// Parses a body of file version `version` (1 or 2: version 1's registry
    /// entries have no payload name).
    fn decode_body(body: &[u8], version: u32) -> Result<Dump, DumpError> {
        let mut d = Dec { b: body, pos: 0 };
        let metadata = d.pairs()?;
        let n = d.count(32)?;
        let mut devices: Vec<DumpDevice> = Vec::with_capacity(n);
        for _ in 0..n {
            let info = DeviceInfo {
                ordinal: d.u32()?,
                name: d.str()?,
                uuid: d.str()?,
                sm_count: d.u32()?,
                driver_version: d.str()?,
                compute_capability: (d.u32()?, d.u32()?),
            };
            if devices.iter().any(|x| x.info.ordinal == info.ordinal) {
                return Err(DumpError::DuplicateDevice {
                    ordinal: info.ordinal,
                });
            }
            let rounds = d.count(44)?;
            let mut calibrations = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let mut c = CalibrationRound {
                    samples: Vec::new(),
                    realtime_offset_ns: d.i64()?,
                    monotonic_offset_ns: d.i64()?,
                    monotonic_raw_offset_ns: d.i64()?,
                    offset_uncertainty_ns: d.u64()?,
                    timer_step_ns: d.u64()?,
                };
                let ns = d.count(24)?;
                c.samples.reserve_exact(ns);
                for _ in 0..ns {
                    c.samples.push(Sample {
                        host_before: d.u64()?,
                        device: d.u64()?,
                        host_after: d.u64()?,
                    });
                }
                calibrations.push(c);
            }
            devices.push(DumpDevice { info, calibrations });
        }
        let mut registry = EventRegistry::new();
        for _ in 0..d.count(8)? {
            let id = d.u16()?;
            let name = d.str()?;
            let category = d.opt(Dec::str)?;
            let description = d.opt(Dec::str)?;
            let payload = if version >= 2 { d.opt(Dec::str)? } else { None };
            registry.register_with(id, &name, category.as_deref(), description.as_deref())?;
            if let Some(p) = payload {
                registry.declare_payload(id, &p)?;
            }
        }
        let n = d.count(68)?;
        let mut launches = Vec::with_capacity(n);
        for index in 0..n {
            let device = d.u32()?;
            if !devices.iter().any(|x| x.info.ordinal == device) {
                return Err(DumpError::UnknownDevice {
                    launch: index,
                    ordinal: device,
                });
            }
            let launch_id = d.u64()?;
            let kernel = d.str()?;
            let host_launch_ns = d.u64()?;
            let host_complete_ns = d.u64()?;
            let grid = d.xyz()?;
            let block = d.xyz()?;
            let host_thread = d.str()?;
            // The registry names ids for display; it does not filter them: a run
            // that registered no names still replays, as "event 3".
            let capture = OwnedCapture::decode(d.bytes()?.to_vec(), None).map_err(|source| {
                DumpError::Decode {
                    launch: index,
                    source,
                }
            })?;
            let h = capture.header();
            let mismatch = if h.launch_id != launch_id {
                Some("launch_id")
            } else if h.grid != grid {
                Some("grid")
            } else if h.block != block {
                Some("block")
            } else {
                None
            };
            if let Some(field) = mismatch {
                return Err(DumpError::LaunchMismatch {
                    launch: index,
                    field,
                });
            }
            launches.push(DumpLaunch {
                device,
                launch_id,
                kernel,
                host_launch_ns,
                host_complete_ns,
                grid,
                block,
                host_thread,
                capture: Arc::new(capture),
            });
        }
        let n = d.count(42)?;
        let mut host_spans = Vec::with_capacity(n);
        for index in 0..n {
            let s = HostSpan {
                name: d.str()?,
                target: d.str()?,
                thread_name: d.str()?,
                thread_id: d.u64()?,
                start_ns: d.u64()?,
                end_ns: d.u64()?,
                parent: d.opt(Dec::u32)?,
                launch_id: d.opt(Dec::u64)?,
                fields: d.pairs()?,
            };
            check_span(index, &s)?;
            host_spans.push(s);
        }
        if d.pos != body.len() {
            return Err(d.corrupt("bytes after the last section"));
        }
        Ok(Dump {
            metadata,
            devices,
            registry,
            launches,
            host_spans,
        })
    }

    /// Checks what [`Dump::read`] would check of a dump built in memory:
    /// device references, launch headers, spans. Writing does not need it; a
    /// dump that fails it writes a file that will not read back.
    pub fn validate(&self) -> Result<(), DumpError> {
        for (i, d) in self.devices.iter().enumerate() {
            let o = d.info.ordinal;
            if self.devices[..i].iter().any(|x| x.info.ordinal == o) {
                return Err(DumpError::DuplicateDevice { ordinal: o });
            }
        }
        for (index, l) in self.launches.iter().enumerate() {
            if !self.devices.iter().any(|x| x.info.ordinal == l.device) {
                return Err(DumpError::UnknownDevice {
                    launch: index,
                    ordinal: l.device,
                });
            }
            let h = l.capture.header();
            for (bad, field) in [
                (h.launch_id != l.launch_id, "launch_id"),
                (h.grid != l.grid, "grid"),
                (h.block != l.block, "block"),
            ] {
                if bad {
                    return Err(DumpError::LaunchMismatch {
                        launch: index,
                        field,
                    });
                }
            }
        }
        for (i, s) in self.host_spans.iter().enumerate() {
            check_span(i, s)?;
        }
        Ok(())
    }

    /// Writes the whole file to `w`: header, then the compressed body.
    pub fn to_writer(&self, w: impl Write) -> Result<(), DumpError> {
        let body = self.encode_body()?;
        let mut w = BufWriter::new(w);
        w.write_all(&DUMP_MAGIC)?;
        w.write_all(&DUMP_VERSION.to_le_bytes())?;
        w.write_all(&(body.len() as u64).to_le_bytes())?;
        let mut z = ZlibEncoder::new(w, Compression::default());
        z.write_all(&body)?;
        z.finish()?.flush()?;
        Ok(())
    }

    /// Writes the file atomically: into a temporary file in the same folder,
    /// synced, then renamed over `path`. A reader never sees half a file, and a
    /// failed write leaves any earlier file at `path` as it was.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), DumpError> {
        let path = path.as_ref();
        let file_err = |p: &Path| {
            let p = p.to_path_buf();
            move |source| DumpError::File { path: p, source }
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .ok_or_else(|| DumpError::File {
                path: path.to_path_buf(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a file path"),
            })?
            .to_string_lossy();
        let (tmp, file) = create_temp(dir, &name).map_err(file_err(dir))?;
        let written = self
            .to_writer(&file)
            .and_then(|()| file.sync_all().map_err(file_err(&tmp)))
            .and_then(|()| fs::rename(&tmp, path).map_err(file_err(path)));
        if written.is_err() {
            // Best effort: the temporary file is ours and useless now.
            let _ = fs::remove_file(&tmp);
        } else if let Ok(d) = File::open(dir) {
            // Make the rename itself durable; not all file systems allow it.
            let _ = d.sync_all();
        }
        written
    }

    /// Reads and validates a capture file.
    pub fn read(path: impl AsRef<Path>) -> Result<Dump, DumpError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| DumpError::File {
            path: path.to_path_buf(),
            source,
        })?;
        Dump::from_reader(io::BufReader::new(file))
    }

    /// Reads and validates a capture from any reader.
    pub fn from_reader(mut r: impl Read) -> Result<Dump, DumpError> {
        let mut head = Vec::with_capacity(DUMP_HEADER_SIZE);
        (&mut r)
            .take(DUMP_HEADER_SIZE as u64)
            .read_to_end(&mut head)?;
        if head.len() < DUMP_MAGIC.len() || head[..8] != DUMP_MAGIC {
            if DUMP_MAGIC.starts_with(&head) {
                return Err(DumpError::Truncated {
                    what: format!("{} bytes, inside the magic", head.len()),
                });
            }
            head.truncate(8);
            return Err(DumpError::BadMagic { found: head });
        }
        if head.len() < DUMP_HEADER_SIZE {
            return Err(DumpError::Truncated {
                what: format!("{} bytes, inside the header", head.len()),
            });
        }
        let mut word = [0u8; 4];
        word.copy_from_slice(&head[8..12]);
        let version = u32::from_le_bytes(word);
        if !(DUMP_OLDEST_VERSION..=DUMP_VERSION).contains(&version) {
            return Err(DumpError::UnsupportedVersion { found: version });
        }
        let mut long = [0u8; 8];
        long.copy_from_slice(&head[12..20]);
        let declared = u64::from_le_bytes(long);
        // Read at most one byte more than declared, so a lying length cannot
        // make us inflate without end; the capacity is capped for the same reason.
        let mut body = Vec::with_capacity(declared.min(64 << 20) as usize);
        // The bufread decoder consumes only the stream's own bytes, so what
        // follows it can be checked below.
        let mut z = ZlibDecoder::new(io::BufReader::new(r));
        (&mut z)
            .take(declared.saturating_add(1))
            .read_to_end(&mut body)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => DumpError::Truncated {
                    what: "inside the compressed body".into(),
                },
                _ => DumpError::CorruptStream(e),
            })?;
        if body.len() as u64 != declared {
            return Err(if (body.len() as u64) < declared {
                DumpError::Truncated {
                    what: format!("body has {} of {declared} bytes", body.len()),
                }
            } else {
                DumpError::Corrupt {
                    offset: body.len(),
                    what: "body longer than its declared length",
                }
            });
        }
        // Anything after the zlib stream is not ours.
        let mut rest = [0u8; 1];
        if z.into_inner().read(&mut rest)? != 0 {
            return Err(DumpError::Corrupt {
                offset: body.len(),
                what: "bytes after the compressed body",
            });
        }
        Dump::decode_body(&body, version)
    }
}

impl Dump {
    /// Fits each device's calibration rounds (raw samples → [`ClockMap::fit_with`],
    /// one [`Checkpoint`] per round, in order): ordinal → calibration. A device
    /// with no rounds has no entry.
    pub fn calibrations(&self) -> Result<Vec<(u32, Calibration)>, DumpError> {
        let mut out = Vec::with_capacity(self.devices.len());
        for d in &self.devices {
            let device = d.info.ordinal;
            let mut cal: Option<Calibration> = None;
            for (round, c) in d.calibrations.iter().enumerate() {
                let clock_err = |source| DumpError::Clock {
                    device,
                    round,
                    source,
                };
                let mut options = FitOptions::default();
                if c.timer_step_ns != 0 {
                    options.timer_step_ns = c.timer_step_ns;
                }
                let checkpoint = Checkpoint {
                    map: ClockMap::fit_with(&c.samples, &options).map_err(clock_err)?,
                    host_offsets: HostOffsets {
                        realtime_ns: c.realtime_offset_ns,
                        monotonic_ns: c.monotonic_offset_ns,
                        monotonic_raw_ns: c.monotonic_raw_offset_ns,
                        uncertainty_ns: c.offset_uncertainty_ns,
                    },
                };
                match &mut cal {
                    None => cal = Some(Calibration::new(checkpoint)),
                    Some(cal) => cal.push(checkpoint).map_err(clock_err)?,
                }
            }
            if let Some(cal) = cal {
                out.push((device, cal));
            }
        }
        Ok(out)
    }

    /// The replay: one [`Batch`] per launch, in launch order, ready for
    /// [`crate::bridge`] sinks. Each device's calibration is fitted once and
    /// shared by its batches; the registry is shared by all.
    pub fn batches(&self) -> Result<Vec<Arc<Batch>>, DumpError> {
        let registry = Arc::new(self.registry.clone());
        let fitted = self.calibrations()?;
        let devices: Vec<(Arc<DeviceInfo>, Option<Arc<Calibration>>)> = self
            .devices
            .iter()
            .map(|d| {
                let cal = fitted
                    .iter()
                    .find(|(o, _)| *o == d.info.ordinal)
                    .map(|(_, c)| Arc::new(c.clone()));
                (Arc::new(d.info.clone()), cal)
            })
            .collect();
        self.launches
            .iter()
            .enumerate()
            .map(|(launch, l)| {
                let (device, cal) = devices.iter().find(|(d, _)| d.ordinal == l.device).ok_or(
                    DumpError::UnknownDevice {
                        launch,
                        ordinal: l.device,
                    },
                )?;
                let calibration = cal.clone().ok_or(DumpError::NoCalibration {
                    launch,
                    device: l.device,
                })?;
                Ok(Arc::new(Batch {
                    device: device.clone(),
                    launch: l.info(),
                    capture: l.capture.clone(),
                    calibration,
                    registry: registry.clone(),
                }))
            })
            .collect()
    }
}

fn check_span(index: usize, s: &HostSpan) -> Result<(), DumpError> {
    let bad = |what| Err(DumpError::BadSpan { span: index, what });
    if s.end_ns < s.start_ns {
        return bad("ends before it starts");
    }
    if s.parent.is_some_and(|p| p as usize >= index) {
        return bad("parent is not an earlier span");
    }
    Ok(())
}

/// Creates a new temporary file next to the target, with a name no one else uses.
fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let pid = std::process::id();
    let mut attempt = 0u32;
    loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(".{name}.{pid}.{nanos:x}.{attempt}.tmp"));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::CaptureBuilder;

    fn capture(launch_id: u64, grid: [u32; 3], block: [u32; 3]) -> Arc<OwnedCapture> {
        let mut b = CaptureBuilder::new(grid, block, 16);
        b.launch_id(launch_id);
        for warp in 0..b.header().warps_per_block {
            let w = b.warp(0, warp).unwrap();
            w.sm(3, 3);
            for k in 0..20u64 {
                let t = 1_000_000 + k * 100 + warp as u64;
                w.range((k % 3) as u16, t, t + 60, k as u32);
            }
        }
        Arc::new(OwnedCapture::decode(b.finish(), None).unwrap())
    }

    fn sample() -> Dump {
        let dev = |ordinal| DumpDevice {
            info: DeviceInfo {
                ordinal,
                name: "NVIDIA H200".into(),
                uuid: format!("GPU-0000000{ordinal}-aaaa-bbbb-cccc-dddddddddddd"),
                sm_count: 132,
                driver_version: "580.159.04".into(),
                compute_capability: (9, 0),
            },
            calibrations: vec![
                CalibrationRound {
                    samples: (0..8)
                        .map(|i| Sample {
                            host_before: 5_000 + i * 1000,
                            device: 1_000_000 + i * 1000,
                            host_after: 5_700 + i * 1000,
                        })
                        .collect(),
                    realtime_offset_ns: 1_764_000_000_000_000_000,
                    monotonic_offset_ns: -12,
                    monotonic_raw_offset_ns: -340,
                    offset_uncertainty_ns: 20,
                    timer_step_ns: 32,
                },
                CalibrationRound::default(),
            ],
        };
        let launch = |device, id, grid, block| DumpLaunch {
            device,
            launch_id: id,
            kernel: "gemm_ws".into(),
            host_launch_ns: 4_000 + id,
            host_complete_ns: 90_000 + id,
            grid,
            block,
            host_thread: "main".into(),
            capture: capture(id, grid, block),
        };
        Dump {
            metadata: vec![("tool".into(), "tracing-gpu 0.1.0".into())],
            devices: vec![dev(0), dev(1)],
            registry: {
                let mut r = EventRegistry::from_pairs([(0, "load"), (1, "mma")]).unwrap();
                r.register_with(2, "store", Some("gemm"), Some("epilogue store"))
                    .unwrap();
                r.declare_payload(1, "k_tile").unwrap();
                r
            },
            launches: vec![
                launch(0, 1, [1, 1, 1], [128, 1, 1]),
                launch(1, 2, [2, 1, 1], [64, 1, 1]),
            ],
            host_spans: vec![
                HostSpan {
                    name: "step".into(),
                    target: "app".into(),
                    thread_name: "main".into(),
                    thread_id: 77,
                    start_ns: 3_000,
                    end_ns: 100_000,
                    parent: None,
                    launch_id: None,
                    fields: vec![("batch".into(), "3".into())],
                },
                HostSpan {
                    name: "gemm_ws".into(),
                    target: "tracing_gpu".into(),
                    thread_name: "main".into(),
                    thread_id: 77,
                    start_ns: 4_000,
                    end_ns: 90_001,
                    parent: Some(0),
                    launch_id: Some(1),
                    fields: vec![],
                },
            ],
        }
    }

    fn bytes_of(d: &Dump) -> Vec<u8> {
        let mut v = Vec::new();
        d.to_writer(&mut v).unwrap();
        v
    }

    /// A file around an arbitrary body, to reach the body parser with bad bodies.
    fn wrap(body: &[u8]) -> Vec<u8> {
        let mut v = DUMP_MAGIC.to_vec();
        v.extend_from_slice(&DUMP_VERSION.to_le_bytes());
        v.extend_from_slice(&(body.len() as u64).to_le_bytes());
        let mut z = ZlibEncoder::new(v, Compression::default());
        z.write_all(body).unwrap();
        z.finish().unwrap()
    }

    #[test]
    fn round_trips_through_a_file() {
        let d = sample();
        d.validate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.tgpu");
        d.write(&path).unwrap();
        assert_eq!(Dump::read(&path).unwrap(), d);
        // Overwrite in place; no temporary file is left behind.
        let mut d2 = d.clone();
        d2.launches.pop();
        d2.write(&path).unwrap();
        assert_eq!(Dump::read(&path).unwrap(), d2);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["run.tgpu"]);
        // The launch info comes back without its span id.
        let info = d.launches[1].info();
        assert_eq!(
            (info.launch_id, info.grid, info.parent.is_none()),
            (2, [2, 1, 1], true)
        );
        assert_eq!(
            DumpLaunch::new(1, &info, d.launches[1].capture.clone()),
            d.launches[1]
        );
        assert_eq!(
            Dump::from_reader(&bytes_of(&Dump::default())[..]).unwrap(),
            Dump::default()
        );
    }

    #[test]
    fn version_1_captures_still_read() {
        // The shipped capture is a version 1 file: its registry has no payload
        // names. It reads, and writes back (as the current version) unchanged.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-quickstart.tgpu");
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes[8..12], 1u32.to_le_bytes());
        let d = Dump::from_reader(&bytes[..]).unwrap();
        assert_eq!(d.registry.name(1), Some("load"));
        assert!(d.registry.iter().all(|(_, e)| e.payload.is_none()));
        let again = bytes_of(&d);
        assert_eq!(again[8..12], DUMP_VERSION.to_le_bytes());
        assert_eq!(Dump::from_reader(&again[..]).unwrap(), d);
    }

    #[test]
    fn failed_write_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = sample()
            .write(dir.path().join("missing/run.tgpu"))
            .unwrap_err();
        assert!(matches!(e, DumpError::File { .. }), "{e}");
        // A directory in the way of the rename: the write fails, nothing is left.
        let target = dir.path().join("busy");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("x"), b"x").unwrap();
        assert!(sample().write(&target).is_err());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["busy"]);
    }

    #[test]
    fn header_errors() {
        let good = bytes_of(&sample());
        let read = |b: &[u8]| Dump::from_reader(b).unwrap_err();
        assert!(matches!(
            read(b"PK\x03\x04 not ours"),
            DumpError::BadMagic { .. }
        ));
        assert!(matches!(read(b"TGPU"), DumpError::Truncated { .. }));
        assert!(matches!(read(&good[..15]), DumpError::Truncated { .. }));
        for bad in [0, DUMP_VERSION + 1] {
            let mut v = good.clone();
            v[8..12].copy_from_slice(&bad.to_le_bytes());
            assert!(matches!(
                read(&v),
                DumpError::UnsupportedVersion { found } if found == bad
            ));
        }
        let e = read(&good[..good.len() - 10]);
        assert!(
            matches!(e, DumpError::Truncated { .. } | DumpError::CorruptStream(_)),
            "{e}"
        );
        let mut v = good.clone();
        let mid = v.len() / 2;
        v[mid] ^= 0x55;
        let e = read(&v);
        assert!(
            matches!(
                e,
                DumpError::CorruptStream(_)
                    | DumpError::Truncated { .. }
                    | DumpError::Corrupt { .. }
            ),
            "{e}"
        );
        let mut v = good.clone();
        v.push(0);
        assert!(matches!(
            read(&v),
            DumpError::Corrupt {
                what: "bytes after the compressed body",
                ..
            }
        ));
        let mut v = good.clone();
        v[12] += 1; // body length one more than the body
        assert!(matches!(read(&v), DumpError::Truncated { .. }));
        let mut v = good;
        v[12] -= 1;
        assert!(matches!(
            read(&v),
            DumpError::Corrupt {
                what: "body longer than its declared length",
                ..
            }
        ));
    }

    #[test]
    fn body_errors() {
        let d = sample();
        let body = d.encode_body().unwrap();
        let read = |b: &[u8]| Dump::from_reader(&wrap(b)[..]).unwrap_err();
        // A broken trace buffer names its launch: break the second buffer's version.
        let second = body
            .windows(4)
            .enumerate()
            .filter(|(_, w)| w == b"TGPU")
            .nth(1)
            .unwrap()
            .0;
        let mut b = body.clone();
        b[second + 4] = 9;
        match read(&b) {
            DumpError::Decode { launch: 1, source } => {
                assert_eq!(source, DecodeError::UnsupportedVersion { found: 9 })
            }
            e => panic!("{e}"),
        }
        let mut b = body.clone();
        b.push(0);
        assert!(matches!(
            read(&b),
            DumpError::Corrupt {
                what: "bytes after the last section",
                ..
            }
        ));
        assert!(matches!(
            read(&body[..body.len() - 1]),
            DumpError::Truncated { .. }
        ));
        // metadata count 0xFFFFFFFF: refused before allocating.
        let mut b = body.clone();
        b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read(&b), DumpError::Corrupt { offset: 0, .. }));
        // Bad UTF-8 in the first metadata key ("tool", after two u32s).
        let mut b = body.clone();
        b[8] = 0xFF;
        assert!(matches!(
            read(&b),
            DumpError::Corrupt {
                offset: 8,
                what: "string is not UTF-8"
            }
        ));
    }

    #[test]
    fn consistency_errors() {
        let check = |d: Dump, want: fn(&DumpError) -> bool| {
            let e = d.validate().unwrap_err();
            assert!(want(&e), "{e}");
            let e = Dump::from_reader(&bytes_of(&d)[..]).unwrap_err();
            assert!(want(&e), "{e}");
        };
        let mut d = sample();
        d.devices[1].info.ordinal = 0;
        check(d, |e| {
            matches!(e, DumpError::DuplicateDevice { ordinal: 0 })
        });
        let mut d = sample();
        d.launches[1].device = 5;
        check(d, |e| {
            matches!(
                e,
                DumpError::UnknownDevice {
                    launch: 1,
                    ordinal: 5
                }
            )
        });
        let mut d = sample();
        d.launches[0].launch_id = 9;
        check(d, |e| {
            matches!(
                e,
                DumpError::LaunchMismatch {
                    launch: 0,
                    field: "launch_id"
                }
            )
        });
        let mut d = sample();
        d.launches[1].grid = [1, 2, 1];
        check(d, |e| {
            matches!(
                e,
                DumpError::LaunchMismatch {
                    launch: 1,
                    field: "grid"
                }
            )
        });
        let mut d = sample();
        d.host_spans[0].parent = Some(1);
        check(d, |e| matches!(e, DumpError::BadSpan { span: 0, .. }));
        let mut d = sample();
        d.host_spans[1].end_ns = 3_999;
        check(d, |e| {
            matches!(
                e,
                DumpError::BadSpan {
                    span: 1,
                    what: "ends before it starts"
                }
            )
        });
    }

    #[test]
    fn batches_replay_every_launch() {
        let d = sample();
        // Round 1 of each device has no samples: it cannot fit.
        let e = d.batches().unwrap_err();
        assert!(
            matches!(
                e,
                DumpError::Clock {
                    device: 0,
                    round: 1,
                    source: ClockError::NotEnoughSamples { .. }
                }
            ),
            "{e}"
        );
        let mut d = sample();
        for dev in &mut d.devices {
            dev.calibrations.truncate(1);
        }
        let batches = d.batches().unwrap();
        assert_eq!(batches.len(), 2);
        for (b, l) in batches.iter().zip(&d.launches) {
            assert_eq!(b.device.ordinal, l.device);
            assert_eq!(b.launch.launch_id, l.launch_id);
            assert!(Arc::ptr_eq(&b.capture, &l.capture));
            assert!(Arc::ptr_eq(&b.registry, &batches[0].registry));
            assert_eq!(b.registry.name(1), Some("mma"));
            // Samples map device 1_000_000 + i·1000 to host 5_000 + i·1000 (+350 mid round trip).
            let host = b
                .calibration
                .to_host(crate::clock::HostClock::Boottime, 1_003_000);
            assert!(host.abs_diff(8_350) <= 400, "{host}");
        }
        d.devices[1].calibrations.clear();
        assert!(matches!(
            d.batches().unwrap_err(),
            DumpError::NoCalibration {
                launch: 1,
                device: 1
            }
        ));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_dump() -> impl Strategy<Value = Dump> {
            let text = "[a-z\u{e9}\u{4e2d}]{0,6}";
            let span = (
                text,
                text,
                any::<u64>(),
                0u64..1000,
                0u64..1000,
                any::<Option<u64>>(),
                prop::collection::vec((text, text), 0..3),
            );
            (
                prop::collection::vec((text, text), 0..3),
                0usize..3,
                prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..5),
                prop::collection::vec(
                    (
                        any::<u16>(),
                        text,
                        prop::option::of(text),
                        prop::option::of(text),
                    ),
                    0..5,
                ),
                0usize..3,
                prop::collection::vec(span, 0..4),
            )
                .prop_map(|(metadata, ndev, samples, reg, nlaunch, spans)| {
                    let samples: Vec<Sample> = samples
                        .into_iter()
                        .map(|(a, b, c)| Sample {
                            host_before: a,
                            device: b,
                            host_after: c,
                        })
                        .collect();
                    let devices: Vec<DumpDevice> = (0..ndev as u32)
                        .map(|o| DumpDevice {
                            info: DeviceInfo {
                                ordinal: o * 3,
                                ..DeviceInfo::default()
                            },
                            calibrations: vec![CalibrationRound {
                                samples: samples.clone(),
                                ..Default::default()
                            }],
                        })
                        .collect();
                    let mut registry = EventRegistry::new();
                    for (id, name, cat, payload) in reg {
                        let _ = registry.register_with(id, &name, cat.as_deref(), None);
                        if let Some(p) = payload {
                            let _ = registry.declare_payload(id, &p);
                        }
                    }
                    let launches = if devices.is_empty() { 0 } else { nlaunch };
                    let launches = (0..launches as u64)
                        .map(|i| DumpLaunch {
                            device: 0,
                            launch_id: i,
                            kernel: format!("k{i}"),
                            host_launch_ns: i,
                            host_complete_ns: i + 1,
                            grid: [1, 1, 1],
                            block: [32 * (i as u32 + 1), 1, 1],
                            host_thread: String::new(),
                            capture: capture(i, [1, 1, 1], [32 * (i as u32 + 1), 1, 1]),
                        })
                        .collect();
                    let host_spans = spans
                        .into_iter()
                        .enumerate()
                        .map(
                            |(i, (name, target, tid, start, len, launch_id, fields))| HostSpan {
                                name,
                                target,
                                thread_name: "t".into(),
                                thread_id: tid,
                                start_ns: start,
                                end_ns: start + len,
                                parent: i.checked_sub(1).map(|p| p as u32),
                                launch_id,
                                fields,
                            },
                        )
                        .collect();
                    Dump {
                        metadata,
                        devices,
                        registry,
                        launches,
                        host_spans,
                    }
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            #[test]
            fn dumps_round_trip(d in arb_dump()) {
                d.validate().unwrap();
                prop_assert_eq!(Dump::from_reader(&bytes_of(&d)[..]).unwrap(), d);
            }

            #[test]
            fn mutated_dumps_never_panic(
                d in arb_dump(),
                body_edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
                file_edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
                cut in prop::option::weighted(0.2, any::<prop::sample::Index>()),
            ) {
                // Edits of the body reach the parser; edits of the file, the inflater.
                let mut body = d.encode_body().unwrap();
                if !body.is_empty() {
                    for (at, x) in &body_edits {
                        let i = at.index(body.len());
                        body[i] ^= x;
                    }
                }
                let _ = Dump::from_reader(&wrap(&body)[..]);
                let mut file = bytes_of(&d);
                for (at, x) in &file_edits {
                    let i = at.index(file.len());
                    file[i] ^= x;
                }
                if let Some(c) = cut {
                    file.truncate(c.index(file.len() + 1));
                }
                let _ = Dump::from_reader(&file[..]);
            }
        }
    }
}
