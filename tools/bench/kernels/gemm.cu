// gemm.cu: a warp-specialized, multi-stage bf16 GEMM for sm_90a (Hopper), compiled
// at run time by NVRTC (tools/bench/src/gemm.rs) or by nvcc.
//
//   C[m][n] = sum_k A[m][k] * B[n][k]      (fp32 accumulation)
//
// A is M x K row-major; B is given as N x K row-major (that is, the K x N matrix B in
// column-major order: cuBLAS's "TN" case); C is M x N row-major, bf16 (default) or
// fp32 (-DGEMM_OUT_F32). M must be a multiple of 128, N of 256, K of 64.
//
// Design (one persistent block per SM, 3 warpgroups, 384 threads):
//   - warpgroup 0 is the producer: one warp issues TMA bulk-tensor copies of A and B
//     k-tiles (128x64 and 256x64, 128-byte swizzle) into a ring of STAGES shared
//     memory stages; each copy completes on the stage's "full" mbarrier;
//   - warpgroups 1 and 2 are consumers: each owns 64 rows of the 128x256 tile and
//     issues wgmma m64n256k16 straight from shared memory, keeping one k-tile of
//     wgmma in flight; a consumer warp arrives on the stage's "empty" mbarrier once the
//     wgmma that read the stage has completed;
//   - the block walks its tiles (blockIdx.x, + gridDim.x, ...) in a grouped order so
//     that the blocks running together share A rows and B columns in L2; the producer
//     runs ahead into the next tile while the consumers write the epilogue.
//
// Instrumentation (tracing_gpu.cuh, compiled only with TGPU_ENABLED): each warp records
// its own role. Producer: Load per k-tile. Consumers: Wait and Mma per k-tile, then
// Epilogue per tile. GEMM_TRACE_LEVEL=2 ("full") splits the producer's ProdWait from
// its Load and adds a Tile range around each tile and a Release instant per k-tile.
// GEMM_TRACE_ONE_WARP=1 ("phases-wg") has one warp of each consumer warpgroup record
// instead of all four (see `records` below): a quarter of the consumer records.
// (The events below say where each stamp sits, and why.) With TGPU_ENABLED off, every
// `rec.` line compiles to nothing and the kernel keeps its production parameters.
//
// GEMM_RECORDER selects who implements `rec` when TGPU_ENABLED is on, for the overhead
// comparison (tools/bench/src/bin/overhead.rs): 0 = tgpu::Recorder (ours, the default), 1 = the
// seed's published design, 2 = FlashInfer's published design (both in baselines.cuh,
// reimplemented from their descriptions: same call sites, same event count, their costs),
// 3 = the timer reads alone (stamps::Recorder there: what any recorder at these call
// sites pays; it records nothing).
// With nvcc: -I kernels/include -I tools/bench/kernels.
#include "tracing_gpu.cuh"

#ifndef GEMM_TRACE_LEVEL
#define GEMM_TRACE_LEVEL 1
#endif
#ifndef GEMM_RECORDER
#define GEMM_RECORDER 0
#endif
#ifndef GEMM_TRACE_ONE_WARP
#define GEMM_TRACE_ONE_WARP 0
#endif
// GEMM_REPS > 1 makes the persistent blocks walk the problem's tiles that many times over
// (each pass writes the same C): a kernel that runs for seconds, for streamed recording
// (tools/bench/src/bin/gemm_stream.rs). With 1 the kernel is as without it.
#ifndef GEMM_REPS
#define GEMM_REPS 1
#endif

// The events, by warp role. Payloads: the k-tile index for per-k-tile events, the tile
// index for per-tile ones.
TGPU_EVENT(ProdWait, 1);  // producer, level 2: waiting for the consumers to free a stage
TGPU_EVENT(Load, 2);      // producer: issuing the stage's TMA copies (they land asynchronously)
TGPU_EVENT(Wait, 3);      // consumer: waiting for the stage's data, issuing its wgmma
TGPU_EVENT(Mma, 4);       // consumer: retiring the previous k-tile's wgmma, freeing its stage
TGPU_EVENT(Epilogue, 5);  // consumer: draining the last wgmma and storing C
TGPU_EVENT(Tile, 6);      // consumer, level 2: the whole tile
TGPU_EVENT(Release, 7);   // consumer, level 2 instant: a stage handed back to the producer

// Where the stamps go. A timer read costs a few ns; placed between a barrier wait and the
// copy or wgmma issue that the wait unblocks, it lengthens the pipeline's critical path
// by that much on every k-tile. So at level 1 every stamp follows an issue: the consumer
// stamps Wait->Mma just after issuing the k-tile's wgmma (Wait: until the data landed and
// the wgmma are issued; Mma: retiring the previous k-tile's wgmma and releasing its
// stage), and the producer stamps once per k-tile after issuing the copies (Load: waiting
// for a free stage, then issuing). Level 2 also splits the producer's wait from its issue
// (ProdWait, then Load), at the price of a stamp on that path.
#if GEMM_TRACE_LEVEL >= 2
typedef ProdWait ProdIdle;
#else
typedef Load ProdIdle;
#endif

#if defined(TGPU_ENABLED) && TGPU_ENABLED && GEMM_RECORDER != 0
// The designs we compare against (baselines.cuh: reimplemented from their published
// descriptions, for benchmarks only), behind tgpu::Recorder's interface, so that the
// GEMM's call sites are the same lines in every build. Both take their buffer from the
// same tgpu::Trace argument.
#include "baselines.cuh"
#if GEMM_RECORDER == 1
#define GEMM_RECORDER_DECL(name, trace, ...) ::seed::Recorder<__VA_ARGS__> name(::seed::Buffer::packed(trace))
#elif GEMM_RECORDER == 2
#define GEMM_RECORDER_DECL(name, trace, ...) ::flashinfer::Recorder<__VA_ARGS__> name(trace)
#elif GEMM_RECORDER == 3
#define GEMM_RECORDER_DECL(name, trace, ...) ::stamps::Recorder<__VA_ARGS__> name(trace)
#endif
#elif defined(TGPU_ENABLED) && TGPU_ENABLED
#define GEMM_RECORDER_DECL(name, trace, ...) ::tgpu::Recorder<__VA_ARGS__> name(trace)
#else
// The gate off: the trace expression (which names the absent tgpu_trace) is dropped.
#define GEMM_RECORDER_DECL(name, trace, ...) TGPU_RECORDER(name, __VA_ARGS__)
#endif

namespace gemm {

typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int BM = 128;                  // tile rows (M)
constexpr int BN = 256;                  // tile columns (N)
constexpr int BK = 64;                   // k-tile: 64 bf16 = 128 bytes, one swizzle row
constexpr int STAGES = 4;                // shared-memory ring depth
constexpr int CONSUMERS = 2;             // consumer warpgroups, 64 rows each
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int GROUP_M = 16;              // tiles of M walked together (L2 reuse)
constexpr u32 A_BYTES = BM * BK * 2;     // 16 KiB
constexpr u32 B_BYTES = BN * BK * 2;     // 32 KiB
constexpr u32 STAGE_BYTES = A_BYTES + B_BYTES;
// Shared memory the host must grant: the ring, two barriers per stage, and slack to
// align the ring to 1024 bytes (the 128-byte swizzle repeats every 8 rows of 128 B).
constexpr u32 SMEM_BYTES = STAGES * STAGE_BYTES + 2 * STAGES * 8 + 1024;

#ifdef GEMM_OUT_F32
typedef float out_t;
#else
typedef unsigned short out_t;  // bf16 bits
#endif

// A CUtensorMap, opaque: the host encodes it (cuTensorMapEncodeTiled) and passes it by
// value as a __grid_constant__ parameter, where the TMA unit reads it.
struct alignas(64) TensorMap {
  u64 opaque[16];
};

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// ---- mbarriers -------------------------------------------------------------------
__device__ __forceinline__ void bar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA ---------------------------------------------------------------------------
// Copies the box at (x = k offset, y = row) of `map` into shared memory at `dst`;
// completion is counted on `bar` in bytes.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int x, int y, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// ---- wgmma -------------------------------------------------------------------------
// Shared-memory matrix descriptor for a K-major tile with the 128-byte swizzle: rows of
// 128 bytes, 8-row groups 1024 bytes apart (stride byte offset), start address in
// 16-byte units. The leading byte offset is unused in this mode.
__device__ __forceinline__ u64 smem_desc(u32 addr) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
         ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous
// wgmma boundary (the asm names every register as read and written).
__device__ __forceinline__ void fence_acc(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d[64x256] += A[64x16] * B[256x16]^T, both operands from shared memory.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], u64 da, u64 db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db));
}

// ---- output ------------------------------------------------------------------------
__device__ __forceinline__ void store_pair(out_t* p, float lo, float hi) {
#ifdef GEMM_OUT_F32
  *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
#else
  u32 packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  *reinterpret_cast<u32*>(p) = packed;
#endif
}

// What a consumer warp takes from the kernel (see consume()).
struct Consumer {
  u32 ring, full, empty;  // shared-memory addresses: the stage ring and its barriers
  int cw, warp, lane;     // consumer warpgroup (0 or 1), warp in the block, lane
  int tiles, tiles_m, tiles_n, ktiles, n;
  out_t* c;
};

// The trace a warp records into: `t`, or for a warp that does not record, none (base 0:
// its recorder writes nothing, not even its slot header, as for a warp that exited).
__device__ __forceinline__ tgpu::Trace trace_if(bool records, tgpu::Trace t) {
  if (!records) t.base = 0;
  return t;
}

// Tile t of the grid, in groups of GROUP_M tile-rows walked column by column.
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
#if GEMM_REPS > 1
  t %= tiles_m * tiles_n;
#endif
  const int per_group = GROUP_M * tiles_n;
  const int first_m = (t / per_group) * GROUP_M;
  const int rows = min(tiles_m - first_m, GROUP_M);
  const int in_group = t % per_group;
  tm = first_m + in_group % rows;
  tn = in_group / rows;
}

}  // namespace gemm

// The consumer warps' tiles: a template on R (this warp records), so that a warp that does
// not record runs a copy with no recorder calls in it, and one that does, a copy with no
// branch around them (the kernel picks the copy once). Without GEMM_TRACE_ONE_WARP every
// consumer warp records and only consume<true> is used.
template <bool R>
__device__ __forceinline__ void consume(const gemm::Consumer& k TGPU_TRACE_PARAM) {
  using namespace gemm;
  const u32 ring = k.ring, full = k.full, empty = k.empty;
  const int cw = k.cw, warp = k.warp, lane = k.lane;
  const int tiles = k.tiles, tiles_m = k.tiles_m, tiles_n = k.tiles_n, ktiles = k.ktiles, n = k.n;
  out_t* __restrict__ const c = k.c;
  GEMM_RECORDER_DECL(rec, trace_if(R, tgpu_trace), Wait, Mma, Epilogue, Tile, Release);
  int stage = 0;
  u32 phase = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int tm, tn;
    tile_coords(t, tiles_m, tiles_n, tm, tn);
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    int prev = -1;
    if (R && GEMM_TRACE_LEVEL >= 2) rec.begin<Tile>();
    if (R) rec.begin<Wait>();
    // The loop leaves after the last k-tile's Mma has begun, so its body holds one
    // Mma->Wait switch and no branch choosing between Wait and Epilogue: the switch
    // to Epilogue is after the loop.
    for (int kt = 0;;) {
      bar_wait(full + 8 * stage, phase);
      const u32 a = ring + stage * STAGE_BYTES + cw * (64 * BK * 2);
      const u32 b = ring + stage * STAGE_BYTES + A_BYTES;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        // 16 bf16 = 32 bytes along K inside the swizzled 128-byte row.
        wgmma_m64n256k16(d, smem_desc(a + kk * 32), smem_desc(b + kk * 32));
      }
      wgmma_commit();
      if (R) rec.switch_to<Wait, Mma>(kt);
      // One k-tile of wgmma stays in flight; the one before it is done, so its
      // stage can be handed back to the producer.
      wgmma_wait<1>();
      if (prev >= 0 && lane == 0) bar_arrive(empty + 8 * prev);
      if (R && GEMM_TRACE_LEVEL >= 2 && prev >= 0) rec.instant<Release>(kt - 1);
      prev = stage;
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
      if (++kt == ktiles) break;
      if (R) rec.switch_to<Mma, Wait>(kt - 1);
    }
    if (R) rec.switch_to<Mma, Epilogue>(ktiles - 1);
    wgmma_wait<0>();
    fence_acc(d);
    if (lane == 0) bar_arrive(empty + 8 * prev);

    // Epilogue. wgmma's accumulator layout: register 4j+{0,1} holds row lane/4,
    // columns 8j + 2(lane%4) + {0,1} of the warp's 16-row slice; 4j+{2,3} the row 8 below.
    const int w = warp % 4;
    const size_t row = (size_t)tm * BM + cw * 64 + w * 16 + lane / 4;
    out_t* c0 = c + row * n + (size_t)tn * BN + (lane % 4) * 2;
    out_t* c8 = c0 + 8 * (size_t)n;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      store_pair(c0 + 8 * j, d[4 * j], d[4 * j + 1]);
      store_pair(c8 + 8 * j, d[4 * j + 2], d[4 * j + 3]);
    }
    if (R) rec.end<Epilogue>(t);
    if (R && GEMM_TRACE_LEVEL >= 2) rec.end<Tile>(t);
  }
  rec.flush();
}

extern "C" __global__ void __launch_bounds__(gemm::THREADS, 1)
    tgpu_gemm_bf16(const __grid_constant__ gemm::TensorMap tma_a,
                   const __grid_constant__ gemm::TensorMap tma_b, gemm::out_t* __restrict__ c,
                   int m, int n, int k TGPU_TRACE_PARAM) {
  using namespace gemm;
  extern __shared__ unsigned char smem_raw[];
  const u32 ring = (smem_addr(smem_raw) + 1023) & ~1023u;
  const u32 full = ring + STAGES * STAGE_BYTES;  // STAGES barriers: data landed
  const u32 empty = full + STAGES * 8;           // STAGES barriers: stage free again

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int tiles_m = m / BM, tiles_n = n / BN, tiles = tiles_m * tiles_n * GEMM_REPS;
  const int ktiles = k / BK;

  if (threadIdx.x == 0) {
    u32 granted;
    asm("mov.u32 %0, %dynamic_smem_size;" : "=r"(granted));
    if (granted < SMEM_BYTES) __trap();  // the host sized the ring differently
    for (int s = 0; s < STAGES; ++s) {
      bar_init(full + 8 * s, 1);                  // the producer's expect_tx arrival
      bar_init(empty + 8 * s, CONSUMERS * 4);     // lane 0 of every consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    // Producer: registers are returned for the consumers' accumulators.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (warp != 0) return;
    GEMM_RECORDER_DECL(rec, tgpu_trace, ProdWait, Load);
    int stage = 0;
    u32 phase = 0;  // parity of the ring's current lap
    bool first_lap = true;
    rec.begin<ProdIdle>();
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int tm, tn;
      tile_coords(t, tiles_m, tiles_n, tm, tn);
      const bool last_tile = t + (int)gridDim.x >= tiles;
      for (int kt = 0; kt < ktiles; ++kt) {
        // The stage is free once every consumer warp released it on the previous lap.
        if (!first_lap) bar_wait(empty + 8 * stage, phase ^ 1);
        if (GEMM_TRACE_LEVEL >= 2) rec.switch_to<ProdIdle, Load>(kt);
        if (lane == 0) {
          const u32 a = ring + stage * STAGE_BYTES;
          bar_expect_tx(full + 8 * stage, STAGE_BYTES);
          tma_load(a, &tma_a, kt * BK, tm * BM, full + 8 * stage);
          tma_load(a + A_BYTES, &tma_b, kt * BK, tn * BN, full + 8 * stage);
        }
        // The block's last copy leaves the loop with its Load open (closed below), so
        // that the loop body has one recorder call and no branch around it.
        if (last_tile && kt + 1 == ktiles) break;
        rec.switch_to<Load, ProdIdle>(kt);
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
          first_lap = false;
        }
      }
    }
    rec.end<Load>(ktiles - 1);
    rec.flush();
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = warpgroup - 1;  // which 64 rows of the tile this warpgroup owns
    // Whether this warp records: every consumer warp, or with GEMM_TRACE_ONE_WARP one per
    // warpgroup (the four wait on the same stages and run the same wgmma, so one tells
    // their phases). That one is warp cw + 1 of the group: warps 5 and 10 of the block,
    // which under the usual assignment of warp i to SM sub-partition i mod 4 sit on
    // sub-partitions 1 and 2, apart from each other and from the producer's (0), so that
    // no sub-partition issues two warps' recording.
    const bool records = !GEMM_TRACE_ONE_WARP || warp % 4 == cw + 1;
    const Consumer args = {ring, full, empty, cw, warp, lane, tiles, tiles_m, tiles_n, ktiles, n, c};
    if (records) {
      consume<true>(args TGPU_TRACE_ARG);
    } else {
      consume<false>(args TGPU_TRACE_ARG);
    }
  }
}
