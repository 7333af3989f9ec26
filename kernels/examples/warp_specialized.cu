// warp_specialized.cu: one producer warp streams tiles into a shared-memory ring, the
// consumer warps reduce them; each role records its own phases on the one recorder
// (every warp has its own slot). Full and empty barriers are named barriers: the
// producer arrives on full[s] and syncs on empty[s], the consumers the other way round.
//
// Launch: blockDim.x = 32 * (1 + consumer warps), out has gridDim.x * (blockDim.x - 32)
// floats, in has gridDim.x * tiles * kTile floats.
#include "tracing_gpu.cuh"

TGPU_EVENT(Load, 1);
TGPU_EVENT(Wait, 2);
TGPU_EVENT(Reduce, 3);

constexpr int kStages = 2;
constexpr int kTile = 256;

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

extern "C" __global__ void warp_specialized(const float* in, float* out, int tiles
                                            TGPU_TRACE_PARAM) {
  __shared__ float ring[kStages][kTile];
  TGPU_RECORDER(rec, Load, Wait, Reduce);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int threads = blockDim.x;
  const float* src = in + static_cast<size_t>(blockIdx.x) * tiles * kTile;
  if (warp == 0) {
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      if (t >= kStages) {
        rec.begin<Wait>();
        bar_sync(1 + kStages + s, threads);
        rec.end<Wait>(t);
      }
      rec.begin<Load>();
      for (int j = lane; j < kTile; j += 32) ring[s][j] = src[t * kTile + j];
      rec.end<Load>(t);
      bar_arrive(1 + s, threads);
    }
  } else {
    float acc = 0.0f;
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      rec.begin<Wait>();
      bar_sync(1 + s, threads);
      rec.switch_to<Wait, Reduce>(t);
      for (int j = threadIdx.x - 32; j < kTile; j += threads - 32) acc += ring[s][j];
      rec.end<Reduce>(t);
      if (t + kStages < tiles) bar_arrive(1 + kStages + s, threads);
    }
    out[blockIdx.x * (threads - 32) + threadIdx.x - 32] = acc;
  }
}
