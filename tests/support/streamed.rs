//! A capture of one streamed launch of any length, written as it is made: its
//! parts are packed buffers (docs/format.md) built one at a time and compressed
//! into the file as they come, so that a capture of 100 M events needs no more
//! memory to write than one part.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;
use tracing_gpu::batch::HostSpan;
use tracing_gpu::capture::{Capture, CAPTURE_HEADER_SIZE};
use tracing_gpu::format::wire::{
    buffer_offsets, packed_offsets as po, BUFFER_FLAG_PACKED, BUFFER_HEADER_SIZE, KIND_RANGE,
    NO_CLUSTER, PACKED_RECORD_SIZE, SLOT_HEADER_SIZE, SLOT_MAGIC, VERSION,
};
use tracing_gpu::format::{BufferHeader, SlotHeader};
use tracing_gpu::registry::EventRegistry;

/// The shape of a streamed launch: 132 blocks (one an SM) of `warps` warps,
/// each warp `events` back-to-back ranges of 900 ns every µs in each of
/// `parts` parts, one after the other in time; or, `alike`, `events` ranges
/// all the same in each (a file that inflates a thousandfold).
#[derive(Debug, Clone, Copy)]
pub struct Streamed {
    pub parts: u32,
    pub warps: u32,
    pub events: u32,
    pub alike: bool,
}

/// Device time of the launch's first event (the calibration maps it to the host).
const T0: u64 = 1_000_000_000;
const LAUNCH_ID: u64 = 1;

impl Streamed {
    /// Events in the launch.
    pub fn total(&self) -> u64 {
        u64::from(self.parts) * 132 * u64::from(self.warps) * u64::from(self.events)
    }

    fn grid_block(&self) -> ([u32; 3], [u32; 3]) {
        ([132, 1, 1], [32 * self.warps, 1, 1])
    }

    /// Device time part `p` starts at.
    fn part_start(&self, p: u32) -> u64 {
        T0 + u64::from(p) * u64::from(self.events) * 1_000
    }

    /// Part `p`'s packed buffer.
    pub fn part(&self, p: u32) -> Vec<u8> {
        let (grid, block) = self.grid_block();
        let slots = 132 * self.warps;
        let per_slot = SLOT_HEADER_SIZE + self.events as usize * PACKED_RECORD_SIZE;
        let mut out = vec![0; BUFFER_HEADER_SIZE + slots as usize * per_slot];
        BufferHeader {
            version: VERSION,
            slot_capacity: self.events,
            slot_count: slots,
            warps_per_block: self.warps,
            launch_id: LAUNCH_ID,
            grid,
            block,
            flags: BUFFER_FLAG_PACKED,
            sampling: Default::default(),
        }
        .write_to(&mut out);
        let record_size = buffer_offsets::RECORD_SIZE;
        out[record_size..record_size + 2]
            .copy_from_slice(&(PACKED_RECORD_SIZE as u16).to_le_bytes());
        let t0 = self.part_start(p);
        let mut at = BUFFER_HEADER_SIZE;
        for b in 0..132u32 {
            for w in 0..self.warps {
                let offset = u64::from(w) * 10;
                SlotHeader {
                    magic: SLOT_MAGIC,
                    flags: 0,
                    first_ts: t0,
                    last_ts: t0 + u64::from(self.events) * 1_000,
                    sm_first: b,
                    sm_last: b,
                    block_linear: b,
                    block: [b, 0, 0],
                    warp: w,
                    cluster_rank: NO_CLUSTER,
                    record_count: self.events,
                    events_lost: 0,
                }
                .write_to(&mut out[at..]);
                at += SLOT_HEADER_SIZE;
                for k in 0..self.events {
                    let (k, offset) = match self.alike {
                        true => (0, 0),
                        false => (k, offset),
                    };
                    let start = t0 + u64::from(k) * 1_000 + offset;
                    let r = &mut out[at..at + PACKED_RECORD_SIZE];
                    r[po::START_NS..po::START_NS + 8].copy_from_slice(&start.to_le_bytes());
                    r[po::END_NS..po::END_NS + 8].copy_from_slice(&(start + 900).to_le_bytes());
                    r[po::EVENT_ID..po::EVENT_ID + 2]
                        .copy_from_slice(&((k % 3) as u16).to_le_bytes());
                    r[po::KIND..po::KIND + 2].copy_from_slice(&KIND_RANGE.to_le_bytes());
                    r[po::PAYLOAD..po::PAYLOAD + 4].copy_from_slice(&k.to_le_bytes());
                    at += PACKED_RECORD_SIZE;
                }
            }
        }
        out
    }

    /// Writes the capture to `path`: a calibrated H200, the launch's host span,
    /// and the launch in its parts, the last one marked so.
    pub fn write(&self, path: &Path) {
        self.write_with(path, Compression::fast());
    }

    /// [`Streamed::write`], compressed at `level`.
    pub fn write_with(&self, path: &Path, level: Compression) {
        let (grid, block) = self.grid_block();
        let end = self.part_start(self.parts) + 1_000;
        let span = launch_span(T0 - 5_000, end + 5_000);
        let mut w = BodyWriter::create(path, &[span], self.parts, level);
        for p in 0..self.parts {
            let buffer = self.part(p);
            let launch = Launch {
                host_complete_ns: self.part_start(p + 1) + 1_000,
                part: Some((p, p + 1 == self.parts)),
                ..Launch::new(grid, block)
            };
            w.launch(&launch, buffer.len() as u64);
            w.put(&buffer);
        }
        w.finish();
    }
}

/// The host span of launch 1, from `start_ns` to `end_ns`.
pub fn launch_span(start_ns: u64, end_ns: u64) -> HostSpan {
    HostSpan {
        name: "launch".into(),
        target: "streamed".into(),
        thread_name: "main".into(),
        thread_id: 1,
        start_ns,
        end_ns,
        parent: None,
        launch_id: Some(LAUNCH_ID),
        fields: vec![],
    }
}

/// A launch record's fields (docs/capture.md), its trace buffer apart.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub launch_id: u64,
    pub kernel: &'a str,
    pub host_launch_ns: u64,
    pub host_complete_ns: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub host_thread: &'a str,
    /// Index and last, of a part.
    pub part: Option<(u32, bool)>,
}

impl Launch<'_> {
    /// Launch 1 of grid `grid` and block `block`, on the device from
    /// [`T0`] on, recorded whole.
    pub fn new(grid: [u32; 3], block: [u32; 3]) -> Launch<'static> {
        Launch {
            launch_id: LAUNCH_ID,
            kernel: "streamed",
            host_launch_ns: T0 - 5_000,
            host_complete_ns: T0 + 5_000,
            grid,
            block,
            host_thread: "main",
            part: None,
        }
    }
}

/// A capture file's body written as it comes, compressed into the file; its
/// length is set in the header at the end.
pub struct BodyWriter {
    z: ZlibEncoder<BufWriter<File>>,
    len: u64,
    /// The host spans section, written after the launches.
    spans: Vec<u8>,
}

impl BodyWriter {
    /// Begins the capture at `path` (a calibrated H200, the three event types
    /// `load`, `mma`, `store`, the host spans `spans`) with `launches` launch
    /// records to come.
    pub fn create(
        path: &Path,
        spans: &[HostSpan],
        launches: u32,
        level: Compression,
    ) -> BodyWriter {
        let capture = Capture {
            metadata: vec![("command".into(), "streamed".into())],
            devices: vec![super::calibrated_h200()],
            registry: EventRegistry::from_pairs([(0, "load"), (1, "mma"), (2, "store")]).unwrap(),
            launches: Vec::new(),
            host_spans: spans.to_vec(),
        };
        let body = |c: &Capture| {
            let mut file = Vec::new();
            c.to_writer(&mut file).unwrap();
            let mut b = Vec::new();
            ZlibDecoder::new(&file[CAPTURE_HEADER_SIZE..])
                .read_to_end(&mut b)
                .unwrap();
            (file, b)
        };
        let (file, whole) = body(&capture);
        // The host spans alone: after 4 empty sections (metadata, devices,
        // events, launches).
        let spans = body(&Capture {
            host_spans: spans.to_vec(),
            ..Capture::default()
        })
        .1
        .split_off(16);
        let head = &whole[..whole.len() - spans.len() - 4];
        let mut out = BufWriter::new(File::create(path).unwrap());
        out.write_all(&file[..CAPTURE_HEADER_SIZE]).unwrap();
        let mut w = BodyWriter {
            z: ZlibEncoder::new(out, level),
            len: 0,
            spans,
        };
        w.put(head);
        w.put(&launches.to_le_bytes());
        w
    }

    /// Appends `b` to the body.
    pub fn put(&mut self, b: &[u8]) {
        self.z.write_all(b).unwrap();
        self.len += b.len() as u64;
    }

    /// Appends `n` bytes of `byte`.
    pub fn fill(&mut self, byte: u8, n: u64) {
        let chunk = vec![byte; 1 << 20];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            self.put(&chunk[..k]);
            left -= k as u64;
        }
    }

    /// Appends a launch record up to its trace buffer, whose length is
    /// `buffer_len` (its bytes come next: [`BodyWriter::put`]).
    pub fn launch(&mut self, l: &Launch<'_>, buffer_len: u64) {
        let mut rec = Vec::new();
        rec.extend_from_slice(&0u32.to_le_bytes()); // device
        rec.extend_from_slice(&l.launch_id.to_le_bytes());
        rec.extend_from_slice(&(l.kernel.len() as u32).to_le_bytes());
        rec.extend_from_slice(l.kernel.as_bytes());
        rec.extend_from_slice(&l.host_launch_ns.to_le_bytes());
        rec.extend_from_slice(&l.host_complete_ns.to_le_bytes());
        for d in l.grid.iter().chain(&l.block) {
            rec.extend_from_slice(&d.to_le_bytes());
        }
        rec.extend_from_slice(&(l.host_thread.len() as u32).to_le_bytes());
        rec.extend_from_slice(l.host_thread.as_bytes());
        match l.part {
            Some((index, last)) => {
                rec.push(1);
                rec.extend_from_slice(&index.to_le_bytes());
                rec.push(u8::from(last));
            }
            None => rec.push(0),
        }
        rec.extend_from_slice(&buffer_len.to_le_bytes());
        self.put(&rec);
    }

    /// Appends the host spans and closes the file.
    pub fn finish(mut self) {
        let spans = std::mem::take(&mut self.spans);
        self.put(&spans);
        let mut out = self.z.finish().unwrap();
        out.seek(SeekFrom::Start(12)).unwrap();
        out.write_all(&self.len.to_le_bytes()).unwrap();
        out.flush().unwrap();
    }
}
