//! Decode throughput: validation of a whole buffer (with and without a registry)
//! and iteration over every event. Run: `cargo bench --bench decode`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::registry::EventRegistry;

/// A GEMM-like capture: 132 blocks × 4 warps, 4096 events per warp (2.2 M events).
fn buffer() -> (Vec<u8>, u64) {
    const PER_WARP: u32 = 4096;
    let mut b = BufferBuilder::new([132, 1, 1], [128, 1, 1], PER_WARP);
    for block in 0..132 {
        for warp in 0..4 {
            let w = b.warp(block, warp).expect("slot exists");
            let mut t = 1_000_000_000u64 + block as u64 * 17;
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
    let (bytes, events) = buffer();
    let reg = EventRegistry::from_pairs([(0, "load"), (1, "mma"), (2, "store"), (3, "tick")])
        .expect("distinct ids");
    assert_eq!(Buffer::decode(&bytes, None).unwrap().event_count(), events);
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(events));
    g.bench_function("validate", |b| {
        b.iter(|| {
            Buffer::decode(black_box(&bytes), None)
                .unwrap()
                .event_count()
        })
    });
    g.bench_function("validate_with_registry", |b| {
        b.iter(|| {
            Buffer::decode(black_box(&bytes), Some(&reg))
                .unwrap()
                .event_count()
        })
    });
    let cap = Buffer::decode(&bytes, None).unwrap();
    g.bench_function("iterate_events", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for s in cap.slots() {
                for e in s.events() {
                    sum = sum.wrapping_add(e.start_ns ^ e.end_ns);
                }
            }
            sum
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
