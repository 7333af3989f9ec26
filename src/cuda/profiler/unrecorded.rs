//! A profiled graph built again without the recorder, for the replays that record
//! nothing ([`Profiler::launch_graph_unrecorded`](super::Profiler::launch_graph_unrecorded)).
//!
//! A profiled graph's kernel nodes run the recorder's build in every replay, and its
//! prologue runs too, even when the replay records nothing: on an H100 an LLM decode step
//! of 193 short kernels replayed 9.6 % slower with nothing recorded than the graph built
//! without the recorder, and replaying that graph instead for nine steps in ten brought
//! the whole to +1.5 % (docs/performance.md). So, where every profiled node was launched
//! through a [`TracedKernel`](crate::cuda::TracedKernel), the captured graph is cloned once
//! at adoption: each profiled node gets its kernel's production build and its arguments
//! less the trace, and the prologue goes. The kernels and their order are the user's own.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaFunction, DriverError};

use crate::cuda::traced::production_of;

/// The captured graph without the recorder, instantiated.
pub(crate) struct Unrecorded {
    ctx: Arc<CudaContext>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// The production builds its nodes launch: their modules live as long as it does.
    _builds: Vec<CudaFunction>,
}

// SAFETY: the handles are used only through the driver, which is thread-safe, with the
// context bound; nothing else aliases them.
unsafe impl Send for Unrecorded {}
unsafe impl Sync for Unrecorded {}

impl Unrecorded {
    /// Clones `captured`, whose `profiled` profiled nodes depend on the prologue kernel
    /// `prologue`, into a graph without the recorder; `None` if some profiled node's kernel
    /// is not a live `TracedKernel`'s recording build.
    pub(crate) fn build(
        ctx: &Arc<CudaContext>,
        captured: sys::CUgraph,
        prologue: sys::CUfunction,
        profiled: usize,
    ) -> Result<Option<Unrecorded>, DriverError> {
        ctx.bind_to_thread()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: `captured` is a live graph of this context; `graph` an out-pointer.
        unsafe { sys::cuGraphClone(&mut graph, captured).result()? };
        let mut this = Unrecorded {
            ctx: ctx.clone(),
            graph,
            exec: std::ptr::null_mut(),
            _builds: Vec::with_capacity(profiled),
        };
        let mut prologues = Vec::new();
        // The captured graph's nodes, read there: a node's arguments live in its own
        // storage, which setting its parameters replaces, so the clone's nodes are set from
        // the original's (set from their own, a node's arguments came back as zeros).
        for original in nodes(captured)? {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node of the captured graph; an out-pointer.
            unsafe { sys::cuGraphNodeGetType(original, &mut kind).result()? };
            if kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                continue;
            }
            // SAFETY: a kernel node; the parameters are plain data and pointers the driver
            // owns while the node lives and keeps its parameters.
            let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
            unsafe { sys::cuGraphKernelNodeGetParams_v2(original, &mut params).result()? };
            let production = match params.func == prologue {
                true => None,
                false => match production_of(params.func) {
                    Some(p) => Some(p),
                    None => continue,
                },
            };
            let mut node = std::ptr::null_mut();
            // SAFETY: `original` is a node of the graph `graph` was cloned from.
            unsafe { sys::cuGraphNodeFindInClone(&mut node, original, graph).result()? };
            let Some(production) = production else {
                prologues.push(node);
                continue;
            };
            // The same arguments: the production build takes them all but the last, the
            // trace, and reads only as many as it has.
            params.func = production.cu_function();
            // SAFETY: a kernel node of the clone; the new kernel belongs to the same context,
            // and the arguments are the original node's, alive across the call.
            unsafe { sys::cuGraphKernelNodeSetParams_v2(node, &params).result()? };
            this._builds.push(production);
        }
        if this._builds.len() != profiled || prologues.len() != 1 {
            return Ok(None);
        }
        // SAFETY: the prologue's node of the clone; its edges go with it.
        unsafe { sys::cuGraphDestroyNode(prologues[0]).result()? };
        // SAFETY: a complete graph of this context; an out-pointer.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut this.exec, graph, 0).result()? };
        Ok(Some(this))
    }

    /// The instantiated graph, to launch.
    pub(crate) fn exec(&self) -> sys::CUgraphExec {
        self.exec
    }
}

/// The nodes of `graph`.
fn nodes(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>, DriverError> {
    let mut n = 0usize;
    // SAFETY: a live graph; with a null array the driver writes the count alone.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n).result()? };
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: room for `n` nodes.
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n).result()? };
    nodes.truncate(n);
    Ok(nodes)
}

impl Drop for Unrecorded {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: handles this value made and nothing else holds; errors leave them as
        // they are, which is all a destructor can do.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}
