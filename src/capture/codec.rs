//! The capture file's bytes: encoding, decoding, validation, reading and writing.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use flate2::bufread::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;

use super::{
    CalibrationRound, Capture, CaptureDevice, CaptureError, CaptureLaunch, CAPTURE_HEADER_SIZE,
    CAPTURE_MAGIC, CAPTURE_OLDEST_VERSION, CAPTURE_VERSION,
};
use crate::batch::{DeviceInfo, HostSpan};
use crate::clock::Sample;
use crate::decode::OwnedBuffer;
use crate::output::AtomicFile;
use crate::registry::EventRegistry;

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
    fn corrupt(&self, what: &'static str) -> CaptureError {
        CaptureError::Corrupt {
            offset: self.pos,
            what,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], CaptureError> {
        match self.b.get(self.pos..).and_then(|r| r.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(CaptureError::Truncated {
                what: format!(
                    "body needs {n} bytes at offset {}, has {}",
                    self.pos,
                    self.b.len() - self.pos
                ),
            }),
        }
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], CaptureError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, CaptureError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, CaptureError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32, CaptureError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, CaptureError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn i64(&mut self) -> Result<i64, CaptureError> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    fn len(&mut self) -> Result<usize, CaptureError> {
        Ok(self.u32()? as usize)
    }
    fn bytes(&mut self) -> Result<&'a [u8], CaptureError> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| self.corrupt("byte string longer than memory"))?;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, CaptureError> {
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
        f: impl FnOnce(&mut Self) -> Result<T, CaptureError>,
    ) -> Result<Option<T>, CaptureError> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            _ => {
                self.pos -= 1;
                Err(self.corrupt("option tag is neither 0 nor 1"))
            }
        }
    }
    fn xyz(&mut self) -> Result<[u32; 3], CaptureError> {
        Ok([self.u32()?, self.u32()?, self.u32()?])
    }
    /// A count of items, each at least `min_size` bytes: refused early if the
    /// rest of the body cannot hold them, so no count makes us allocate.
    fn count(&mut self, min_size: usize) -> Result<usize, CaptureError> {
        let n = self.len()?;
        if n.saturating_mul(min_size) > self.b.len() - self.pos {
            self.pos -= 4;
            return Err(self.corrupt("count larger than the rest of the body"));
        }
        Ok(n)
    }
    fn pairs(&mut self) -> Result<Vec<(String, String)>, CaptureError> {
        let n = self.count(8)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((self.str()?, self.str()?));
        }
        Ok(v)
    }
}

impl Capture {
    /// Serializes the body (uncompressed), `docs/capture.md` § Body.
    pub(super) fn encode_body(&self) -> Result<Vec<u8>, CaptureError> {
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
            e.bytes(l.buffer.bytes());
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
            return Err(CaptureError::TooLarge);
        }
        Ok(e.0)
    }

    /// Parses a body of file version `version` (1 or 2: version 1's registry
    /// entries have no payload name).
    fn decode_body(body: &[u8], version: u32) -> Result<Capture, CaptureError> {
        let mut d = Dec { b: body, pos: 0 };
        let metadata = d.pairs()?;
        let n = d.count(32)?;
        let mut devices: Vec<CaptureDevice> = Vec::with_capacity(n);
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
                return Err(CaptureError::DuplicateDevice {
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
            devices.push(CaptureDevice { info, calibrations });
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
                return Err(CaptureError::UnknownDevice {
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
            let capture = OwnedBuffer::decode(d.bytes()?.to_vec(), None).map_err(|source| {
                CaptureError::Decode {
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
                return Err(CaptureError::LaunchMismatch {
                    launch: index,
                    field,
                });
            }
            launches.push(CaptureLaunch {
                device,
                launch_id,
                kernel,
                host_launch_ns,
                host_complete_ns,
                grid,
                block,
                host_thread,
                buffer: Arc::new(capture),
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
        Ok(Capture {
            metadata,
            devices,
            registry,
            launches,
            host_spans,
        })
    }

    /// Checks what [`Capture::read`] would check of a capture built in memory:
    /// device references, launch headers, spans. Writing does not need it; a
    /// capture that fails it writes a file that will not read back.
    pub fn validate(&self) -> Result<(), CaptureError> {
        for (i, d) in self.devices.iter().enumerate() {
            let o = d.info.ordinal;
            if self.devices[..i].iter().any(|x| x.info.ordinal == o) {
                return Err(CaptureError::DuplicateDevice { ordinal: o });
            }
        }
        for (index, l) in self.launches.iter().enumerate() {
            if !self.devices.iter().any(|x| x.info.ordinal == l.device) {
                return Err(CaptureError::UnknownDevice {
                    launch: index,
                    ordinal: l.device,
                });
            }
            let h = l.buffer.header();
            for (bad, field) in [
                (h.launch_id != l.launch_id, "launch_id"),
                (h.grid != l.grid, "grid"),
                (h.block != l.block, "block"),
            ] {
                if bad {
                    return Err(CaptureError::LaunchMismatch {
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
    pub fn to_writer(&self, w: impl Write) -> Result<(), CaptureError> {
        let body = self.encode_body()?;
        let mut w = BufWriter::new(w);
        w.write_all(&CAPTURE_MAGIC)?;
        w.write_all(&CAPTURE_VERSION.to_le_bytes())?;
        w.write_all(&(body.len() as u64).to_le_bytes())?;
        let mut z = ZlibEncoder::new(w, Compression::default());
        z.write_all(&body)?;
        z.finish()?.flush()?;
        Ok(())
    }

    /// Writes the file atomically ([`crate::output::AtomicFile`]): a reader never
    /// sees half a file, and a failed write leaves any earlier file at `path`
    /// as it was.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), CaptureError> {
        let path = path.as_ref();
        let file_err = |source| CaptureError::File {
            path: path.to_path_buf(),
            source,
        };
        let mut file = AtomicFile::create(path).map_err(file_err)?;
        self.to_writer(&mut file)?;
        file.commit().map_err(file_err)?;
        Ok(())
    }

    /// Reads and validates a capture file.
    pub fn read(path: impl AsRef<Path>) -> Result<Capture, CaptureError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| CaptureError::File {
            path: path.to_path_buf(),
            source,
        })?;
        Capture::from_reader(io::BufReader::new(file))
    }

    /// Reads and validates a capture from any reader.
    pub fn from_reader(mut r: impl Read) -> Result<Capture, CaptureError> {
        let mut head = Vec::with_capacity(CAPTURE_HEADER_SIZE);
        (&mut r)
            .take(CAPTURE_HEADER_SIZE as u64)
            .read_to_end(&mut head)?;
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
                io::ErrorKind::UnexpectedEof => CaptureError::Truncated {
                    what: "inside the compressed body".into(),
                },
                _ => CaptureError::CorruptStream(e),
            })?;
        if body.len() as u64 != declared {
            return Err(if (body.len() as u64) < declared {
                CaptureError::Truncated {
                    what: format!("body has {} of {declared} bytes", body.len()),
                }
            } else {
                CaptureError::Corrupt {
                    offset: body.len(),
                    what: "body longer than its declared length",
                }
            });
        }
        // Anything after the zlib stream is not ours.
        let mut rest = [0u8; 1];
        if z.into_inner().read(&mut rest)? != 0 {
            return Err(CaptureError::Corrupt {
                offset: body.len(),
                what: "bytes after the compressed body",
            });
        }
        Capture::decode_body(&body, version)
    }
}

fn check_span(index: usize, s: &HostSpan) -> Result<(), CaptureError> {
    let bad = |what| Err(CaptureError::BadSpan { span: index, what });
    if s.end_ns < s.start_ns {
        return bad("ends before it starts");
    }
    if s.parent.is_some_and(|p| p as usize >= index) {
        return bad("parent is not an earlier span");
    }
    Ok(())
}
