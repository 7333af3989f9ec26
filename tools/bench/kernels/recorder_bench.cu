// recorder_bench.cu: the recorder's cost, for tools/bench/src/bin/recorder_bench.rs.
//
// Every warp runs `events` ranges, each around 64 dependent FMAs. One source, several builds:
//   (no define)              the gate off: the production kernel;
//   TGPU_BENCH_FLOOR=1       the gate off plus two bare %globaltimer_lo reads per range,
//                            folded into a register later: what any recorder that stamps
//                            both ends pays at least;
//   TGPU_ENABLED=1           ours, begin/end per range (two timer reads);
//   TGPU_ENABLED=1 and
//   TGPU_BENCH_SWITCH=1      ours, one switch_to per range (one timer read);
//   TGPU_BENCH_SEED=1        the seed's published scheme, reimplemented (seed::Recorder in
//                            baselines.cuh; compile with -I tools/bench/kernels);
//   TGPU_BENCH_BOUND=1       the least a recorder of 16-byte records does per range: two
//                            stamps, one store, one address step (bound::Recorder, there).
//   TGPU_BENCH_FLASHINFER=1  FlashInfer's recorder (flashinfer::Recorder there): 8-byte
//                            entries, one per boundary, stored one by one by lane 0.
//   TGPU_BENCH_STAGING=1     the least that staging entries in the lanes does per entry,
//                            as v2 does, without its count, group test and stores
//                            (staging::Recorder there).
// TGPU_ENABLED builds record format v2 unless TGPU_FORMAT=1 (v1) is defined too.
// TGPU_BENCH_UNROLL (default 1) unrolls the event loop, the same in every build;
// TGPU_BENCH_PAYLOAD=0 closes each range without a payload (default: the index, i).
// The work is identical in all of them, and pinned between the stamps (see pin()), so the
// difference in time is what the recording costs.
#include "tracing_gpu.cuh"

TGPU_EVENT(Work, 1);

#if (defined(TGPU_BENCH_SEED) && TGPU_BENCH_SEED) || (defined(TGPU_BENCH_BOUND) && TGPU_BENCH_BOUND) || \
    (defined(TGPU_BENCH_FLASHINFER) && TGPU_BENCH_FLASHINFER) || (defined(TGPU_BENCH_STAGING) && TGPU_BENCH_STAGING)
// The seed's design, reimplemented from its description (shared with the GEMM's overhead
// comparison, gemm.cu), and the bound, which writes into the seed's buffer: for
// benchmarks only.
#include "baselines.cuh"
#define SEED_PARAM , seed::Buffer seed_buffer
#else
#define SEED_PARAM
#endif

#ifndef TGPU_BENCH_UNROLL
#define TGPU_BENCH_UNROLL 1
#endif
// How many ranges one pass of the event loop holds (the same in every build).
constexpr int kUnroll = TGPU_BENCH_UNROLL;

#if defined(TGPU_BENCH_PAYLOAD) && !TGPU_BENCH_PAYLOAD
#define BENCH_PAYLOAD(i)
#else
#define BENCH_PAYLOAD(i) (i)
#endif

// Keeps the FMA chain where it is written: an empty volatile asm is ordered with the
// recorder's volatile timer reads, and x must be computed before it.
__device__ __forceinline__ float pin(float x) {
  asm volatile("" : "+f"(x));
  return x;
}

extern "C" __global__ void __launch_bounds__(1024, 2)
    recorder_bench(float* out, float a, float b, int events TGPU_TRACE_PARAM SEED_PARAM) {
#if defined(TGPU_BENCH_SEED) && TGPU_BENCH_SEED
  seed::Recorder<Work> rec(seed_buffer);
#elif defined(TGPU_BENCH_BOUND) && TGPU_BENCH_BOUND
  bound::Recorder<Work> rec(seed_buffer);
#elif defined(TGPU_BENCH_STAGING) && TGPU_BENCH_STAGING
  staging::Recorder<Work> rec(seed_buffer);
#elif defined(TGPU_BENCH_FLASHINFER) && TGPU_BENCH_FLASHINFER
  // Its entries go to the seed's region, which has room for them (40 bytes per event).
  flashinfer::Recorder<Work> rec(
      tgpu::Trace{reinterpret_cast<unsigned long long>(seed_buffer.records), seed_buffer.capacity, 0u});
#else
  TGPU_RECORDER(rec, Work);
#endif
  float x = static_cast<float>(threadIdx.x) * 1e-3f;
#if defined(TGPU_BENCH_FLOOR) && TGPU_BENCH_FLOOR
  // The floor: the two stamps of a range and nothing else. Their values are folded into
  // a register during the next range, not at once: consumed at once, a stamp stalls the
  // warp until the timer read returns, which no recorder needs to do.
  unsigned int folded = 0, prev_begin = 0, prev_end = 0;
#endif
#if defined(TGPU_BENCH_SWITCH) && TGPU_BENCH_SWITCH
  rec.begin<Work>();
#pragma unroll kUnroll
  for (int i = 0; i < events; ++i) {
    x = pin(x);
#pragma unroll
    for (int j = 0; j < 64; ++j) x = fmaf(x, a, b);
    x = pin(x);
    rec.switch_to<Work, Work>(BENCH_PAYLOAD(i));
  }
#else
#pragma unroll kUnroll
  for (int i = 0; i < events; ++i) {
#if defined(TGPU_BENCH_FLOOR) && TGPU_BENCH_FLOOR
    const unsigned int begin = tgpu::globaltimer_lo();
    folded ^= prev_begin ^ prev_end;
#else
    rec.begin<Work>();
#endif
    x = pin(x);
#pragma unroll
    for (int j = 0; j < 64; ++j) x = fmaf(x, a, b);
    x = pin(x);
#if defined(TGPU_BENCH_FLOOR) && TGPU_BENCH_FLOOR
    prev_begin = begin;
    prev_end = tgpu::globaltimer_lo();
#else
    rec.end<Work>(BENCH_PAYLOAD(i));
#endif
  }
#endif
#if defined(TGPU_BENCH_FLOOR) && TGPU_BENCH_FLOOR
  folded ^= prev_begin ^ prev_end;
  x += static_cast<float>(folded & 1u);
#endif
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
