//! Sampling through the simulated device: a launch sampled by a warp mask, a
//! block stride, or both has slots only for the warps it names, in the order
//! the device numbers them, and each comes back as its own block and warp with
//! every event it made, from fixed slots and from rings alike; of launches
//! sampled one in n, the others run with a null trace and are counted, never
//! delivered.
use super::drains::{events_of, sink_dispatch, stream_sampled, write_ranges};
use super::graphs::SimGraph;
use super::*;
use crate::cuda::Sampler;
use crate::format::Sampling;
use cudarc::driver::LaunchConfig;

const BLOCKS: u32 = 12;
const WARPS: u32 = 8;

/// What warp `warp` of block `block` writes as its payloads: who it is.
fn who(block: u32, warp: u32) -> u32 {
    block * WARPS + warp
}

/// A kernel of 12 blocks × 8 warps, sampled by `sampling`: each warp it names
/// makes two ranges (alternately as v1 records and as v2 entries) whose payload
/// says who it is; the others have no slot.
fn sampled_kernel(sampling: Sampling, t0: u64) -> BufferBuilder {
    let mut b = BufferBuilder::new([BLOCKS, 1, 1], [WARPS * 32, 1, 1], 8);
    b.sampling(sampling);
    for block in 0..BLOCKS {
        for warp in 0..WARPS {
            let t = t0 + u64::from(who(block, warp)) * 1_000;
            if sampling.slot_of(block, warp, WARPS).is_none() {
                assert!(b.warp(block, warp).is_none(), "{block}/{warp} has a slot");
            } else if (block + warp) % 2 == 0 {
                b.warp(block, warp)
                    .unwrap()
                    .range(1, t, t + 100, who(block, warp))
                    .range(2, t + 100, t + 300, who(block, warp));
            } else {
                b.warp_v2(block, warp)
                    .unwrap()
                    .begin(1, t)
                    .switch(2, t + 100)
                    .payload(who(block, warp))
                    .end(2, t + 300)
                    .payload(who(block, warp));
            }
        }
    }
    b
}

/// The (block, warp) of every delivered slot, each checked to hold its two
/// ranges whole; and the sampling each batch says it was made with.
fn delivered(batches: &[Arc<Batch>], t0: u64) -> (Vec<(u32, u32)>, Vec<Sampling>) {
    let mut warps = Vec::new();
    for b in batches {
        for s in b.buffer.view().slots() {
            let (block, warp) = (s.header.block_linear, s.header.warp);
            let t = t0 + u64::from(who(block, warp)) * 1_000;
            let got: Vec<_> = s
                .events()
                .map(|e| (e.id, e.start_ns, e.end_ns, e.payload))
                .collect();
            let me = who(block, warp);
            assert_eq!(got, [(1, t, t + 100, me), (2, t + 100, t + 300, me)]);
            assert_eq!(s.events_lost(), 0);
            warps.push((block, warp));
        }
    }
    let samplings = batches.iter().map(|b| b.buffer.header().sampling).collect();
    (warps, samplings)
}

#[test]
fn a_sampled_launch_brings_back_exactly_its_sampled_warps() {
    let all = Sampling::default();
    let cases = [
        all,
        // One warp per warpgroup.
        all.warps(0b0001_0001),
        // The producer only (the last warp).
        all.warps(1 << (WARPS - 1)),
        all.blocks(4, 0),
        all.blocks(5, 3),
        all.warps(0b0110).blocks(3, 1),
        // Its first block past the grid: no slot at all.
        all.blocks(2, BLOCKS),
    ];
    for (k, sampling) in cases.into_iter().enumerate() {
        let rig = Rig::new(0, None);
        let (sink, dispatch) = sink_dispatch();
        let t0 = 1_000_000 + k as u64 * 1_000_000;
        tracing::dispatcher::with_default(&dispatch, || {
            let b = sampled_kernel(sampling, t0);
            let slots = b.header().slot_count;
            assert_eq!(
                u64::from(slots),
                sampling.slots(u64::from(BLOCKS), WARPS),
                "{sampling:?}"
            );
            let event = rig.gpu.event(true);
            rig.launch_of(b, 7, t0, None, Some(event), false).unwrap();
            rig.collector.flush().unwrap();
        });
        let batches = sink.0.lock().clone();
        assert_eq!(batches.len(), 1, "{sampling:?}");
        let (warps, samplings) = delivered(&batches, t0);
        let expected: Vec<(u32, u32)> = (0..BLOCKS)
            .flat_map(|b| (0..WARPS).map(move |w| (b, w)))
            .filter(|&(b, w)| {
                b >= sampling.block_offset
                    && (b - sampling.block_offset).is_multiple_of(sampling.block_stride.max(1))
                    && (sampling.warp_mask == 0 || sampling.warp_mask >> w & 1 == 1)
            })
            .collect();
        assert_eq!(warps, expected, "{sampling:?}");
        assert_eq!(samplings, [sampling]);
        let st = rig.shared.stats();
        assert_eq!((st.delivered, st.events_lost), (1, 0));
        assert_eq!(st.events, 2 * expected.len() as u64);
        assert_accounted(&st);
    }
}

/// The warps `sampling` names in the 12 × 8 grid, block by block.
fn named(sampling: Sampling) -> Vec<(u32, u32)> {
    (0..BLOCKS)
        .flat_map(|b| (0..WARPS).map(move |w| (b, w)))
        .filter(|&(b, w)| sampling.slot_of(b, w, WARPS).is_some())
        .collect()
}

#[test]
fn a_graph_node_samples_its_blocks_and_warps_at_every_replay() {
    // The capture keeps the blocks and warps and drops one in n (which chose
    // whether the node records at all).
    let sampling = Sampling::default().warps(0b0110).blocks(3, 1);
    assert_eq!(named(sampling).len(), 8);
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    let graph = SimGraph::of(&rig.gpu, 2, 2, move |t0| sampled_kernel(sampling, t0));
    let t0 = [1_000_000, 3_000_000];
    tracing::dispatcher::with_default(&dispatch, || {
        for t in t0 {
            let (taken, _) = graph.replay(&rig, 5, t, true);
            assert!(taken);
            rig.collector.flush().unwrap();
        }
    });
    let batches = sink.0.lock().clone();
    assert_eq!(batches.len(), 4, "2 nodes × 2 replays");
    for (replay, pair) in batches.chunks(2).enumerate() {
        for node in pair {
            let (warps, samplings) = delivered(std::slice::from_ref(node), t0[replay]);
            assert_eq!(warps, named(sampling));
            assert_eq!(samplings, [sampling]);
        }
    }
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.events_lost), (4, 0));
    assert_accounted(&st);
}

#[test]
fn one_launch_in_n_records_and_the_others_are_counted() {
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    let sampling = Sampling::default().warps(0b1000_0001).launches(3);
    let sampler = Sampler::new(sampling).launch_if(|_, cfg| cfg.grid_dim.0 == BLOCKS);
    let cfg = |blocks| LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    let t0 = 1_000_000;
    tracing::dispatcher::with_default(&dispatch, || {
        // As Profiler::launch decides: a launch left out runs with a null trace.
        for (i, blocks) in [BLOCKS, BLOCKS, 1, BLOCKS, BLOCKS, BLOCKS, BLOCKS, 1]
            .into_iter()
            .enumerate()
        {
            if !sampler.takes("sim_kernel", &cfg(blocks)) {
                rig.shared.count_unsampled();
                continue;
            }
            let event = rig.gpu.event(true);
            let t = t0 + i as u64 * 1_000_000;
            rig.launch_of(sampled_kernel(sampling, t), 7, t, None, Some(event), false)
                .unwrap();
        }
        rig.collector.flush().unwrap();
    });
    let batches = sink.0.lock().clone();
    // Of the six launches of 12 blocks, the 1st and the 4th.
    let starts: Vec<u64> = batches.iter().map(|b| b.launch.host_launch_ns).collect();
    assert_eq!(starts, [t0, t0 + 4_000_000]);
    for b in &batches {
        let (warps, samplings) = delivered(std::slice::from_ref(b), b.launch.host_launch_ns);
        assert_eq!(warps.len(), 2 * BLOCKS as usize);
        assert_eq!(samplings, [sampling]);
    }
    let st = rig.shared.stats();
    assert_eq!((st.launches, st.delivered, st.unsampled), (8, 2, 6));
    assert_accounted(&st);
}

#[test]
fn a_sampled_streamed_launch_drains_exactly_its_sampled_warps() {
    // 6 blocks of 2 warps; warp 1 of blocks 1, 3 and 5: three rings.
    let sampling = Sampling::default().warps(0b10).blocks(2, 1);
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    let (warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_sampled(&rig, 6, 2, true, sampling));
    assert_eq!(warps.len(), 3);
    let t0 = 1 << 40;
    write_ranges(warps, t0, Duration::from_millis(2));
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let batches = sink.0.lock().clone();
    assert!(batches.last().unwrap().launch.part.unwrap().last);
    assert!(batches
        .iter()
        .all(|b| b.buffer.header().sampling == sampling));
    let mut placed: Vec<(u32, u32)> = batches
        .iter()
        .flat_map(|b| {
            let v: Vec<_> = b
                .buffer
                .view()
                .slots()
                .map(|s| (s.header.block_linear, s.header.warp))
                .collect();
            v
        })
        .collect();
    placed.sort_unstable();
    placed.dedup();
    assert_eq!(placed, [(1, 1), (3, 1), (5, 1)]);
    for (slot, (block, warp)) in placed.into_iter().enumerate() {
        let got = events_of(&batches, block, warp);
        let t = t0 + slot as u64 * 7;
        assert_eq!(got.len(), 120, "block {block} warp {warp}");
        assert_eq!((got[0].start_ns, got[0].end_ns), (t, t + 30));
    }
    let st = rig.shared.stats();
    assert_eq!((st.events, st.events_lost), (360, 0));
}
