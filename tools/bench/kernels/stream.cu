// stream.cu: a persistent, warp-specialized kernel that records for as long as it is told
// to, for streaming traces (issue #13: TRACE_STREAM, docs/format.md "Streaming slots").
//
// Launch: one block per SM (grid = the SM count), blockDim.x = 32 * W (W >= 2; 4 is the
// intended shape: 1 producer and 3 consumers). Warp 0 is the producer, the others are
// consumers. Every warp loops `iters` times; each phase runs a chain of `work` dependent
// FMAs, so `work` sets the event rate: an iteration is 2 * work dependent FMAs, about 4
// cycles each, so work = 2500 should give about 10 µs per iteration on an H200 (1.98 GHz)
// and iters = 1,000,000 about 10 s (measure it). every >= 1, and iters + every < 2^32.
// out has gridDim.x * blockDim.x floats and one more, 0, that the kernel reads and no
// thread writes.
//
//   producer, per iteration i:  begin<Load>, work, end<Load>, work,
//                               and when i % every == 0: instant<Issue>(i)
//   consumers:                  begin<Wait> once; per iteration i: work,
//                               switch_to<Wait, Mma>, work, switch_to<Mma, Wait>(i) when
//                               i % every == 0 (else without payload); end<Wait> at the end
//
// Exactly, with P = (iters + every - 1) / every (the iterations with a payload), per warp:
//   producer:  events  = iters + P               (iters Load ranges, P Issue instants)
//              entries = 2 * iters + 2 * P       (begin, end; an instant and its payload)
//   consumer:  events  = 2 * iters + 1           (iters Wait and iters Mma ranges, and
//                                                 the last Wait)
//              entries = 2 * iters + P + 2       (two switches, P payloads, begin, end)
// so a launch of B blocks of W warps records B * (iters + P + (W - 1) * (2 * iters + 1))
// events in B * (2 * iters + 2 * P + (W - 1) * (2 * iters + P + 2)) entries. With B = 132,
// W = 4, iters = 1,000,000 and every = 8: 924 M events, 1.09 G entries (35 M chunks of 31).
// (A streaming warp stages in 31 lanes, so a chunk holds 31 entries; the counts above do
// not depend on it.)
//
// Builds: no define, the gate off; TGPU_ENABLED=1, recording into fixed slots (v2);
// with TGPU_STREAM=1 as well, v2 that streams when the launch's trace asks; TGPU_FORMAT=1,
// v1, which records nothing from a streaming trace.
#include "tracing_gpu.cuh"

TGPU_EVENT(Load, 1);
TGPU_EVENT(Wait, 2);
TGPU_EVENT(Mma, 3);
TGPU_EVENT(Issue, 4);

// An FMA chain of `n` links, kept where it is written (as in dense.cu).
__device__ __forceinline__ float chain(float x, float a, float b, int n) {
  asm volatile("" : "+f"(x));
  for (int j = 0; j < n; ++j) x = fmaf(x, a, b);
  asm volatile("" : "+f"(x));
  return x;
}

extern "C" __global__ void __launch_bounds__(1024)
    stream_bench(float* out, float a, float b, unsigned iters, unsigned every, int work TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Load, Wait, Mma, Issue);
  // The chain's operands plus a word no thread writes (0, the host's): values ptxas must
  // keep in registers. Taken from the parameter bank, ptxas reloaded them at every pass of
  // the chain's loop in the watch build (not in the others), which measured that choice of
  // ptxas on this loop, +35 %, rather than the recorder (lab history, session 21).
  float zero;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(zero) : "l"(out + gridDim.x * blockDim.x));
  a += zero;
  b += zero;
  float x = static_cast<float>(threadIdx.x) * 1e-3f;
  // The iterations with a payload (i % every == 0) found by a running count, not by a
  // division per iteration: the gate off drops the test with the calls, so its cost (an
  // unsigned division by a parameter, 17 instructions with conversions and a reciprocal)
  // was measured as the recorder's (lab history, session 28).
  unsigned paid = 0;
  if (threadIdx.x / 32 == 0) {
    for (unsigned i = 0; i < iters; ++i) {
      rec.begin<Load>();
      x = chain(x, a, b, work);
      rec.end<Load>();
      x = chain(x, a, b, work);
      if (i == paid) {
        paid += every;
        rec.instant<Issue>(i);
      }
    }
  } else {
    rec.begin<Wait>();
    for (unsigned i = 0; i < iters; ++i) {
      x = chain(x, a, b, work);
      rec.switch_to<Wait, Mma>();
      x = chain(x, a, b, work);
      if (i == paid) {
        paid += every;
        rec.switch_to<Mma, Wait>(i);
      } else {
        rec.switch_to<Mma, Wait>();
      }
    }
    rec.end<Wait>();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
