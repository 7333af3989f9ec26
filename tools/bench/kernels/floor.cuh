// floor.cuh: a recorder of tracing_gpu.cuh's API cut down to what any recorder that stamps
// every call must do, as a header that the benchmarks' `--header` puts in place of the
// recorder's (graph_replay, decode_step, storm, stream; issue #28). Each call reads the
// timer once, into the register of the lane that its call site names (predicated on the
// lane: a compare and a read per call; a payload, a compare and a move), and each warp
// stores its 32 lanes' values at its end with one coalesced store. No slot is found, no
// count kept, nothing tested per call, no header written, and what is stored is not a
// trace: the last stamp of each call site, in a sink of this module's own (the launch's
// trace argument is ignored, and its slots stay empty, so the profiler delivers no event).
//
// What a benchmark measures with it bounds what recording can cost less: a goal below it
// is not within reach of a recorder that stamps every call of this API. It is the least
// we could write, not a proof of a least: a kernel's code may schedule differently around
// other calls (in the decode step this mode made one kernel 31 % slower where mode 1 below
// made it faster; docs/performance.md, "What bounds recording short kernels").
#pragma once

namespace tgpu {

/// The kernel's trace argument, as tracing_gpu.cuh declares it (32 bytes), unread.
struct Trace {
  unsigned long long base;
  unsigned int capacity, slot_count, warp_mask, block_stride, block_offset, launch_every;
};
static_assert(sizeof(Trace) == 32 && alignof(Trace) == 8, "Trace is format::KernelArg: 32 bytes, 8-aligned");

}  // namespace tgpu

#define TGPU_EVENT(Name, Id)           \
  struct Name {                        \
    enum : unsigned int { id = (Id) }; \
  }
#define TGPU_TRACE_PARAM , ::tgpu::Trace tgpu_trace
#define TGPU_TRACE_ARG , tgpu_trace
#define TGPU_RECORDER(name, ...) ::tgpu::Recorder<__VA_ARGS__> name(tgpu_trace)

// Where warps store: one 32-word row per hardware warp slot (SM × warp slot), rewritten by
// each warp that runs there.
__device__ unsigned int tgpu_floor_sink[256 * 64 * 32];

namespace tgpu {

// The floor's variants, to take a benchmark's figure apart (`--define TGPU_FLOOR_MODE=N`):
//   0 (the default): as above, a compare and a timer read per call, one store per warp;
//   1: each call's stamp (or payload) stored at once by the warp's first lane, so that
//      nothing is held in the kernel's registers between calls;
//   2: no code per call: the recorder's parameter and the warp's one store alone;
//   3: not a floor but a candidate recorder for latency-bound kernels (issue #28), which
//      writes recorder v2's slot format, so the host decodes it unchanged, and stages
//      nothing: the warp's first lane stamps each call and stores its 8-byte entry at once
//      (a payload: one entry more), and writes the v2 slot header at the flush. Five
//      registers held (the next entry's address, two; the entries stored, left and lost);
//      per call a timer read, a predicated store and three adds. A prototype, not shipped: no
//      sampling (every warp records), no streaming (a streaming argument records
//      nothing), and a slot that fills counts its lost entries but not the events they end
//      (v2 counts those). Measured against v2 on the H100 (lab history, session 26): the
//      decode step, every step recorded, +2.95 % (v2 +8.38 %; on 8ad9709's kernels, whose
//      attention keeps its loads in flight in every build, +8.03 % against v2's +8.62 %:
//      the gain was that kernel's schedule, session 28), the 100-node graph +11.6 /
//      +12.1 % at 132 / 8 blocks (v2 +16.4 / +14.2 %), every event exact; at full
//      occupancy (a store per entry, where v2 stores 32 at once) not measured. Made exact
//      in the header (sampling, a full slot's anchor, its lost events counted), it
//      measured +4.2 to +8.7 % and the graph +16 to +19 % (session 26), and as
//      `TGPU_DIRECT=1` +7.7 % and +16.5 / +17.1 % beside v2's +8.3 % and +14.0 / +15.6 %
//      (session 27), though each piece it adds is free alone here (lab history).
// In the decode step (H100, lab history, session 26) mode 0 made the attention kernel
// 31 % slower alone and the step +7.9 %, where mode 2 left the step as fast as off; on
// 8ad9709's kernels mode 0 costs the step +0.17 %, mode 1 +3.02 % (session 28). On
// `stream`'s fixed slots mode 0 costs +4.12 %, mode 1 +2.73 %, mode 2 +0.02 % (v2 +3.48 %).
#ifndef TGPU_FLOOR_MODE
#define TGPU_FLOOR_MODE 0
#endif

#if TGPU_FLOOR_MODE != 3

template <class... Events>
class Recorder {
  unsigned int value_;  // this lane's: the last stamp (or payload) of the call site it holds
  unsigned int lane_;   // %laneid (mode 1: the first lane's sink row, ~0 elsewhere); ~0 after
                        // the flush

  // Where the warp stores: the row of its hardware warp slot (SM × warp slot).
  __device__ __forceinline__ static unsigned int row() {
    unsigned int sm, warp;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(warp));
    return ((sm & 255u) * 64u + (warp & 63u)) * 32u;
  }

  // The call site's place: its event's id, its kind (0-3) and stamp or payload, among 32.
  template <unsigned int Id, unsigned int Kind, unsigned int Payload>
  __device__ __forceinline__ void take(unsigned int payload) {
    constexpr unsigned int place = ((Id * 4u + Kind) * 2u + Payload) % 32u;
    if (Payload) {
      asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %1, %2;\n\t@p mov.u32 %0, %3;\n\t}"
                   : "+r"(value_)
                   : "r"(lane_), "n"(place), "r"(payload)
                   : "memory");
    } else {
      asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %1, %2;\n\t@p mov.u32 %0, %%globaltimer_lo;\n\t}"
                   : "+r"(value_)
                   : "r"(lane_), "n"(place)
                   : "memory");
    }
  }

  // TGPU_FLOOR_MODE=1: the stamp stored at once by the warp's first lane, in its row of
  // the sink (no value held between calls; the row's index is lane_ there, ~0 elsewhere).
  template <unsigned int Id, unsigned int Kind, unsigned int Payload>
  __device__ __forceinline__ void put(unsigned int payload) {
    constexpr unsigned int place = ((Id * 4u + Kind) * 2u + Payload) % 32u;
    unsigned int v = payload;
    if (!Payload) asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(v)::"memory");
    if (lane_ != ~0u) tgpu_floor_sink[lane_ + place] = v;
  }

  template <unsigned int Id, unsigned int Kind>
  __device__ __forceinline__ void call() {
#if TGPU_FLOOR_MODE == 0
    take<Id, Kind, 0>(0u);
#elif TGPU_FLOOR_MODE == 1
    put<Id, Kind, 0>(0u);
#endif
  }
  template <unsigned int Id, unsigned int Kind>
  __device__ __forceinline__ void call(unsigned int payload) {
#if TGPU_FLOOR_MODE == 0
    take<Id, Kind, 0>(0u);
    take<Id, Kind, 1>(payload);
#elif TGPU_FLOOR_MODE == 1
    put<Id, Kind, 0>(0u);
    put<Id, Kind, 1>(payload);
#endif
  }

 public:
  __device__ __forceinline__ explicit Recorder(Trace) : value_(0) {
    asm("mov.u32 %0, %%laneid;" : "=r"(lane_));
#if TGPU_FLOOR_MODE == 1
    lane_ = lane_ == 0u ? row() : ~0u;
#endif
  }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  __device__ __forceinline__ ~Recorder() { flush(); }

  // The API's calls, with or without a payload (one argument).
  template <class T, class... P> __device__ __forceinline__ void begin(P... p) { call<T::id, 0>(p...); }
  template <class T, class... P> __device__ __forceinline__ void end(P... p) { call<T::id, 1>(p...); }
  template <class A, class B, class... P> __device__ __forceinline__ void switch_to(P... p) { call<B::id, 2>(p...); }
  template <class T, class... P> __device__ __forceinline__ void instant(P... p) { call<T::id, 3>(p...); }

  /// Stores the warp's values (once; mode 1 stored them at each call).
  __device__ __forceinline__ void flush() {
#if TGPU_FLOOR_MODE != 1
    if (lane_ == ~0u) return;
    tgpu_floor_sink[row() + lane_] = value_;
#endif
    lane_ = ~0u;
  }
};

#else  // TGPU_FLOOR_MODE == 3: the direct candidate

template <class... Events>
class Recorder {
  unsigned long long next_;  // first lane: where its next entry goes; 0: records nothing
  unsigned int n_;           // entries stored (first lane)
  unsigned int lost_;        // entries that found the slot full
  unsigned int left_;        // entries the slot still takes (first lane; 0 elsewhere)

  __device__ __forceinline__ void put(unsigned int time, unsigned int word) {
    if (left_ != 0u) {
      asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(next_), "r"(time), "r"(word) : "memory");
      next_ += 8ull;
      --left_;
      ++n_;
    } else {
      ++lost_;
    }
  }

  template <unsigned int Word>
  __device__ __forceinline__ void call() {
    unsigned int t;
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t)::"memory");
    put(t, Word);
  }
  template <unsigned int Word>
  __device__ __forceinline__ void call(unsigned int payload) {
    call<Word>();
    put(payload, 4u << 16);
  }

 public:
  __device__ __forceinline__ explicit Recorder(Trace trace) : next_(0ull), n_(0u), lost_(0u), left_(0u) {
    unsigned int lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (lane != 0u || trace.base == 0ull || (trace.capacity & 0x40000000u)) return;
    unsigned long long base = trace.base;
    if (trace.capacity & 0x80000000u) base = *reinterpret_cast<const unsigned long long*>(base);
    const unsigned int cap = trace.capacity & 0x3FFFFFFFu;
    const unsigned int warps = (blockDim.x * blockDim.y * blockDim.z + 31u) >> 5;
    const unsigned int warp = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
    const unsigned int slot = (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * warps + warp;
    if (base == 0ull || slot >= trace.slot_count) return;
    next_ = base + 128ull + static_cast<unsigned long long>(slot) * (64ull + 16ull * cap);
    left_ = 2u * cap;
  }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  __device__ __forceinline__ ~Recorder() { flush(); }

  template <class T> __device__ __forceinline__ void begin() { call<T::id>(); }
  template <class T> __device__ __forceinline__ void end() { call<T::id | (1u << 16)>(); }
  template <class T> __device__ __forceinline__ void end(unsigned int p) { call<T::id | (1u << 16)>(p); }
  template <class A, class B> __device__ __forceinline__ void switch_to() { call<B::id | (2u << 16)>(); }
  template <class A, class B> __device__ __forceinline__ void switch_to(unsigned int p) {
    call<B::id | (2u << 16)>(p);
  }
  template <class T> __device__ __forceinline__ void instant() { call<T::id | (3u << 16)>(); }
  template <class T> __device__ __forceinline__ void instant(unsigned int p) { call<T::id | (3u << 16)>(p); }

  /// The first lane writes the v2 slot header (a warp that recorded nothing: nothing).
  /// (A full slot's anchor is not written: the prototype's benchmarks never fill one.)
  __device__ __forceinline__ void flush() {
    if (next_ != 0ull && n_ != 0u) {
      unsigned long long last;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(last)::"memory");
      unsigned int sm, rank = 0xFFFFFFFFu;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
      const unsigned int warps = (blockDim.x * blockDim.y * blockDim.z + 31u) >> 5;
      const unsigned int warp = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
      const unsigned int slot = (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * warps + warp;
      const unsigned long long h = next_ - 8ull * n_ - 64ull;
      const unsigned int lo = static_cast<unsigned int>(last), hi = static_cast<unsigned int>(last >> 32);
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(h), "r"(0x32544C53u), "r"(n_), "r"(lo),
                   "r"(hi));
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(h + 16ull), "r"(lo), "r"(hi), "r"(lost_),
                   "r"(sm));
      asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(h + 32ull), "r"(slot), "r"(rank));
    }
    next_ = 0ull;
  }
};

#endif  // TGPU_FLOOR_MODE

}  // namespace tgpu
