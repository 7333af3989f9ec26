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
// other calls (in `stream` and the decode step the shipped recorder costs no more than
// this header; docs/performance.md, "What bounds the recorded path").
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

template <class... Events>
class Recorder {
  unsigned int value_;  // this lane's: the last stamp (or payload) of the call site it holds
  unsigned int lane_;   // %laneid; ~0 after the flush

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

  template <unsigned int Id, unsigned int Kind>
  __device__ __forceinline__ void call() {
    take<Id, Kind, 0>(0u);
  }
  template <unsigned int Id, unsigned int Kind>
  __device__ __forceinline__ void call(unsigned int payload) {
    take<Id, Kind, 0>(0u);
    take<Id, Kind, 1>(payload);
  }

 public:
  __device__ __forceinline__ explicit Recorder(Trace) : value_(0) { asm("mov.u32 %0, %%laneid;" : "=r"(lane_)); }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  __device__ __forceinline__ ~Recorder() { flush(); }

  // The API's calls, with or without a payload (one argument).
  template <class T, class... P> __device__ __forceinline__ void begin(P... p) { call<T::id, 0>(p...); }
  template <class T, class... P> __device__ __forceinline__ void end(P... p) { call<T::id, 1>(p...); }
  template <class A, class B, class... P> __device__ __forceinline__ void switch_to(P... p) { call<B::id, 2>(p...); }
  template <class T, class... P> __device__ __forceinline__ void instant(P... p) { call<T::id, 3>(p...); }

  /// Stores the warp's values (once).
  __device__ __forceinline__ void flush() {
    if (lane_ == ~0u) return;
    unsigned int sm, warp;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(warp));
    tgpu_floor_sink[((sm & 255u) * 64u + (warp & 63u)) * 32u + lane_] = value_;
    lane_ = ~0u;
  }
};

}  // namespace tgpu
