//! Graph replays through the simulated device: the prologue's work played by
//! the test, one batch per node, a full replay ring, a region a later replay
//! took, and replays the host did not make (or made and the device did not run).
use super::*;
use crate::cuda::job::{InFlight, OutOfStep, ReplayCount};

/// A graph of `nodes` simulated kernels with its replay ring of `k` regions,
/// and the prologue the device runs at each replay.
pub(super) struct SimGraph {
    nodes: Arc<[Node]>,
    /// What each node records at a replay at device time `t0`.
    make: Box<dyn Fn(u64) -> BufferBuilder>,
    ring: Arc<Memory>,
    region: usize,
    k: u64,
    /// The graph state's counter, which the prologue raises.
    count: Arc<ReplayCount>,
}

impl SimGraph {
    fn new(gpu: &Gpu, nodes: usize, k: u64) -> SimGraph {
        Self::of(gpu, nodes, k, |t0| kernel(0, t0))
    }

    /// A graph whose nodes record what `make` builds (its header, sampling
    /// included, is each node's, as the capture made it).
    pub(super) fn of(
        gpu: &Gpu,
        nodes: usize,
        k: u64,
        make: impl Fn(u64) -> BufferBuilder + 'static,
    ) -> SimGraph {
        let mut offset = REPLAY_HEADER;
        let nodes: Vec<Node> = (0..nodes)
            .map(|i| {
                let b = make(0);
                let len = b.finish().len();
                let n = Node {
                    kernel: format!("node{i}").into(),
                    header: *b.header(),
                    offset,
                    len,
                };
                offset += len.next_multiple_of(ALIGN);
                n
            })
            .collect();
        let region = offset.next_multiple_of(ALIGN);
        let ring = gpu.allocate(Kind::Replays, region * k as usize);
        for j in 0..k as usize {
            gpu.write(&ring, j * region, &ARMED.to_le_bytes());
        }
        let counter = Place {
            memory: gpu.allocate(Kind::Arena, 8),
            region: Region {
                offset: 0,
                len: 8,
                seq: 0,
            },
        };
        SimGraph {
            nodes: nodes.into(),
            make: Box::new(make),
            ring,
            region,
            k,
            count: Arc::new(ReplayCount::new(counter)),
        }
    }

    /// The prologue, as the device runs it at a replay: the replay's number
    /// from the counter, and region (number mod k) if it is armed, with the
    /// nodes' records at device time `t0`. Returns whether it took a region.
    fn prologue(&self, rig: &Rig, t0: u64) -> bool {
        let counter = &self.count.counter;
        let bytes = rig.gpu.read(&counter.memory, 0, 8);
        let number = u64::from_le_bytes(bytes.try_into().unwrap());
        rig.gpu
            .write(&counter.memory, 0, &(number + 1).to_le_bytes());
        let offset = (number % self.k) as usize * self.region;
        let head = rig.gpu.read(&self.ring, offset, 4);
        if u32::from_le_bytes(head.try_into().unwrap()) != ARMED {
            return false;
        }
        let mut h = TAKEN.to_le_bytes().to_vec();
        h.extend([0; 4]);
        h.extend(number.to_le_bytes());
        rig.gpu.write(&self.ring, offset, &h);
        for node in self.nodes.iter() {
            // The device writes the slots alone, from 64 bytes past where the
            // prologue says the node's buffer is (`Trace::base`); the collector
            // writes the header.
            let b = (self.make)(t0).finish();
            let slots = &b[node.header.size()..];
            let base = offset + node.device_offset();
            rig.gpu
                .write(&self.ring, base + crate::format::BUFFER_HEADER_SIZE, slots);
        }
        true
    }

    /// One replay on `stream`, as `Profiler::launch_graph` and the prologue
    /// make it; the nodes record at device time `t0`. Returns whether the
    /// prologue took a region, and the replay's event.
    pub(super) fn replay(&self, rig: &Rig, stream: u64, t0: u64, fired: bool) -> (bool, u64) {
        self.replay_of(rig, stream, t0, fired, true)
    }

    /// The same, but the device runs the prologue only if `prologue` (an
    /// executable graph updated in place to other nodes runs another one).
    fn replay_of(
        &self,
        rig: &Rig,
        stream: u64,
        t0: u64,
        fired: bool,
        prologue: bool,
    ) -> (bool, u64) {
        let replay = self.count.launched();
        self.count.set_launched(replay + 1);
        let n = self.nodes.len() as u64;
        let first_id = crate::cuda::profiler::reserve_launch_ids(n);
        let span = tracing::info_span!("gpu.graph", gpu.replay = replay);
        rig.shared.count_replay(n);
        let offset = (replay % self.k) as usize * self.region;
        let taken = prologue && self.prologue(rig, t0);
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
                count: self.count.clone(),
                in_flight: InFlight::new(&self.count),
            },
        });
        (taken, event)
    }
}

#[test]
fn graph_replays_make_one_batch_per_node_and_skip_when_the_ring_is_full() {
    let (rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let g = SimGraph::new(&r.gpu, 3, 2);
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
    // Three in flight, as many as the ring has regions or more: `launch_graph`
    // would replay the graph without the recorder.
    assert_eq!(g.count.in_flight(), 3);
    for e in held.drain(..) {
        r.gpu.fire(e);
    }
    r.collector.flush().unwrap();
    assert_eq!(g.count.in_flight(), 0);
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
    let g = SimGraph::new(&r.gpu, 2, 1);
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

#[test]
fn a_replay_made_outside_launch_graph_puts_the_graph_out_of_step() {
    let (_rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let g = SimGraph::new(&r.gpu, 2, 4);
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..2 {
            g.replay(&r, 5, 1_000_000 + i * 10_000, true);
        }
        r.collector.flush().unwrap();
        // `cuGraphLaunch` on the executable graph: the device's count moves on
        // alone, and replay 2's prologue takes replay 3's region.
        assert!(g.prologue(&r, 1_020_000));
        let (taken, _) = g.replay(&r, 5, 1_030_000, true);
        assert!(taken);
    });
    let err = r.collector.flush().unwrap_err();
    let seen = OutOfStep {
        replay: 2,
        device: 4,
        launched: 3,
    };
    assert!(
        matches!(&err, ProfilerError::GraphOutOfStep { graph, replay: 2, device: 4, launched: 3 } if graph == "step"),
        "{err}"
    );
    assert!(err.to_string().contains("launch_graph"), "{err}");
    // launch_graph refuses the graph from now on; the error was reported once.
    assert_eq!(g.count.out_of_step(), Some(seen));
    r.collector.flush().unwrap();
    // Replays 0 and 1 were delivered; replay 2's region held the other
    // replay's records, under its number: skipped, as every replay checked
    // out of step.
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.skipped, st.failed), (4, 2, 0));
    assert_accounted(&st);
}

#[test]
fn a_graph_whose_replays_no_longer_raise_its_count_is_out_of_step() {
    let (_rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let g = SimGraph::new(&r.gpu, 2, 4);
    tracing::dispatcher::with_default(&dispatch, || {
        g.replay(&r, 5, 1_000_000, true);
        // Updated in place to another capture's nodes: another prologue runs.
        let (taken, _) = g.replay_of(&r, 5, 1_010_000, true, false);
        assert!(!taken);
    });
    let err = r.collector.flush().unwrap_err();
    assert!(
        matches!(
            err,
            ProfilerError::GraphOutOfStep {
                replay: 1,
                device: 1,
                launched: 2,
                ..
            }
        ),
        "{err}"
    );
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.skipped, st.failed), (2, 2, 0));
    assert_accounted(&st);
}

#[test]
fn replays_in_flight_while_earlier_ones_are_checked_are_in_step() {
    let (_rec, dispatch) = recorder_dispatch();
    let r = Rig::new(0, None);
    let g = SimGraph::new(&r.gpu, 1, 8);
    let mut events = Vec::new();
    tracing::dispatcher::with_default(&dispatch, || {
        // The host has made replays the device has not run yet...
        for i in 0..6 {
            let (_, e) = g.replay(&r, 5, 1_000_000 + i * 10_000, false);
            events.push(e);
        }
        // ...and the earliest are checked first.
        for e in events {
            r.gpu.fire(e);
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    r.collector.flush().unwrap();
    assert_eq!(g.count.out_of_step(), None);
    let st = r.shared.stats();
    assert_eq!((st.delivered, st.skipped, st.failed), (6, 0, 0));
}
