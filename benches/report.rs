//! Report throughput on a GEMM-like capture: the statistics
//! ([`Timeline::add_buffer`] on a statistics-only timeline, then
//! [`Timeline::report`]) and the SVG timeline (a timeline made
//! [`Timeline::with_svg`], which bins the launch as it is added, then
//! [`Timeline::to_svg`]), beside decoding the same buffer, so the ratios say
//! what a report costs next to reading the capture at all.
//! Run: `cargo bench --bench report`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::report::{SvgOptions, Timeline};

/// 132 blocks (one per SM) × (1 producer + 2 consumer warps), 128 k-tiles:
/// the producer records a load per k-tile, each consumer a wait and an mma.
fn buffer() -> (Vec<u8>, u64) {
    const KTILES: u64 = 128;
    let mut b = BufferBuilder::new([132, 1, 1], [96, 1, 1], 2 * KTILES as u32 + 1);
    let mut events = 0;
    for block in 0..132u32 {
        let t0 = 1_000_000_000u64 + u64::from(block) * 37;
        let p = b.warp(block, 0).expect("slot").sm(block, block);
        for k in 0..KTILES {
            p.range(1, t0 + k * 1_000, t0 + k * 1_000 + 640, k as u32);
            events += 1;
        }
        for w in 1..3 {
            let c = b.warp(block, w).expect("slot").sm(block, block);
            for k in 0..KTILES {
                let s = t0 + k * 1_000 + 640 + u64::from(w) * 16;
                c.range(2, s, s + 90, k as u32)
                    .range(3, s + 90, s + 950, k as u32);
                events += 2;
            }
            c.range(4, t0 + KTILES * 1_000 + 700, t0 + KTILES * 1_000 + 2_700, 0);
            events += 1;
        }
    }
    (b.finish(), events)
}

fn bench(c: &mut Criterion) {
    let (bytes, events) = buffer();
    let capture = Buffer::decode(&bytes, None).expect("decodes");
    let mut timeline = Timeline::new();
    timeline.set_sm_count(132);
    timeline.add_buffer(&capture);
    assert_eq!(timeline.event_count() as u64, events);

    let mut g = c.benchmark_group("report");
    g.throughput(Throughput::Elements(events));
    g.bench_function("decode", |b| {
        b.iter(|| {
            Buffer::decode(black_box(&bytes), None)
                .unwrap()
                .event_count()
        })
    });
    g.bench_function("statistics", |b| {
        b.iter(|| {
            let mut t = Timeline::new();
            t.set_sm_count(132);
            t.add_buffer(black_box(&capture));
            t.report().events
        })
    });
    g.bench_function("svg", |b| {
        b.iter(|| {
            let mut t = Timeline::with_svg(SvgOptions::default());
            t.set_sm_count(132);
            t.add_buffer(black_box(&capture));
            t.to_svg().map(|svg| svg.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
