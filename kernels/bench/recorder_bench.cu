// recorder_bench.cu: the recorder's cost, for examples/recorder_bench.rs.
//
// Every warp runs `events` ranges, each around 64 dependent FMAs. One source, five builds:
//   (no define)              the gate off: the production kernel;
//   TGPU_BENCH_FLOOR=1       the gate off plus two bare %globaltimer_lo reads per range,
//                            folded into a register later: what any recorder that stamps
//                            both ends pays at least;
//   TGPU_ENABLED=1           ours, begin/end per range (two timer reads);
//   TGPU_ENABLED=1 and
//   TGPU_BENCH_SWITCH=1      ours, one switch_to per range (one timer read);
//   TGPU_BENCH_SEED=1        the seed's published scheme, reimplemented (see seed::Recorder).
// TGPU_BENCH_UNROLL (default 1) unrolls the event loop, the same in every build.
// The work is identical in all of them, and pinned between the stamps (see pin()), so the
// difference in time is what the recording costs.
#include "tracing_gpu.cuh"

TGPU_EVENT(Work, 1);

#if defined(TGPU_BENCH_SEED) && TGPU_BENCH_SEED
namespace seed {

// The seed (a CuTe DSL in-kernel profiler) as its PR describes it: a per-(block, warp)
// append buffer of records of 5 x int64, a per-warp record counter in global memory
// padded to its own 128-byte line, %globaltimer stamps, start times held in registers
// through a compile-time open-id map, and lane 0 writing.
struct Buffer {
  unsigned long long* records;   // slot s: records + s * capacity * 5
  unsigned long long* counters;  // slot s: counters[s * 16] (128 bytes apart)
  unsigned int capacity;
  unsigned int slot_count;
};

__device__ __forceinline__ unsigned long long timer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
  return t;
}

template <class... Events>
class Recorder {
  unsigned long long* records_;
  unsigned long long* counter_;
  unsigned int capacity_;
  bool writes_;
  unsigned long long start_[sizeof...(Events)];

  template <class T>
  __host__ __device__ static constexpr unsigned int slot_of() {
    return tgpu::detail::index_of<T, Events...>::value;
  }

 public:
  __device__ __forceinline__ explicit Recorder(Buffer b) {
    const unsigned int tid = threadIdx.x;
    const unsigned int slot = blockIdx.x * ((blockDim.x + 31) >> 5) + (tid >> 5);
    writes_ = (tid & 31) == 0 && slot < b.slot_count;
    records_ = b.records + static_cast<unsigned long long>(slot) * b.capacity * 5;
    counter_ = b.counters + static_cast<unsigned long long>(slot) * 16;
    capacity_ = b.capacity;
    for (unsigned int i = 0; i < sizeof...(Events); ++i) start_[i] = 0;
  }
  template <class T>
  __device__ __forceinline__ void begin() {
    start_[slot_of<T>()] = timer();
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int payload) {
    const unsigned long long t = timer();
    if (writes_) {
      unsigned long long n;
      // The counter lives in global memory: a load and a store per event, as in the seed.
      asm volatile("ld.global.u64 %0, [%1];" : "=l"(n) : "l"(counter_) : "memory");
      if (n < capacity_) {
        unsigned long long* r = records_ + n * 5;
        unsigned int sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        r[0] = T::id;
        r[1] = start_[slot_of<T>()];
        r[2] = t;
        r[3] = sm;
        r[4] = payload;
      }
      asm volatile("st.global.u64 [%0], %1;" ::"l"(counter_), "l"(n + 1) : "memory");
    }
  }
};

}  // namespace seed
#define SEED_PARAM , seed::Buffer seed_buffer
#else
#define SEED_PARAM
#endif

#ifndef TGPU_BENCH_UNROLL
#define TGPU_BENCH_UNROLL 1
#endif
// How many ranges one pass of the event loop holds (the same in every build).
constexpr int kUnroll = TGPU_BENCH_UNROLL;

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
    rec.switch_to<Work, Work>(i);
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
    rec.end<Work>(i);
#endif
  }
#endif
#if defined(TGPU_BENCH_FLOOR) && TGPU_BENCH_FLOOR
  folded ^= prev_begin ^ prev_end;
  x += static_cast<float>(folded & 1u);
#endif
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
