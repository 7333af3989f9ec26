//! Graph replays through the simulated device: the prologue's work played by
//! the test, one batch per node, a full replay ring, and a region a later
//! replay took.
use super::*;

/// A graph of `nodes` simulated kernels with its replay ring of `k` regions,
/// and the prologue the device runs at each replay.
struct SimGraph {
    nodes: Arc<[Node]>,
    ring: Arc<Memory>,
    region: usize,
    k: u64,
    next: u64,
}

impl SimGraph {
    fn new(gpu: &Gpu, nodes: usize, k: u64) -> SimGraph {
        let mut offset = REPLAY_HEADER;
        let nodes: Vec<Node> = (0..nodes)
            .map(|i| {
                let b = kernel(0, 0);
                let len = b.finish().len();
                let n = Node {
                    kernel: format!("node{i}").into(),
                    header: *b.header(),
                    offset,
                    len,
                };
                offset += len.next_multiple_of(crate::cuda::ring::ALIGN);
                n
            })
            .collect();
        let region = offset.next_multiple_of(crate::cuda::ring::ALIGN);
        let ring = gpu.allocate(Kind::Replays, region * k as usize);
        for j in 0..k as usize {
            gpu.write(&ring, j * region, &ARMED.to_le_bytes());
        }
        SimGraph {
            nodes: nodes.into(),
            ring,
            region,
            k,
            next: 0,
        }
    }

    /// One replay on `stream`, as `Profiler::launch_graph` and the prologue
    /// make it; the nodes record at device time `t0`. Returns whether the
    /// prologue took a region, and the replay's event.
    fn replay(&mut self, rig: &Rig, stream: u64, t0: u64, fired: bool) -> (bool, u64) {
        let replay = self.next;
        self.next += 1;
        let n = self.nodes.len() as u64;
        let first_id = crate::cuda::profiler::reserve_launch_ids(n);
        let span = tracing::info_span!("gpu.graph", gpu.replay = replay);
        rig.shared.count_replay(n);
        let offset = (replay % self.k) as usize * self.region;
        // The prologue.
        let head = rig.gpu.read(&self.ring, offset, 4);
        let taken = u32::from_le_bytes(head.try_into().unwrap()) == ARMED;
        if taken {
            let mut h = TAKEN.to_le_bytes().to_vec();
            h.extend([0; 4]);
            h.extend(replay.to_le_bytes());
            rig.gpu.write(&self.ring, offset, &h);
            for node in self.nodes.iter() {
                let mut b = kernel(0, t0).finish();
                b[..crate::format::BUFFER_HEADER_SIZE].fill(0);
                rig.gpu.write(&self.ring, offset + node.offset, &b);
            }
        }
        let event = rig.gpu.event(fired);
        rig.collector.send(Job {
            launch: LaunchInfo {
                launch_id: first_id,
                kernel: "step".into(),
                host_launch_ns: t0,
                parent: span.id(),
                host_thread: "main".into(),
                ..Default::default()
            },
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
            span,
            mark: Mark {
                stream,
                event: Some(event),
                by_collector: false,
            },
            stream: None,
            work: Work::Replay {
                replay,
                place: Place {
                    memory: self.ring.clone(),
                    region: Region {
                        offset,
                        len: self.region,
                        seq: replay,
                    },
                },
                nodes: self.nodes.clone(),
            },
        });
        (taken, event)
    }
}

#[test]
fn graph_replays_make_one_batch_per_node_and_skip_when_the_ring_is_full() {
    let (rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let mut g = SimGraph::new(&r.gpu, 3, 2);
    let mut held = Vec::new();
    let mut taken = 0u64;
    tracing::dispatcher::with_default(&dispatch, || {
        // Two replays in flight fill the ring of two: the third is skipped.
        for i in 0..3 {
            let (t, e) = g.replay(&r, 5, 1_000_000 + i * 10_000, false);
            taken += t as u64;
            held.push(e);
        }
    });
    assert_eq!(taken, 2);
    for e in held.drain(..) {
        r.gpu.fire(e);
    }
    r.collector.flush().unwrap();
    // Brought back and armed again: the next replays record.
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 3..9 {
            let (t, _) = g.replay(&r, 5, 1_000_000 + i * 10_000, true);
            taken += t as u64;
            // Let the collector re-arm before the next replay.
            r.collector.flush().unwrap();
        }
    });
    let st = r.shared.stats();
    assert_eq!(taken, 8);
    assert_eq!((st.replays, st.launches), (9, 27));
    assert_eq!((st.delivered, st.skipped, st.failed), (24, 3, 0));
    assert_accounted(&st);
    let seen = rec.0.lock();
    // 4 device spans per node batch, under the replay's span.
    assert_eq!(seen.spans.len(), 24 * 4);
    assert!(seen
        .parents
        .iter()
        .all(|p| p.as_deref() == Some("gpu.graph")));
    // Node by node: kernel names and consecutive launch ids per replay.
    let kernels: std::collections::BTreeSet<&String> =
        seen.spans.iter().map(|s| &s["gpu.kernel"]).collect();
    assert_eq!(
        kernels.into_iter().cloned().collect::<Vec<_>>(),
        ["node0", "node1", "node2"]
    );
    let ids: std::collections::BTreeSet<&String> =
        seen.spans.iter().map(|s| &s["gpu.launch_id"]).collect();
    assert_eq!(ids.len(), 24);
}

#[test]
fn a_region_taken_by_a_later_replay_is_not_read_as_an_earlier_one() {
    let (_rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let mut g = SimGraph::new(&r.gpu, 2, 1);
    tracing::dispatcher::with_default(&dispatch, || {
        // Replay 0 takes the only region; replay 1 finds it in use.
        let (t0, e0) = g.replay(&r, 5, 1_000_000, false);
        let (t1, e1) = g.replay(&r, 5, 1_010_000, false);
        assert!(t0 && !t1);
        r.gpu.fire(e0);
        r.gpu.fire(e1);
    });
    r.collector.flush().unwrap();
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.skipped), (2, 2));
    assert_accounted(&st);
}
