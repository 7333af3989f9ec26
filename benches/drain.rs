//! A drain thread's CPU work (issue #13), in entries a second of one core:
//! `cargo bench --features cuda --bench drain`.
//!
//! One shard (64 warps, as a drain thread gets them) of rings of 128 chunks (the
//! H200's default ring for 528 warps), in host memory: the bench stores chunks as
//! the device does, untimed, and the drain reads and cuts them with the code the
//! drain threads run (`tracing_gpu::cuda::__bench`). Each warp records the GEMM-like
//! mix of `benches/decode.rs`: a begin, an end and a payload per range, an instant
//! and a payload per instant (2.75 entries per event). An iteration fills every
//! ring 3 times, each fill read by one pass, then cuts the part (about 277 k
//! events: drain threads cut at 256 k).
//!
//! - `rebuild`: the passes (chunks loaded, checked complete, rebuilt into events,
//!   zeroed and freed).
//! - `cut`: the part packed and checked.
//! - `all`: both; its rate is what one drain thread sustains.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use tracing_gpu::cuda::__bench::Rings;
use tracing_gpu::format::wire::{
    CHUNK_ENTRIES, CHUNK_SM_SHIFT, ENTRY_BEGIN, ENTRY_END, ENTRY_INSTANT, ENTRY_PAYLOAD,
    STREAM_MARK,
};
use tracing_gpu::registry::EventRegistry;

const WARPS: u32 = 64;
const CHUNKS: u32 = 128;
const FILLS: u64 = 3;
const ENTRIES: u64 = FILLS * (WARPS * CHUNKS) as u64 * CHUNK_ENTRIES as u64;

/// One warp's recorder: the entries it stores next.
struct Warp {
    t: u64,
    k: u32,
    /// Entries not yet stored (at most a chunk's and a phase's), each with the
    /// time it was written at.
    staged: Vec<(u64, u64)>,
}

fn word(t: u64, id: u16, kind: u16) -> u64 {
    (t as u32) as u64 | (id as u64) << 32 | ((kind | STREAM_MARK) as u64) << 48
}

impl Warp {
    /// The next full chunk: 31 entries, its meta stamped just after the last
    /// (before the next).
    fn chunk(&mut self, sm: u32) -> [u64; 32] {
        while self.staged.len() < CHUNK_ENTRIES {
            let (t, k) = (self.t, self.k);
            if k % 4 == 3 {
                self.staged.extend([
                    (word(t + 5, 3, ENTRY_INSTANT), t + 5),
                    (word(k as u64, 0, ENTRY_PAYLOAD), t + 5),
                ]);
                self.t += 5;
            } else {
                let id = (k % 3) as u16;
                self.staged.extend([
                    (word(t + 2, id, ENTRY_BEGIN), t + 2),
                    (word(t + 300, id, ENTRY_END), t + 300),
                    (word(k as u64, 0, ENTRY_PAYLOAD), t + 300),
                ]);
                self.t += 300;
            }
            self.k += 1;
        }
        let mut c = [0u64; 32];
        for (c, &(w, _)) in c.iter_mut().zip(&self.staged[..CHUNK_ENTRIES]) {
            *c = w;
        }
        let stamp = self.staged[CHUNK_ENTRIES - 1].1 + 1;
        self.staged.drain(..CHUNK_ENTRIES);
        let info = STREAM_MARK | (sm as u16) << CHUNK_SM_SHIFT | CHUNK_ENTRIES as u16;
        c[CHUNK_ENTRIES] = (stamp & ((1 << 48) - 1)) | (info as u64) << 48;
        c
    }
}

/// The rings and their warps.
struct Launch {
    rings: Rings,
    warps: Vec<Warp>,
}

impl Launch {
    fn new() -> Launch {
        let reg = EventRegistry::from_pairs([(0, "load"), (1, "mma"), (2, "store"), (3, "tick")])
            .expect("distinct ids");
        // Past 2³² ns, so that times unwrap.
        let t0 = 5_000_000_000u64;
        Launch {
            rings: Rings::new(WARPS, CHUNKS, reg, t0),
            warps: (0..WARPS)
                .map(|w| Warp {
                    t: t0 + 17 * w as u64,
                    k: 0,
                    staged: Vec::new(),
                })
                .collect(),
        }
    }

    /// Fills every ring (they are empty: the drain read them all).
    fn fill(&mut self) {
        for (s, w) in self.warps.iter_mut().enumerate() {
            for _ in 0..CHUNKS {
                let c = w.chunk(s as u32 % 132);
                assert!(self.rings.store(s as u32, &c), "ring {s} full");
            }
        }
    }

    /// One part: its passes and its cut, timed as `(rebuild, cut)`.
    fn part(&mut self) -> (Duration, Duration) {
        let mut rebuild = Duration::ZERO;
        for _ in 0..FILLS {
            self.fill();
            let t = Instant::now();
            black_box(self.rings.poll());
            rebuild += t.elapsed();
        }
        let t = Instant::now();
        let part = self.rings.cut();
        let cut = t.elapsed();
        let part = part.expect("events");
        assert!(part.event_count() > 256 << 10);
        (rebuild, cut)
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("drain");
    g.throughput(Throughput::Elements(ENTRIES));
    // An iteration takes some 20 ms (and as long again to fill the rings, untimed).
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(8));
    let mut launch = Launch::new();
    g.bench_function("rebuild", |b| {
        b.iter_custom(|n| (0..n).map(|_| launch.part().0).sum())
    });
    g.bench_function("cut", |b| {
        b.iter_custom(|n| (0..n).map(|_| launch.part().1).sum())
    });
    g.bench_function("all", |b| {
        b.iter_custom(|n| (0..n).map(|_| launch.part()).map(|(r, c)| r + c).sum())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
