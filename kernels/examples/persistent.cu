// persistent.cu: a persistent kernel (a grid of one block per SM walks all tiles); each
// warp marks the tile it takes with an instant and records the tile as a range whose
// payload is the tile index. The block reduces each tile into out[tile].
//
// Launch: blockDim.x a multiple of 32 and at most 1024; out has `tiles` floats, in has
// tiles * tile_elems floats.
#include "tracing_gpu.cuh"

TGPU_EVENT(Tile, 1);
TGPU_EVENT(Claim, 2);

extern "C" __global__ void persistent(const float* in, float* out, int tiles, int tile_elems
                                      TGPU_TRACE_PARAM) {
  __shared__ float partial[32];
  TGPU_RECORDER(rec, Tile, Claim);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    rec.instant<Claim>(tile);
    rec.begin<Tile>();
    const float* src = in + static_cast<size_t>(tile) * tile_elems;
    float sum = 0.0f;
    for (int j = threadIdx.x; j < tile_elems; j += blockDim.x) sum += src[j];
    for (int d = 16; d > 0; d /= 2) sum += __shfl_down_sync(0xffffffffu, sum, d);
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < blockDim.x / 32; ++w) total += partial[w];
      out[tile] = total;
    }
    __syncthreads();
    rec.end<Tile>(tile);
  }
}
