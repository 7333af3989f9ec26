//! Decode throughput: validation of a whole buffer (with and without a registry)
//! and iteration over every event, for the same events written as v1 records and as
//! v2 entries (`_v2`). Run: `cargo bench --bench decode`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::registry::EventRegistry;

/// A GEMM-like capture: 132 blocks × 4 warps, 4096 events per warp (2.2 M events),
/// as v1 records or (`v2`) as v2 entries: a begin, an end and a payload per range, an
/// instant and a payload per instant (2.75 entries per event).
fn buffer(v2: bool) -> (Vec<u8>, u64) {
    const PER_WARP: u32 = 4096;
    let capacity = if v2 { 2 * PER_WARP } else { PER_WARP };
    let mut b = BufferBuilder::new([132, 1, 1], [128, 1, 1], capacity);
    for block in 0..132 {
        for warp in 0..4 {
            let mut t = 1_000_000_000u64 + block as u64 * 17;
            if v2 {
                let w = b.warp_v2(block, warp).expect("slot exists");
                for k in 0..PER_WARP {
                    if k % 4 == 3 {
                        w.instant(3, t + 5).payload(k);
                        t += 5;
                    } else {
                        let id = (k % 3) as u16;
                        w.begin(id, t + 2).end(id, t + 300).payload(k);
                        t += 300;
                    }
                }
                continue;
            }
            let w = b.warp(block, warp).expect("slot exists");
            for k in 0..PER_WARP {
                // Alternate a range and an instant, ids 0..4, as a k-loop would.
                if k % 4 == 3 {
                    w.instant(3, t + 5, k);
                    t += 5;
                } else {
                    w.range((k % 3) as u16, t + 2, t + 300, k);
                    t += 300;
                }
            }
        }
    }
    (b.finish(), 132 * 4 * PER_WARP as u64)
}

fn bench(c: &mut Criterion) {
    let reg = EventRegistry::from_pairs([(0, "load"), (1, "mma"), (2, "store"), (3, "tick")])
        .expect("distinct ids");
    let mut g = c.benchmark_group("decode");
    for (suffix, v2) in [("", false), ("_v2", true)] {
        let (bytes, events) = buffer(v2);
        let cap = Buffer::decode(&bytes, None).unwrap();
        assert_eq!(cap.event_count(), events);
        g.throughput(Throughput::Elements(events));
        g.bench_function(format!("validate{suffix}"), |b| {
            b.iter(|| {
                Buffer::decode(black_box(&bytes), None)
                    .unwrap()
                    .event_count()
            })
        });
        g.bench_function(format!("validate_with_registry{suffix}"), |b| {
            b.iter(|| {
                Buffer::decode(black_box(&bytes), Some(&reg))
                    .unwrap()
                    .event_count()
            })
        });
        g.bench_function(format!("iterate_events{suffix}"), |b| {
            b.iter(|| {
                let mut sum = 0u64;
                for s in cap.slots() {
                    for e in s.events() {
                        sum = sum.wrapping_add(e.start_ns ^ e.end_ns ^ e.payload as u64);
                    }
                }
                sum
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
