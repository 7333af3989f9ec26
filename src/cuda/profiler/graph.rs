//! CUDA graphs: profiled launches made while a stream is capturing become
//! kernel nodes that find their trace memory by themselves at each replay.
//!
//! When a stream captures, `gpu_profile!` cannot give the launch a region (the
//! graph will run many times, and no host code runs per replay). Instead the
//! first profiled launch of a capture puts a prologue kernel (`kernels/graph.cu`)
//! in front of it, and every profiled launch of the capture depends on that
//! prologue and gets a `tgpu::Trace` that points, through
//! [`format::TRACE_INDIRECT`], at a word the prologue writes: each replay's
//! prologue takes the next region of the graph's replay ring if the collector
//! has armed it, and tells each node where its buffer is in it (0: skipped).
//!
//! [`Profiler::graph`](super::Profiler::graph) adopts the captured graph: it
//! allocates the replay ring (its size is known only once the capture has
//! ended) and writes the graph's state. [`Profiler::launch_graph`](super::Profiler::launch_graph)
//! replays it: one `cuGraphLaunch`, one event, one job for the collector, which
//! brings the region back, makes one batch per node, and arms the region again.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaGraph, CudaStream, LaunchConfig};
use cudarc::driver::{DriverError, PushKernelArg};
use parking_lot::Mutex;

use crate::cuda::compile::{compile, KernelBuild};
use crate::cuda::device::allocate;
use crate::cuda::device::{Kind, Memory, Place, Shape, REPLAY_HEADER};
use crate::cuda::device::{Region, ALIGN};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{Node, ReplayCount};
use crate::format::{self, BufferHeader, KernelArg};

use super::unrecorded::Unrecorded;

/// Profiled kernel nodes one graph may hold.
pub const MAX_GRAPH_NODES: usize = 1024;
/// Captured graphs (with profiled nodes) a profiler holds state for at once:
/// each is freed when its [`ProfiledGraph`] is dropped and its last replay
/// has been brought back.
pub const MAX_GRAPHS: usize = 64;
/// A graph's state on the device, as `kernels/graph.cu` lays it out.
const STATE_BYTES: usize = 64 + 16 * MAX_GRAPH_NODES;
const STATE_RING: usize = 8;
const STATE_CURRENT: usize = 64 + 8 * MAX_GRAPH_NODES;

const PROLOGUE_SOURCE: &str = include_str!("../../../kernels/graph.cu");

/// A capture in progress: its prologue and the profiled nodes so far.
struct Plan {
    slot: usize,
    prologue: usize,
    /// The stream the prologue was captured on: its later launches follow the
    /// prologue already, in stream order.
    stream: usize,
    nodes: Vec<Node>,
    /// Bytes of a replay region so far.
    bytes: usize,
}

struct Table {
    free: Vec<usize>,
    /// By the `CUgraph` being captured.
    capturing: HashMap<usize, Plan>,
}

/// The graph states of one profiler, and its prologue kernel.
pub(crate) struct Graphs {
    ctx: Arc<CudaContext>,
    /// With a mirror, into which the collector fetches each replayed graph's
    /// counter (its state's first word).
    states: Arc<Memory>,
    prologue: CudaFunction,
    table: Mutex<Table>,
}

impl Graphs {
    /// Compiles the prologue and allocates the states (before any capture:
    /// neither is allowed while the application's thread captures).
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        lineinfo: bool,
    ) -> Result<Arc<Graphs>, ProfilerError> {
        let ptx = compile(
            PROLOGUE_SOURCE,
            &KernelBuild::new("graph.cu", "compute_75")
                .define(format!("TGPU_MAX_NODES={MAX_GRAPH_NODES}"))
                .lineinfo(lineinfo),
        )?;
        let module = ctx.load_module(ptx)?;
        let prologue = module.load_function("tgpu_graph_prologue")?;
        let states = Arc::new(allocate(
            ctx,
            Kind::Arena,
            MAX_GRAPHS * STATE_BYTES,
            None,
            None,
        )?);
        Ok(Arc::new(Graphs {
            ctx: ctx.clone(),
            states,
            prologue,
            table: Mutex::new(Table {
                free: (0..MAX_GRAPHS).rev().collect(),
                capturing: HashMap::new(),
            }),
        }))
    }

    fn state(&self, slot: usize) -> u64 {
        self.states.dptr + (slot * STATE_BYTES) as u64
    }

    /// A profiled launch on a capturing `stream`: the kernel argument that
    /// makes it a node of the capture's plan (putting the prologue in front of
    /// the capture's first), given to `launch`.
    pub(crate) fn launch_captured<T, E>(
        &self,
        stream: &CudaStream,
        kernel: &str,
        shape: &Shape,
        header: BufferHeader,
        launch: impl FnOnce(KernelArg) -> Result<T, E>,
    ) -> Result<T, ProfilerError>
    where
        E: Into<ProfilerError>,
    {
        let raw = stream.cu_stream();
        let (graph, _) = capture_info(raw)?;
        let mut table = self.table.lock();
        let plan = match table.capturing.remove(&graph) {
            // On the prologue's stream, stream order already puts it first, and
            // an edge of its own would cost every node of every replay: a graph
            // that is one chain replays faster than one with extra edges (H200:
            // +0.19 µs per node with them).
            Some(p) if p.stream == raw as usize => p,
            Some(p) => {
                let mut node = p.prologue as sys::CUgraphNode;
                // SAFETY: a node of the graph this stream captures into.
                unsafe {
                    let add = sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES;
                    sys::cuStreamUpdateCaptureDependencies_v2(
                        raw,
                        &mut node,
                        std::ptr::null(),
                        1,
                        add as u32,
                    )
                    .result()?;
                }
                p
            }
            None => {
                let slot = table.free.pop().ok_or_else(|| {
                    ProfilerError::Invalid(format!(
                        "{kernel}: {MAX_GRAPHS} captured graphs hold profiler state; \
                         adopt each with Profiler::graph, or drop the ProfiledGraphs not in use"
                    ))
                })?;
                let state = self.state(slot);
                let cfg = LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the prologue takes the state's device address.
                let launched = unsafe {
                    stream
                        .launch_builder(&self.prologue)
                        .arg(&state)
                        .launch(cfg)
                };
                if let Err(e) = launched {
                    table.free.push(slot);
                    return Err(e.into());
                }
                let (_, deps) = capture_info(raw)?;
                Plan {
                    slot,
                    prologue: deps,
                    stream: raw as usize,
                    nodes: Vec::new(),
                    bytes: REPLAY_HEADER,
                }
            }
        };
        let index = plan.nodes.len();
        let mut plan = plan;
        if index >= MAX_GRAPH_NODES {
            table.capturing.insert(graph, plan);
            return Err(ProfilerError::Invalid(format!(
                "{kernel}: a graph holds at most {MAX_GRAPH_NODES} profiled kernel nodes"
            )));
        }
        let arg = KernelArg {
            base: self.state(plan.slot) + (STATE_CURRENT + 8 * index) as u64,
            capacity: header.slot_capacity | format::TRACE_INDIRECT,
            slot_count: shape.slots,
            sampling: header.sampling,
        };
        let result = launch(arg);
        if result.is_ok() {
            plan.nodes.push(Node {
                kernel: kernel.into(),
                header,
                offset: plan.bytes,
                len: shape.bytes,
            });
            plan.bytes += shape.bytes.next_multiple_of(ALIGN);
        }
        table.capturing.insert(graph, plan);
        result.map_err(Into::into)
    }

    /// Adopts a captured graph: its replay ring (`regions` regions, rounded up
    /// to a power of two) and its state.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        graph: CudaGraph,
        regions: usize,
    ) -> Result<ProfiledGraph, ProfilerError> {
        let plan = self
            .table
            .lock()
            .capturing
            .remove(&(graph.cu_graph() as usize));
        let Some(plan) = plan else {
            return Ok(ProfiledGraph {
                graph,
                ready: None,
                unrecorded: None,
            });
        };
        let k = regions.max(1).next_power_of_two();
        let region = plan.bytes.next_multiple_of(ALIGN);
        let (graphs, slot) = (self.clone(), plan.slot);
        let give_back = Box::new(move || graphs.table.lock().free.push(slot));
        let ring = match allocate(
            &self.ctx,
            Kind::Replays,
            k * region,
            Some((k, region)),
            Some(give_back),
        ) {
            Ok(r) => r,
            Err(e) => {
                // The closure that gives the slot back was dropped uncalled.
                self.table.lock().free.push(slot);
                return Err(e.into());
            }
        };
        // The state: counter 0, the ring, the region size, the mask, the nodes
        // and their offsets (the current words are the prologue's).
        let mut state = vec![0u64; 8 + plan.nodes.len()];
        state[STATE_RING / 8] = ring.dptr;
        state[2] = region as u64;
        state[3] = k as u64 - 1;
        state[4] = plan.nodes.len() as u64;
        for (i, n) in plan.nodes.iter().enumerate() {
            state[8 + i] = n.device_offset() as u64;
        }
        let bytes: Vec<u8> = state.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.ctx.bind_to_thread()?;
        // SAFETY: the slot's state, not in use by any replay yet.
        unsafe { result::memcpy_htod_sync(self.state(slot), &bytes)? };
        let counter = Place {
            memory: self.states.clone(),
            region: Region {
                offset: slot * STATE_BYTES,
                len: 8,
                seq: 0,
            },
        };
        let unrecorded = Unrecorded::build(
            &self.ctx,
            graph.cu_graph(),
            self.prologue.cu_function(),
            plan.nodes.len(),
        )?;
        Ok(ProfiledGraph {
            graph,
            unrecorded,
            ready: Some(Ready {
                nodes: plan.nodes.into(),
                ring: Arc::new(ring),
                region,
                mask: k as u64 - 1,
                order: Mutex::new(()),
                count: Arc::new(ReplayCount::new(counter)),
            }),
        })
    }
}

/// The capture `stream` is in: its graph, and the node its next launch will
/// depend on (the last one captured; after a launch, that launch's node).
fn capture_info(stream: sys::CUstream) -> Result<(usize, usize), DriverError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let mut graph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: valid out-pointers; the stream is live and its context bound.
    unsafe {
        let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut edges,
            &mut n,
        )
        .result()?;
    }
    let last = if n > 0 && !deps.is_null() {
        // SAFETY: `n` nodes, valid until the next capture call on this stream.
        unsafe { *deps.add(n - 1) as usize }
    } else {
        0
    };
    Ok((graph as usize, last))
}

/// A replayable graph state, once adopted.
pub(crate) struct Ready {
    pub(crate) nodes: Arc<[Node]>,
    pub(crate) ring: Arc<Memory>,
    pub(crate) region: usize,
    pub(crate) mask: u64,
    /// Held across a replay's numbering and launch, so that the device sees
    /// replays in the order they are numbered.
    pub(crate) order: Mutex<()>,
    /// The replays as the host and the device count them (the host's count
    /// is the next replay's number).
    pub(crate) count: Arc<ReplayCount>,
}

/// A captured CUDA graph whose profiled kernel nodes are recorded at each
/// replay made by [`Profiler::launch_graph`](super::Profiler::launch_graph).
/// Made by [`Profiler::graph`](super::Profiler::graph).
pub struct ProfiledGraph {
    graph: CudaGraph,
    pub(crate) ready: Option<Ready>,
    /// The graph without the recorder, where every profiled node is a `TracedKernel`'s.
    pub(crate) unrecorded: Option<Unrecorded>,
}

impl std::fmt::Debug for ProfiledGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfiledGraph")
            .field("profiled_nodes", &self.profiled_nodes())
            .finish_non_exhaustive()
    }
}

impl ProfiledGraph {
    /// The graph.
    pub fn graph(&self) -> &CudaGraph {
        &self.graph
    }

    /// How many of its kernel nodes are profiled.
    pub fn profiled_nodes(&self) -> usize {
        self.ready.as_ref().map_or(0, |r| r.nodes.len())
    }

    /// Whether it can replay without the recorder
    /// ([`Profiler::launch_graph_unrecorded`](super::Profiler::launch_graph_unrecorded)): every
    /// profiled node was launched through a [`TracedKernel`](crate::cuda::TracedKernel) still
    /// alive when the graph was adopted (or none is profiled).
    pub fn replays_unrecorded(&self) -> bool {
        self.ready.is_none() || self.unrecorded.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_layout_is_the_prologues() {
        // kernels/graph.cu indexes u64 words: offsets at 8 + i, current at 8 + MAX + i.
        assert_eq!(STATE_CURRENT / 8, 8 + MAX_GRAPH_NODES);
        assert_eq!(STATE_RING, 8);
        assert_eq!(STATE_BYTES, STATE_CURRENT + 8 * MAX_GRAPH_NODES);
        assert!(PROLOGUE_SOURCE.contains("state[8 + TGPU_MAX_NODES + i]"));
        assert!(PROLOGUE_SOURCE.contains("state[8 + i]"));
    }

    #[test]
    fn the_prologue_compiles_with_nvrtc() {
        if let Err(e) = crate::cuda::compile::ensure_nvrtc() {
            eprintln!("skipped (needs NVRTC, installed by scripts/test-env.sh): {e}");
            return;
        }
        let ptx = compile(
            PROLOGUE_SOURCE,
            &KernelBuild::new("graph.cu", "compute_75")
                .define(format!("TGPU_MAX_NODES={MAX_GRAPH_NODES}")),
        )
        .unwrap();
        let text = ptx.to_src();
        assert!(text.contains(".entry tgpu_graph_prologue"), "{text}");
        // No atomics: replays of one graph never overlap.
        assert!(!text.contains("atom."), "{text}");
    }
}
