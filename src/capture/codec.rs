//! The capture file's bytes written, and the checks a reader shares with
//! [`Capture::validate`].

use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::Path;

use flate2::write::ZlibEncoder;
use flate2::Compression;

use super::{Capture, CaptureError, CaptureLaunch, CAPTURE_MAGIC, CAPTURE_VERSION};
use crate::batch::{HostSpan, Part};
use crate::output::AtomicFile;

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
            match l.part {
                Some(p) => {
                    e.u8(1);
                    e.u32(p.index);
                    e.u8(u8::from(p.last));
                }
                None => e.u8(0),
            }
            e.bytes(&l.buffer.wire());
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

    /// Checks what [`Capture::read`] would check of a capture built in memory:
    /// the watchdog snapshots' notes, device references, launch headers, spans.
    /// Writing does not need it; a capture that fails it writes a file that will
    /// not read back.
    pub fn validate(&self) -> Result<(), CaptureError> {
        super::snapshot::check(&self.metadata)?;
        let mut ordinals = HashSet::new();
        for d in &self.devices {
            let ordinal = d.info.ordinal;
            if !ordinals.insert(ordinal) {
                return Err(CaptureError::DuplicateDevice { ordinal });
            }
        }
        for (index, l) in self.launches.iter().enumerate() {
            if !ordinals.contains(&l.device) {
                return Err(CaptureError::UnknownDevice {
                    launch: index,
                    ordinal: l.device,
                });
            }
            check_launch(index, l)?;
        }
        for (i, s) in self.host_spans.iter().enumerate() {
            check_span(i, s)?;
        }
        check_launch_ids(self.launch_keys())
    }

    /// Each launch's id and part, in file order, for [`check_launch_ids`].
    pub(super) fn launch_keys(&self) -> Vec<LaunchKey> {
        let keys = self.launches.iter();
        keys.map(|l| LaunchKey::new(l.launch_id, l.part)).collect()
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
}

/// A host span ends after it starts, and its parent is an earlier span.
pub(super) fn check_span(index: usize, s: &HostSpan) -> Result<(), CaptureError> {
    let bad = |what| Err(CaptureError::BadSpan { span: index, what });
    if s.end_ns < s.start_ns {
        return bad("ends before it starts");
    }
    if s.parent.is_some_and(|p| p as usize >= index) {
        return bad("parent is not an earlier span");
    }
    Ok(())
}

/// A launch's metadata agrees with its buffer's header.
pub(super) fn check_launch(index: usize, l: &CaptureLaunch) -> Result<(), CaptureError> {
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
    Ok(())
}

/// A launch's id and part: what [`check_launch_ids`] needs of it (16 bytes).
#[derive(Debug, Clone, Copy)]
pub(super) struct LaunchKey {
    id: u64,
    /// The part's index; 0 for a whole launch.
    index: u32,
    /// [`WHOLE`] or [`LAST`], or neither: a part before the last.
    kind: u8,
}

const WHOLE: u8 = 1;
const LAST: u8 = 2;

impl LaunchKey {
    pub(super) fn new(id: u64, part: Option<Part>) -> LaunchKey {
        let (index, kind) = match part {
            None => (0, WHOLE),
            Some(p) => (p.index, if p.last { LAST } else { 0 }),
        };
        LaunchKey { id, index, kind }
    }
}

/// No two launches share a launch id, but the parts of one streamed launch,
/// which come in order: parts 0, 1, 2, ... (the file order; parts of other
/// launches may come between them), none after the last. A streamed launch
/// whose last part is missing (the run ended while it ran) is accepted.
/// Sorting the keys (stable, by id: each launch's parts stay in file order)
/// costs 16 bytes a launch, dropped once checked.
pub(super) fn check_launch_ids(mut keys: Vec<LaunchKey>) -> Result<(), CaptureError> {
    keys.sort_by_key(|k| k.id);
    for launch in keys.chunk_by(|a, b| a.id == b.id) {
        let launch_id = launch[0].id;
        if launch.len() > 1 && launch.iter().any(|k| k.kind == WHOLE) {
            return Err(CaptureError::DuplicateLaunch { launch_id });
        }
        for (n, k) in launch.iter().enumerate() {
            let what = if k.index as usize != n {
                "its parts are not numbered 0, 1, 2, ... in file order"
            } else if k.kind == LAST && n + 1 != launch.len() {
                "a part comes after its last"
            } else {
                continue;
            };
            return Err(CaptureError::BadParts { launch_id, what });
        }
    }
    Ok(())
}
