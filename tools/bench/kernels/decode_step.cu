// decode_step.cu: the kernels of one LLM decode step, for tools/bench/src/bin/decode_step.rs
// (the model and its launches: tools/bench/src/decode/). Plain CUDA C: bf16 data (raw bits
// in unsigned short, rounded to nearest even as the host's reference rounds), fp32
// accumulation. A layer is: rmsnorm, gemv (q/k/v), rope (and the KV cache append),
// attention (split over the cache, flash-decoding style), combine, gemv (o), residual,
// rmsnorm, gemv (gate/up), silu_mul, gemv (down), residual; a step starts with embed.
//
// Each kernel is instrumented as its author would: every warp records a range per phase
// (load / compute / reduce / store, or load / score / softmax / value / reduce / store for
// attention), 2 to 6 ranges, no payloads. The phases are block-wide steps, so every lane of
// every warp makes every call. Compiled by NVRTC twice: without TGPU_ENABLED (the gate
// off: the kernels a user ships, no trace parameter) and with TGPU_ENABLED=1.
//
// Shapes the host checks (tools/bench/src/decode/shape.rs): head dim HEAD_DIM, rows a
// multiple of 8, hidden and intermediate at most ROW_VECS * 8 * 256, batch at most
// MAX_BATCH, the cache at most CHUNK * CHUNK tokens (the combine's splits fit a block).
#include "tracing_gpu.cuh"

TGPU_EVENT(Load, 1);
TGPU_EVENT(Compute, 2);
TGPU_EVENT(Reduce, 3);
TGPU_EVENT(Store, 4);
TGPU_EVENT(Score, 5);
TGPU_EVENT(Softmax, 6);
TGPU_EVENT(Value, 7);

#define HEAD_DIM 128
#define MAX_BATCH 4
#define CHUNK 128      // tokens per attention split; the attention block's threads
#define ROW_VECS 4     // 8-element vectors per thread in the one-block-per-row kernels
#define GEMV_WARPS 4   // warps per gemv block
#define GEMV_ROWS 4    // output rows per gemv warp

#define NEG_INF __int_as_float(0xff800000)  // -inf (NVRTC has no math.h)

static_assert(CHUNK == HEAD_DIM, "attention and combine use one thread per token and per dim");

typedef unsigned short bf16;
typedef unsigned int u32;

// ---- bf16 ------------------------------------------------------------------------------

__device__ __forceinline__ float lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float to_f(bf16 h) { return __uint_as_float((u32)h << 16); }
// Round to nearest even (finite values), as the host's reference does.
__device__ __forceinline__ u32 to_bf(float f) {
  const u32 u = __float_as_uint(f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ u32 pack(float a, float b) { return to_bf(a) | (to_bf(b) << 16); }
__device__ __forceinline__ void unpack(uint4 v, float* f) {
  f[0] = lo(v.x); f[1] = hi(v.x); f[2] = lo(v.y); f[3] = hi(v.y);
  f[4] = lo(v.z); f[5] = hi(v.z); f[6] = lo(v.w); f[7] = hi(v.w);
}
__device__ __forceinline__ uint4 pack8(const float* f) {
  return make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
}
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  float s = lo(a.x) * lo(b.x);
  s = fmaf(hi(a.x), hi(b.x), s);
  s = fmaf(lo(a.y), lo(b.y), s);
  s = fmaf(hi(a.y), hi(b.y), s);
  s = fmaf(lo(a.z), lo(b.z), s);
  s = fmaf(hi(a.z), hi(b.z), s);
  s = fmaf(lo(a.w), lo(b.w), s);
  return fmaf(hi(a.w), hi(b.w), s);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- set-up (not instrumented, not timed) ----------------------------------------------

// p[i] = offset + scale * u, u uniform in [-1, 1) from a hash of (seed, i).
extern "C" __global__ void fill(bf16* p, unsigned long long n, u32 seed, float scale, float offset) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    u32 h = (u32)i * 0x9E3779B1u ^ (u32)(i >> 32) * 0x85EBCA77u ^ seed;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    const float u = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    p[i] = (bf16)to_bf(offset + scale * u);
  }
}

// ---- the step's kernels ----------------------------------------------------------------

// x[b] = table[tokens[b]]: one block of 256 threads per sequence.
extern "C" __global__ void __launch_bounds__(256)
    embed(const bf16* __restrict__ table, const u32* __restrict__ tokens, bf16* __restrict__ x,
          u32 hidden TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Load, Store);
  const u32 h8 = hidden / 8;
  const uint4* src = reinterpret_cast<const uint4*>(table) + (unsigned long long)tokens[blockIdx.x] * h8;
  uint4* dst = reinterpret_cast<uint4*>(x) + blockIdx.x * h8;
  uint4 v[ROW_VECS];
  rec.begin<Load>();
#pragma unroll
  for (int j = 0; j < ROW_VECS; ++j) {
    const u32 i = threadIdx.x + j * 256;
    if (i < h8) v[j] = src[i];
  }
  rec.switch_to<Load, Store>();
#pragma unroll
  for (int j = 0; j < ROW_VECS; ++j) {
    const u32 i = threadIdx.x + j * 256;
    if (i < h8) dst[i] = v[j];
  }
  rec.end<Store>();
}

// out[b] = x[b] / sqrt(mean(x[b]^2) + eps) * weight: one block of 256 threads per sequence.
extern "C" __global__ void __launch_bounds__(256)
    rmsnorm(const bf16* __restrict__ x, const bf16* __restrict__ weight, bf16* __restrict__ out,
            u32 hidden, float eps TGPU_TRACE_PARAM) {
  __shared__ float part[8];
  TGPU_RECORDER(rec, Load, Reduce, Compute, Store);
  const u32 h8 = hidden / 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint4* src = reinterpret_cast<const uint4*>(x) + blockIdx.x * h8;
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  uint4* dst = reinterpret_cast<uint4*>(out) + blockIdx.x * h8;
  uint4 v[ROW_VECS];
  rec.begin<Load>();
#pragma unroll
  for (int j = 0; j < ROW_VECS; ++j) {
    const u32 i = threadIdx.x + j * 256;
    v[j] = i < h8 ? src[i] : make_uint4(0, 0, 0, 0);
  }
  rec.switch_to<Load, Reduce>();
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < ROW_VECS; ++j) ss += dot8(v[j], v[j]);
  ss = warp_sum(ss);
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) total += part[k];
  const float inv = rsqrtf(total / (float)hidden + eps);
  rec.switch_to<Reduce, Compute>();
#pragma unroll
  for (int j = 0; j < ROW_VECS; ++j) {
    const u32 i = threadIdx.x + j * 256;
    if (i < h8) {
      float a[8], g[8];
      unpack(v[j], a);
      unpack(w[i], g);
#pragma unroll
      for (int e = 0; e < 8; ++e) a[e] = a[e] * inv * g[e];
      v[j] = pack8(a);
    }
  }
  rec.switch_to<Compute, Store>();
#pragma unroll
  for (int j = 0; j < ROW_VECS; ++j) {
    const u32 i = threadIdx.x + j * 256;
    if (i < h8) dst[i] = v[j];
  }
  rec.end<Store>();
}

// y[b][r] = sum_k w[r][k] x[b][k] for r < rows (w row-major, rows x cols, cols a multiple
// of 8): GEMV_WARPS warps a block, GEMV_ROWS rows a warp, the batch's x staged in dynamic
// shared memory (batch * cols bf16).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ y, u32 rows,
         u32 cols, u32 batch TGPU_TRACE_PARAM) {
  extern __shared__ uint4 xs[];
  TGPU_RECORDER(rec, Load, Compute, Reduce, Store);
  const u32 c8 = cols / 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const u32 row0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  rec.begin<Load>();
  for (u32 i = threadIdx.x; i < batch * c8; i += blockDim.x) xs[i] = xv[i];
  __syncthreads();
  rec.switch_to<Load, Compute>();
  float acc[GEMV_ROWS][MAX_BATCH];
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b) acc[r][b] = 0.0f;
#pragma unroll 2
  for (u32 c = lane; c < c8; c += 32) {
    uint4 wr[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
      wr[r] = row0 + r < rows ? __ldg(wv + (unsigned long long)(row0 + r) * c8 + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b) {
      if (b < batch) {
        const uint4 xb = xs[b * c8 + c];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) acc[r][b] += dot8(wr[r], xb);
      }
    }
  }
  rec.switch_to<Compute, Reduce>();
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
    for (int b = 0; b < MAX_BATCH; ++b)
      if (b < batch) acc[r][b] = warp_sum(acc[r][b]);
  rec.switch_to<Reduce, Store>();
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
      for (int b = 0; b < MAX_BATCH; ++b)
        if (b < batch && row0 + r < rows) y[b * rows + row0 + r] = (bf16)to_bf(acc[r][b]);
  }
  rec.end<Store>();
}

// Rotary embedding (rotate-half: element i with i + HEAD_DIM/2, angle pos * theta^(-2i/HEAD_DIM))
// of the q and k heads of qkv ([batch][heads + 2 kv_heads][HEAD_DIM]), in place, and the k
// and v heads of the token at `pos` appended to the caches ([batch][kv_heads][max_tokens]
// [HEAD_DIM]): one warp per head, 4 warps a block.
extern "C" __global__ void __launch_bounds__(128)
    rope(bf16* __restrict__ qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, u32 heads,
         u32 kv_heads, u32 batch, u32 pos, u32 max_tokens, float theta TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Load, Compute, Store);
  const u32 lane = threadIdx.x & 31, per = heads + 2 * kv_heads;
  const u32 g = blockIdx.x * 4 + (threadIdx.x >> 5);
  const bool live = g < batch * per;
  const u32 b = live ? g / per : 0, head = live ? g % per : 0;
  bf16* v = qkv + (unsigned long long)g * HEAD_DIM;
  constexpr u32 HALF = HEAD_DIM / 2;
  float x1[HALF / 32], x2[HALF / 32];
  rec.begin<Load>();
#pragma unroll
  for (int j = 0; j < HALF / 32; ++j) {
    x1[j] = live ? to_f(v[lane + 32 * j]) : 0.0f;
    x2[j] = live ? to_f(v[lane + 32 * j + HALF]) : 0.0f;
  }
  rec.switch_to<Load, Compute>();
  if (head < heads + kv_heads) {
#pragma unroll
    for (int j = 0; j < HALF / 32; ++j) {
      const u32 i = lane + 32 * j;
      const float freq = powf(theta, -(float)(2 * i) / (float)HEAD_DIM);
      float s, c;
      sincosf((float)pos * freq, &s, &c);
      const float a = x1[j] * c - x2[j] * s, d = x2[j] * c + x1[j] * s;
      x1[j] = a;
      x2[j] = d;
    }
  }
  rec.switch_to<Compute, Store>();
  if (live) {
    bf16* cache = nullptr;
    if (head >= heads + kv_heads) cache = v_cache + ((unsigned long long)(b * kv_heads + head - heads - kv_heads) * max_tokens + pos) * HEAD_DIM;
    else if (head >= heads) cache = k_cache + ((unsigned long long)(b * kv_heads + head - heads) * max_tokens + pos) * HEAD_DIM;
#pragma unroll
    for (int j = 0; j < HALF / 32; ++j) {
      const bf16 a = (bf16)to_bf(x1[j]), d = (bf16)to_bf(x2[j]);
      v[lane + 32 * j] = a;
      v[lane + 32 * j + HALF] = d;
      if (cache) {
        cache[lane + 32 * j] = a;
        cache[lane + 32 * j + HALF] = d;
      }
    }
  }
  rec.end<Store>();
}

// One split of decode attention: query head blockIdx.y of sequence blockIdx.z over the
// cache's tokens [blockIdx.x * CHUNK, + CHUNK) (of `tokens`), with kv head
// blockIdx.y / (heads / kv_heads). Writes the split's unnormalized output
// part_o[b][h][split][HEAD_DIM] and its max and sum part_ml[b][h][split][2] (fp32).
extern "C" __global__ void __launch_bounds__(CHUNK)
    attention(const bf16* __restrict__ qkv, const bf16* __restrict__ k_cache,
              const bf16* __restrict__ v_cache, float* __restrict__ part_o, float* __restrict__ part_ml,
              u32 heads, u32 kv_heads, u32 tokens, u32 max_tokens, float scale TGPU_TRACE_PARAM) {
  __shared__ float p[CHUNK];
  __shared__ float red[2][4];
  __shared__ float acc_s[4][HEAD_DIM];
  TGPU_RECORDER(rec, Load, Score, Softmax, Value, Reduce, Store);
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const u32 split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
  const u32 kvh = h / (heads / kv_heads);
  const u32 t0 = split * CHUNK, n = tokens - t0 < CHUNK ? tokens - t0 : CHUNK;
  const unsigned long long kv_base = ((unsigned long long)(b * kv_heads + kvh) * max_tokens + t0) * HEAD_DIM;
  // Half a warp per token in the scores: lane % 16 holds dims (lane % 16) * 8 .. + 8.
  const uint4* kc = reinterpret_cast<const uint4*>(k_cache + kv_base);
  const uint2* vc = reinterpret_cast<const uint2*>(v_cache + kv_base);
  const u32 per = heads + 2 * kv_heads, sub = lane & 15;
  rec.begin<Load>();
  float q[8];
  unpack(reinterpret_cast<const uint4*>(qkv + ((unsigned long long)b * per + h) * HEAD_DIM)[sub], q);
  rec.switch_to<Load, Score>();
  // Four tokens' keys loaded before any is used, as a kernel author keeps loads in
  // flight: left to `#pragma unroll 4`, ptxas issued them one at a time in some builds
  // and four at a time in others, and the step's time moved by what one loop's schedule
  // did, not by what the recorder costs (docs/lab/performance-history.md, session 28).
  for (u32 j0 = warp * 2 + (lane >> 4); j0 < CHUNK; j0 += 32) {
    uint4 kw[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const u32 j = j0 + 8 * u;
      kw[u] = j < n ? kc[j * (HEAD_DIM / 8) + sub] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const u32 j = j0 + 8 * u;
      float kf[8];
      unpack(kw[u], kf);
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(q[e], kf[e], s);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (sub == 0) p[j] = j < n ? s * scale : NEG_INF;
    }
  }
  __syncthreads();
  rec.switch_to<Score, Softmax>();
  const float sc = p[tid];
  float m = warp_max(sc);
  if (lane == 0) red[0][warp] = m;
  __syncthreads();
  m = fmaxf(fmaxf(red[0][0], red[0][1]), fmaxf(red[0][2], red[0][3]));
  const float e = tid < n ? expf(sc - m) : 0.0f;
  p[tid] = e;
  const float ls = warp_sum(e);
  if (lane == 0) red[1][warp] = ls;
  __syncthreads();
  const float l = red[1][0] + red[1][1] + red[1][2] + red[1][3];
  rec.switch_to<Softmax, Value>();
  // Warp w takes tokens w, w + 4, ...; lane holds dims lane * 4 .. + 4.
  float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Four tokens' values in flight at once, as the keys above.
  for (u32 j0 = warp; j0 < n; j0 += 16) {
    uint2 vv[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const u32 j = j0 + 4 * u;
      vv[u] = j < n ? vc[j * (HEAD_DIM / 4) + lane] : make_uint2(0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const u32 j = j0 + 4 * u;
      if (j < n) {
        const float pj = p[j];
        o[0] = fmaf(pj, lo(vv[u].x), o[0]);
        o[1] = fmaf(pj, hi(vv[u].x), o[1]);
        o[2] = fmaf(pj, lo(vv[u].y), o[2]);
        o[3] = fmaf(pj, hi(vv[u].y), o[3]);
      }
    }
  }
  rec.switch_to<Value, Reduce>();
#pragma unroll
  for (int d = 0; d < 4; ++d) acc_s[warp][lane * 4 + d] = o[d];
  __syncthreads();
  const float out = acc_s[0][tid] + acc_s[1][tid] + acc_s[2][tid] + acc_s[3][tid];
  rec.switch_to<Reduce, Store>();
  const unsigned long long at = ((unsigned long long)(b * heads + h) * splits + split);
  part_o[at * HEAD_DIM + tid] = out;
  if (tid == 0) {
    part_ml[at * 2] = m;
    part_ml[at * 2 + 1] = l;
  }
  rec.end<Store>();
}

// The splits of head blockIdx.x of sequence blockIdx.y combined: out[b][h * HEAD_DIM + d]
// = sum_s e^(m_s - M) o_s[d] / sum_s e^(m_s - M) l_s, M the splits' max. One thread per dim.
extern "C" __global__ void __launch_bounds__(HEAD_DIM)
    combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, bf16* __restrict__ out,
            u32 heads, u32 splits TGPU_TRACE_PARAM) {
  __shared__ float ml[2][CHUNK];
  TGPU_RECORDER(rec, Load, Reduce, Compute, Store);
  const u32 tid = threadIdx.x, h = blockIdx.x, b = blockIdx.y;
  const unsigned long long at = (unsigned long long)(b * heads + h) * splits;
  rec.begin<Load>();
  if (tid < splits) {
    ml[0][tid] = part_ml[(at + tid) * 2];
    ml[1][tid] = part_ml[(at + tid) * 2 + 1];
  }
  __syncthreads();
  rec.switch_to<Load, Reduce>();
  float m = NEG_INF;
  for (u32 s = 0; s < splits; ++s) m = fmaxf(m, ml[0][s]);
  float l = 0.0f;
  for (u32 s = 0; s < splits; ++s) l += expf(ml[0][s] - m) * ml[1][s];
  rec.switch_to<Reduce, Compute>();
  float o = 0.0f;
  for (u32 s = 0; s < splits; ++s) o = fmaf(expf(ml[0][s] - m), part_o[(at + s) * HEAD_DIM + tid], o);
  o /= l;
  rec.switch_to<Compute, Store>();
  out[(unsigned long long)b * heads * HEAD_DIM + h * HEAD_DIM + tid] = (bf16)to_bf(o);
  rec.end<Store>();
}

// x += y, n8 vectors of 8 (the batch's residual stream): a thread per vector.
extern "C" __global__ void __launch_bounds__(256)
    residual(bf16* __restrict__ x, const bf16* __restrict__ y, u32 n8 TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Load, Compute, Store);
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  uint4 a = make_uint4(0, 0, 0, 0), d = a;
  rec.begin<Load>();
  if (i < n8) {
    a = reinterpret_cast<const uint4*>(x)[i];
    d = reinterpret_cast<const uint4*>(y)[i];
  }
  rec.switch_to<Load, Compute>();
  float fa[8], fd[8];
  unpack(a, fa);
  unpack(d, fd);
#pragma unroll
  for (int e = 0; e < 8; ++e) fa[e] += fd[e];
  a = pack8(fa);
  rec.switch_to<Compute, Store>();
  if (i < n8) reinterpret_cast<uint4*>(x)[i] = a;
  rec.end<Store>();
}

// a[b][i] = silu(gu[b][i]) * gu[b][inter + i] (gate, then up, in one row of 2 * inter):
// a thread per vector of 8, inter a multiple of 8.
extern "C" __global__ void __launch_bounds__(256)
    silu_mul(const bf16* __restrict__ gu, bf16* __restrict__ a, u32 inter, u32 batch TGPU_TRACE_PARAM) {
  TGPU_RECORDER(rec, Load, Compute, Store);
  const u32 i8 = inter / 8, t = blockIdx.x * blockDim.x + threadIdx.x;
  const bool live = t < batch * i8;
  const u32 b = live ? t / i8 : 0, i = live ? t % i8 : 0;
  const uint4* row = reinterpret_cast<const uint4*>(gu) + b * 2 * i8;
  uint4 g = make_uint4(0, 0, 0, 0), u = g;
  rec.begin<Load>();
  if (live) {
    g = row[i];
    u = row[i8 + i];
  }
  rec.switch_to<Load, Compute>();
  float fg[8], fu[8];
  unpack(g, fg);
  unpack(u, fu);
#pragma unroll
  for (int e = 0; e < 8; ++e) fg[e] = fg[e] / (1.0f + expf(-fg[e])) * fu[e];
  g = pack8(fg);
  rec.switch_to<Compute, Store>();
  if (live) reinterpret_cast<uint4*>(a)[t] = g;
  rec.end<Store>();
}
