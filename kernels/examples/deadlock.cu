// deadlock.cu: a producer/consumer pipeline that hangs on purpose, for watch mode
// (TGPU_WATCH=1) and the profiler's watchdog. Warp 0 of each block loads tiles into a
// two-stage shared-memory ring and publishes each stage's phase; the other warps wait for
// the phase, compute, and release the stage. In block `bad_block` the producer publishes
// tile `bad_tile` with the wrong phase: its consumers wait for it forever, and the
// producer, two tiles later, waits forever for them to release the stage.
//
// Every wait gives up after `limit_ns` of %globaltimer, so that no run can hold the GPU:
// a warp that gives up writes what it was stuck in and what it closed last into
// report[3 * warp] (event id, closed event id, that range's payload), ends the range and
// leaves its loop. Warps that finish write zeros.
//
// Launch: blockDim.x = 32 * (1 + consumer warps), report has 3 words per warp of the grid,
// out one float per consumer thread of the grid.
#include "tracing_gpu.cuh"

TGPU_EVENT(Load, 1);
TGPU_EVENT(Wait, 2);
TGPU_EVENT(Compute, 3);

constexpr unsigned kStages = 2;
constexpr unsigned kTile = 256;

// Spins until `*word >= at_least` or `limit_ns` has passed since `start`; false if it gave up.
__device__ __forceinline__ bool wait_for(const volatile unsigned* word, unsigned at_least,
                                         unsigned long long start, unsigned long long limit_ns) {
  while (*word < at_least) {
    if (tgpu::globaltimer() - start > limit_ns) return false;
  }
  return true;
}

extern "C" __global__ void deadlock(float* out, unsigned* report, unsigned tiles, unsigned bad_block,
                                    unsigned bad_tile, unsigned long long limit_ns TGPU_TRACE_PARAM) {
  __shared__ float ring[kStages][kTile];
  __shared__ unsigned full[kStages];   // tiles published in each stage
  __shared__ unsigned empty[kStages];  // consumer warps' releases of each stage
  if (threadIdx.x < kStages) {
    full[threadIdx.x] = 0;
    empty[threadIdx.x] = 0;
  }
  __syncthreads();
  TGPU_RECORDER(rec, Load, Wait, Compute);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned consumers = blockDim.x / 32 - 1;
  const unsigned long long start = tgpu::globaltimer();
  unsigned* mine = report + 3 * (blockIdx.x * (blockDim.x / 32) + warp);
  unsigned stuck = 0, closed = 0, payload = 0;
  if (warp == 0) {
    for (unsigned t = 0; t < tiles; ++t) {
      const unsigned s = t % kStages, use = t / kStages;
      rec.begin<Load>();
      if (!wait_for(&empty[s], use * consumers, start, limit_ns)) {
        stuck = Load::id;
        closed = Load::id;
        payload = t - 1;
        rec.end<Load>();
        break;
      }
      for (unsigned j = lane; j < kTile; j += 32) ring[s][j] = static_cast<float>(t + j);
      __threadfence_block();
      // The bug: one block publishes one tile with the phase it had before.
      if (lane == 0) full[s] = blockIdx.x == bad_block && t == bad_tile ? use : use + 1;
      __syncwarp();
      rec.end<Load>(t);
    }
  } else {
    float acc = 0.0f;
    for (unsigned t = 0; t < tiles; ++t) {
      const unsigned s = t % kStages, use = t / kStages;
      rec.begin<Wait>();
      if (!wait_for(&full[s], use + 1, start, limit_ns)) {
        stuck = Wait::id;
        closed = Compute::id;
        payload = t - 1;
        rec.end<Wait>();
        break;
      }
      rec.switch_to<Wait, Compute>(t);
      for (unsigned j = threadIdx.x - 32; j < kTile; j += blockDim.x - 32) acc += ring[s][j];
      __syncwarp();
      if (lane == 0) atomicAdd(&empty[s], 1u);
      rec.end<Compute>(t);
    }
    out[blockIdx.x * (blockDim.x - 32) + threadIdx.x - 32] = acc;
  }
  if (lane == 0) {
    mine[0] = stuck;
    mine[1] = closed;
    mine[2] = payload;
  }
}
