// phases.cu: the recorder's whole interface in one small kernel: a range around the
// loop, a begin, a fused switch, an end with a payload and an instant per iteration,
// and a last range before the destructor flushes.
//
// Instrumentation lines are the ones that mention TGPU_, rec. or the header: delete them
// and the kernel is the production kernel, with the same PTX as this file with the gate
// off (tests/recorder_compile.rs).
#include "tracing_gpu.cuh"

TGPU_EVENT(Load, 1);
TGPU_EVENT(Compute, 2);
TGPU_EVENT(Store, 3);
TGPU_EVENT(Step, 4);
TGPU_EVENT(Loop, 5);

extern "C" __global__ void phases(const float* in, float* out, int n, int iters
                                  TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Load, Compute, Store, Step, Loop);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  rec.begin<Loop>();
  for (int k = 0; k < iters; ++k) {
    rec.begin<Load>();
    const float v = i < n ? in[(i + k) % n] : 0.0f;
    rec.switch_to<Load, Compute>(k);
    acc = fmaf(acc, 0.5f, v);
    rec.end<Compute>(k);
    rec.instant<Step>(k);
  }
  rec.end<Loop>(iters);
  rec.begin<Store>();
  if (i < n) out[i] = acc;
  rec.end<Store>();
}
