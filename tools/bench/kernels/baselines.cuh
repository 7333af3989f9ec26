// baselines.cuh: the recorders we compare ours against, and yardsticks, for benchmarks only.
//
// NOT part of the product: tracing-gpu's recorder is kernels/include/tracing_gpu.cuh, and
// nothing here is decoded by the library. Two are our reimplementations of published
// designs, written from their descriptions (not their code), so that the benchmark kernels
// can time them at the same call sites as ours; the others are yardsticks:
//   seed::Recorder        the seed (a CuTe DSL in-kernel SM profiler, as its PR describes it)
//   flashinfer::Recorder  FlashInfer's profiler (include/flashinfer/profiler.cuh)
//   bound::Recorder       the least any recorder of records does per range (see there)
//   staging::Recorder     the least that staging entries in the lanes does (see there)
//   stamps::Recorder      the timer reads at a recorder's call sites, and nothing else
// All have tgpu::Recorder's interface (begin, end, switch_to, instant, flush), so a kernel's
// `rec.` lines are the same in every build. Users, beside this file: recorder_bench.cu
// (the seed, the bound and staging) and gemm.cu (the seed, FlashInfer and the stamps). The hosts supply this
// file to NVRTC by name (`KernelBuild::header("baselines.cuh", ...)`); with nvcc, add
// -I tools/bench/kernels.
//
// Needs tracing_gpu.cuh first (for tgpu::Trace, the timer reads and detail::index_of, the
// gate on or off). NVRTC-safe like it: no includes, and valid for NVRTC 13.0 (no
// __builtin_offsetof in a static_assert).
#pragma once

namespace seed {

/// The seed's buffers: a per-(block, warp) append buffer of 5 x int64 records and one
/// record counter per warp in global memory, each on its own 128-byte line.
struct Buffer {
  unsigned long long* records;   // slot s: records + s * capacity * 5
  unsigned long long* counters;  // slot s: counters[s * 16] (128 bytes apart)
  unsigned int capacity;
  unsigned int slot_count;

  /// Both buffers in one allocation at `t.base`: the slot_count counters of 128 bytes,
  /// then slot_count x capacity records of 40 bytes (the GEMM's layout). `base == 0`
  /// records nothing, as with our recorder.
  __device__ __forceinline__ static Buffer packed(tgpu::Trace t) {
    Buffer b;
    b.counters = reinterpret_cast<unsigned long long*>(t.base);
    b.records = reinterpret_cast<unsigned long long*>(t.base + 128ull * t.slot_count);
    b.capacity = t.capacity;
    b.slot_count = t.base != 0 ? t.slot_count : 0u;
    return b;
  }

  /// This warp's slot: its (block, warp) in a 1-D grid of 1-D blocks.
  __device__ __forceinline__ static unsigned int warp_slot() {
    return blockIdx.x * ((blockDim.x + 31u) >> 5) + (threadIdx.x >> 5);
  }
  /// Whether this thread writes: lane 0 of a warp that has a slot.
  __device__ __forceinline__ bool writes(unsigned int slot) const {
    return (threadIdx.x & 31u) == 0 && slot < slot_count;
  }
  /// Record 0 of `slot` (records of up to 40 bytes).
  __device__ __forceinline__ unsigned long long* slot_records(unsigned int slot) const {
    return records + static_cast<unsigned long long>(slot) * capacity * 5;
  }
};

/// The seed's recorder: %globaltimer (64-bit) stamps, start times in registers through a
/// compile-time open-id map, a switch sharing one timer read, and lane 0 writing, in a
/// branch, {event id, start, end, smid, payload} at the warp's counter, which it loads
/// from and stores back to global memory on every record.
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

  template <class T>
  __device__ __forceinline__ void record(unsigned long long start, unsigned long long end, unsigned int payload) {
    if (writes_) {
      unsigned long long n;
      // The counter lives in global memory: a load and a store per event, as in the seed.
      asm volatile("ld.global.u64 %0, [%1];" : "=l"(n) : "l"(counter_) : "memory");
      if (n < capacity_) {
        unsigned long long* r = records_ + n * 5;
        const unsigned int sm = tgpu::smid();
        r[0] = T::id;
        r[1] = start;
        r[2] = end;
        r[3] = sm;
        r[4] = payload;
      }
      asm volatile("st.global.u64 [%0], %1;" ::"l"(counter_), "l"(n + 1) : "memory");
    }
  }

 public:
  __device__ __forceinline__ explicit Recorder(Buffer b) {
    const unsigned int slot = Buffer::warp_slot();
    writes_ = b.writes(slot);
    records_ = b.slot_records(slot);
    counter_ = b.counters + static_cast<unsigned long long>(slot) * 16;
    capacity_ = b.capacity;
    for (unsigned int i = 0; i < sizeof...(Events); ++i) start_[i] = 0;
  }
  template <class T>
  __device__ __forceinline__ void begin() {
    start_[slot_of<T>()] = tgpu::globaltimer();
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int payload = 0) {
    const unsigned long long t = tgpu::globaltimer();
    record<T>(start_[slot_of<T>()], t, payload);
  }
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int payload = 0) {
    const unsigned long long t = tgpu::globaltimer();
    record<A>(start_[slot_of<A>()], t, payload);
    start_[slot_of<B>()] = t;
  }
  template <class T>
  __device__ __forceinline__ void instant(unsigned int payload = 0) {
    const unsigned long long t = tgpu::globaltimer();
    record<T>(t, t, payload);
  }
  __device__ __forceinline__ void flush() {}
};

}  // namespace seed

namespace flashinfer {

/// FlashInfer's recorder: one 8-byte entry per event boundary, {tag, %globaltimer_lo}, the
/// tag packing smid, block, event id and begin/end/instant; a write pointer in registers
/// that strides over all (block, group) pairs, so entry i of every group lies together;
/// one writer thread per group (here lane 0 of each warp); __threadfence_block() around
/// every event; no payload, no fused switch (a switch is an end and a begin).
/// Buffer at `t.base`: entry 0 = {blocks, groups}, then the entries.
template <class... Events>
class Recorder {
  unsigned long long* ptr_;
  unsigned int stride_;
  unsigned int tag_;
  bool writes_;

  __device__ __forceinline__ void entry(unsigned int id, unsigned int type) {
    if (writes_) {
      const unsigned int t = tgpu::globaltimer_lo();
      *ptr_ = ((unsigned long long)t << 32) | (tag_ | (id << 2) | type);
      ptr_ += stride_;
    }
  }

 public:
  __device__ __forceinline__ explicit Recorder(tgpu::Trace t) {
    const unsigned int groups = blockDim.x / 32;
    unsigned long long* buf = reinterpret_cast<unsigned long long*>(t.base);
    writes_ = t.base != 0 && threadIdx.x % 32 == 0;
    if (writes_ && blockIdx.x == 0 && threadIdx.x == 0) {
      buf[0] = ((unsigned long long)groups << 32) | gridDim.x;
    }
    ptr_ = buf + 1 + blockIdx.x * groups + threadIdx.x / 32;
    stride_ = gridDim.x * groups;
    tag_ = (tgpu::smid() << 24) | ((blockIdx.x & 0xFFF) << 12);
  }
  template <class T>
  __device__ __forceinline__ void begin() {
    entry(T::id, 0);
    __threadfence_block();
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int = 0) {
    __threadfence_block();
    entry(T::id, 1);
  }
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int payload = 0) {
    end<A>(payload);
    begin<B>();
  }
  template <class T>
  __device__ __forceinline__ void instant(unsigned int = 0) {
    __threadfence_block();
    entry(T::id, 2);
    __threadfence_block();
  }
  __device__ __forceinline__ void flush() {}
};

}  // namespace flashinfer

namespace bound {

/// Not a recorder: a lower bound on what any recorder that keeps one 16-byte record per
/// range executes. Per range: the two stamps (plain 32-bit reads, as the bench's floor),
/// one store of {end, start, id, payload} by lane 0, and one address step. Nothing else:
/// no bounds check (the bench gives every warp room for all its events), no index, no
/// slot header, no duration, nothing kept for a flush, no guard against ptxas re-reading
/// a stamp. What ours costs beyond this is the price of what the issue asks for on top
/// (bounded capacity with exact drop counts, headers, exact stamps). Lane 0 of warp w
/// writes at seed::Buffer::records + w * capacity * 5 (the seed's region, which has room:
/// 40 bytes per record), so the bench allocates nothing for it.
template <class... Events>
class Recorder {
  unsigned long long ptr_;
  unsigned int writes_;
  unsigned int start_[sizeof...(Events)];

  template <class T>
  __host__ __device__ static constexpr unsigned int slot_of() {
    return tgpu::detail::index_of<T, Events...>::value;
  }

  __device__ __forceinline__ void store(unsigned int end, unsigned int start, unsigned int id,
                                        unsigned int payload) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\t"
        "@p st.global.cs.v4.u32 [%0], {%2, %3, %4, %5};\n\t}" ::"l"(ptr_),
        "r"(writes_), "r"(end), "r"(start), "r"(id), "r"(payload)
        : "memory");
    ptr_ += 16;
  }

 public:
  __device__ __forceinline__ explicit Recorder(seed::Buffer b) {
    const unsigned int slot = seed::Buffer::warp_slot();
    writes_ = b.writes(slot);
    ptr_ = reinterpret_cast<unsigned long long>(b.slot_records(slot));
    for (unsigned int i = 0; i < sizeof...(Events); ++i) start_[i] = 0;
  }
  template <class T>
  __device__ __forceinline__ void begin() {
    start_[slot_of<T>()] = tgpu::globaltimer_lo();
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int payload = 0) {
    store(tgpu::globaltimer_lo(), start_[slot_of<T>()], T::id, payload);
  }
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int payload = 0) {
    const unsigned int t = tgpu::globaltimer_lo();
    store(t, start_[slot_of<A>()], A::id, payload);
    start_[slot_of<B>()] = t;
  }
  template <class T>
  __device__ __forceinline__ void instant(unsigned int payload = 0) {
    const unsigned int t = tgpu::globaltimer_lo();
    store(t, t, T::id, payload);
  }
  __device__ __forceinline__ void flush() {}
};

}  // namespace bound

namespace staging {

/// Not a recorder: the least that staging entries in the warp's lanes, as recorder v2
/// does, executes per entry. The lane whose turn it is stamps (a predicated timer read, as
/// v2's) and takes the entry's word; the turn goes round the warp as a bit rotated one
/// place per entry (a funnel shift and a bit test). Nothing else: no count, no group test
/// and no group store (v2 tests for a full group after every entry and stores it). At the
/// flush each lane stores its last entry into the seed's region, so that ptxas keeps the
/// per-entry code. Every lane of the warp makes every call, as with v2.
template <class... Events>
class Recorder {
  unsigned long long sink_;  // this lane's 8 bytes in the seed's region; 0: no store
  unsigned int time_;
  unsigned int word_;
  unsigned int bit_;  // bit 0 set when the next entry is this lane's
  bool turn_;

  template <unsigned int Word>
  __device__ __forceinline__ void stage() {
    tgpu::detail::stamp_if<Word>(turn_, time_, word_);
    bit_ = __funnelshift_r(bit_, bit_, 1);
    turn_ = (bit_ & 1u) != 0;
  }

 public:
  __device__ __forceinline__ explicit Recorder(seed::Buffer b) {
    const unsigned int slot = seed::Buffer::warp_slot();
    const unsigned int lane = threadIdx.x & 31u;
    sink_ = slot < b.slot_count ? reinterpret_cast<unsigned long long>(b.slot_records(slot) + lane) : 0ull;
    time_ = 0;
    word_ = 0;
    bit_ = 1u << lane;
    turn_ = lane == 0u;
  }
  __device__ __forceinline__ ~Recorder() { flush(); }
  template <class T>
  __device__ __forceinline__ void begin() {
    stage<T::id | tgpu::ENTRY_BEGIN << 16>();
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int = 0) {
    stage<T::id | tgpu::ENTRY_END << 16>();
  }
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int = 0) {
    stage<B::id | tgpu::ENTRY_SWITCH << 16>();
  }
  template <class T>
  __device__ __forceinline__ void instant(unsigned int = 0) {
    stage<T::id | tgpu::ENTRY_INSTANT << 16>();
  }
  __device__ __forceinline__ void flush() {
    if (sink_ != 0) asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(sink_), "r"(time_), "r"(word_));
    sink_ = 0;
  }
};

}  // namespace staging

namespace stamps {

/// Not a recorder: the timer reads a recorder makes at its call sites, and nothing else,
/// what any recorder at those call sites pays at least. One bare `%globaltimer_lo` read
/// per call (a switch_to's one), in every lane as the bench floor's, each folded into a
/// register at the next call, not at once (consumed at once, a read stalls the warp until
/// it returns, which no recorder needs). At the flush lane 0 stores the fold at the warp's
/// 8 bytes from the trace's base (slot s at base + 8 s, if base is not 0), so that ptxas
/// keeps the reads. Nothing is recorded.
template <class... Events>
class Recorder {
  unsigned long long at_;  // where lane 0 stores the fold; 0: nowhere
  unsigned int prev_;
  unsigned int fold_;

  __device__ __forceinline__ void stamp() {
    const unsigned int t = tgpu::globaltimer_lo();
    fold_ ^= prev_;
    prev_ = t;
  }

 public:
  __device__ __forceinline__ explicit Recorder(tgpu::Trace trace) : prev_(0), fold_(0) {
    const unsigned int slot = seed::Buffer::warp_slot();
    at_ = trace.base != 0 && slot < trace.slot_count && (threadIdx.x & 31u) == 0 ? trace.base + 8ull * slot : 0ull;
  }
  __device__ __forceinline__ ~Recorder() { flush(); }
  template <class T>
  __device__ __forceinline__ void begin() {
    stamp();
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int = 0) {
    stamp();
  }
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int = 0) {
    stamp();
  }
  template <class T>
  __device__ __forceinline__ void instant(unsigned int = 0) {
    stamp();
  }
  __device__ __forceinline__ void flush() {
    if (at_ != 0) *reinterpret_cast<unsigned long long*>(at_) = (fold_ ^ prev_) | 1ull << 32;
    at_ = 0;
  }
};

}  // namespace stamps
