// dense.cu: short-lived warps that record densely, for tools/bench/src/bin/dense.rs.
//
// Many blocks of 8 warps, over several waves on every SM; each warp runs `steps` steps of
// two short FMA chains, and records per step a Step range, an Inner range nested in it,
// and a Mark instant: 3 events per step, the Step's end carrying the step as payload.
// What recording costs here is mostly what each warp pays once (the recorder's setup
// and flush), many times over, as well as the events. Builds:
//   (no define)              the gate off;
//   TGPU_ENABLED=1           recording (v2; with TGPU_FORMAT=1, v1);
//   and DENSE_SILENT=1       the recorder is declared but records nothing: its setup
//                            and flush alone.
#include "tracing_gpu.cuh"

TGPU_EVENT(Step, 1);
TGPU_EVENT(Inner, 2);
TGPU_EVENT(Mark, 3);

// An FMA chain of `n` links, kept where it is written (as in recorder_bench.cu).
__device__ __forceinline__ float chain(float x, float a, float b, int n) {
  asm volatile("" : "+f"(x));
  for (int j = 0; j < n; ++j) x = fmaf(x, a, b);
  asm volatile("" : "+f"(x));
  return x;
}

// The warp's steps; R: it records them (a template, as gemm.cu's consumers, so that the
// copy that does not record has no call in it).
template <bool R, class Rec>
__device__ __forceinline__ float steps_of(Rec& rec, float x, float a, float b, int steps, int work) {
  for (int s = 0; s < steps; ++s) {
    if (R) rec.template begin<Step>();
    x = chain(x, a, b, work);
    if (R) rec.template begin<Inner>();
    x = chain(x, a, b, work);
    if (R) rec.template end<Inner>();
    if (R) rec.template instant<Mark>();
    if (R) rec.template end<Step>(s);
  }
  return x;
}

extern "C" __global__ void __launch_bounds__(256)
    dense(float* out, float a, float b, int steps, int work TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Step, Inner, Mark);
  float x = static_cast<float>(threadIdx.x) * 1e-3f;
#if defined(DENSE_SILENT) && DENSE_SILENT
  // Whether to record is decided at run time (never: work > 0), so the recorder's setup
  // and flush stay in the kernel, and the warps run the copy without calls.
  x = work < 0 ? steps_of<true>(rec, x, a, b, steps, work) : steps_of<false>(rec, x, a, b, steps, work);
#else
  x = steps_of<true>(rec, x, a, b, steps, work);
#endif
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
