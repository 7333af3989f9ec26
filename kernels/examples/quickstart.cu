// quickstart.cu: a small instrumented kernel for examples/quickstart.rs and the
// benchmarks (tools/bench). Each block walks `tiles` tiles of `x`: it loads a tile into
// shared memory, evaluates a polynomial of degree `work` on each element, and stores
// the result. Every warp records the three phases of every tile (payload: the tile
// index) and an instant when it is done.
//
// Compiled at run time by NVRTC with -DTGPU_ENABLED=1 (the examples do this).
#include "tracing_gpu.cuh"

TGPU_EVENT(Load, 1);
TGPU_EVENT(Compute, 2);
TGPU_EVENT(Store, 3);
TGPU_EVENT(Done, 4);

extern "C" __global__ void tiled_poly(const float* __restrict__ x, float* __restrict__ y, unsigned int n,
                                      unsigned int tiles, unsigned int work TGPU_TRACE_PARAM) {
  extern __shared__ float tile[];
  TGPU_RECORDER(rec, Load, Compute, Store, Done);
  for (unsigned int t = 0; t < tiles; ++t) {
    const unsigned int i = (blockIdx.x * tiles + t) * blockDim.x + threadIdx.x;
    rec.begin<Load>();
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    rec.switch_to<Load, Compute>(t);
    const float v = tile[threadIdx.x];
    float acc = 0.0f;
    for (unsigned int k = 0; k < work; ++k) acc = acc * v + 1.0f;
    rec.switch_to<Compute, Store>(t);
    if (i < n) y[i] = acc;
    rec.end<Store>(t);
    __syncthreads();
  }
  rec.instant<Done>(tiles);
}
