// The prologue of a profiled CUDA graph (src/cuda/graph.rs compiles this with
// NVRTC and puts one launch of it in front of the graph's first profiled kernel
// node when the graph is captured; every later profiled node depends on it).
//
// A replay cannot run host code per kernel, so the device finds each replay's
// trace memory by itself, here, once per replay: one thread takes the replay's
// number from the graph's counter, looks at region (number mod K) of the
// graph's replay ring, and takes it if the collector has armed it (it has
// brought the region's previous replay back and zeroed it); then every thread
// writes, for its kernel nodes, where that node's buffer is (0: record
// nothing) into the node's word, which the node's `tgpu::Trace` points at
// (TRACE_INDIRECT). The kernel nodes pay one load each at their start; there
// is no atomic, and nothing per block.
//
// Launches of one executable graph never overlap (the driver orders them), so
// a plain increment of the counter is enough, and the replay numbers the device
// takes are the host's count of `Profiler::launch_graph` calls.
//
// The state (one per captured graph; offsets in bytes, all u64):
//   0 next replay number       8 ring (device address; 0: not ready, record nothing)
//  16 region size              24 mask (K - 1, K a power of two)
//  32 kernel nodes (n)         64 offsets[MAX_NODES]: each node's buffer in a region
//  64 + 8 MAX_NODES: current[MAX_NODES], where the nodes of this replay write
// A region of the ring: u32 state (1 armed, 2 taken) at 0, u64 replay at 8.

typedef unsigned long long u64;

#ifndef TGPU_MAX_NODES
#error "TGPU_MAX_NODES is defined by the host (src/cuda/graph.rs)"
#endif

extern "C" __global__ void tgpu_graph_prologue(u64* state) {
    __shared__ u64 region;
    if (threadIdx.x == 0) {
        const u64 r = state[0];
        state[0] = r + 1;
        const u64 ring = state[1];
        u64 base = 0;
        if (ring != 0) {
            base = ring + (r & state[3]) * state[2];
            unsigned int* head = reinterpret_cast<unsigned int*>(base);
            if (*reinterpret_cast<volatile unsigned int*>(head) == 1u) {
                *reinterpret_cast<u64*>(base + 8) = r;
                head[0] = 2u;
            } else {
                base = 0;  // still in use: this replay records nothing
            }
        }
        region = base;
    }
    __syncthreads();
    const u64 nodes = state[4];
    for (u64 i = threadIdx.x; i < nodes && i < TGPU_MAX_NODES; i += blockDim.x) {
        state[8 + TGPU_MAX_NODES + i] = region != 0 ? region + state[8 + i] : 0ull;
    }
}
