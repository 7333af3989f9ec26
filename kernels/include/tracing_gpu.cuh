// tracing_gpu.cuh: the tracing-gpu device recorder (the wire format: docs/format.md).
//
// Header-only, C++17, NVRTC-safe: it includes nothing, not even device headers.
//
// Each warp owns one slot of a trace buffer, found from its (block, warp); no atomics. The
// argument may sample: only the warps it names (a mask per block, of every n-th block) have
// slots and record, and each warp learns whether it is one when its recorder is made.
// Two recorders write it, with the same API; TGPU_FORMAT picks one at compile time:
//   2 (the default): one 8-byte entry per phase boundary (a switch_to is one), staged in
//     the warp's lanes, the n-th entry of a group in lane n's registers, and stored 32 at
//     a time with one coalesced store; the host rebuilds begin/end pairs and nesting. Per
//     event: a compare, the stamp, the entry's word, a count and the group test. A warp
//     that records nothing writes nothing.
//   1: one 16-byte record per range, stored by lane 0 at the warp's next event. A warp's
//     state lives in registers (about 12, plus one start time per event type): `begin`
//     and `end` never touch memory except for one evict-first store per record.
// The host needs no setting: the buffer is the same, and each slot says which it holds.
//
// Streaming (v2 built with TGPU_STREAM=1, chosen per launch by TRACE_STREAM in the
// argument, for kernels that run for seconds): the buffer is host memory mapped into the
// device, and each warp's slot a ring of 256-byte chunks that the host drains while the
// kernel runs. A group is then a chunk of up to 31 entries (the warp's first lane stores
// its meta), written to the ring's next place; when the host has not freed one, the chunk
// is dropped and counted. The events' code is the same in both modes; only the group store
// and the flush differ. Without TGPU_STREAM=1 there is no streaming code at all (the
// fixed-slot path pays nothing for it), and a streaming argument records nothing.
//
// TGPU_KEEP_SLOT=1 (v2): a warp keeps its slot's address in three registers once found at
// its first group store, instead of finding it again at every one. For kernels with
// registers to spare: it made the GEMM of tools/bench cheaper to record; a kernel short of
// registers may pay more than it saves (see the define below).
//
//   #include "tracing_gpu.cuh"
//   TGPU_EVENT(Load, 1);                       // user event types: a name and a 16-bit id
//   TGPU_EVENT(Mma, 2);
//   extern "C" __global__ void gemm(const float* a, float* c, int kt
//                                   TGPU_TRACE_PARAM) {   // ", tgpu::Trace tgpu_trace" or nothing
//     TGPU_RECORDER(rec, Load, Mma);           // every thread of the warp; lane 0 writes
//     rec.begin<Load>();
//     for (int k = 0; k < kt; ++k) {
//       ...                                    // load tile k
//       rec.switch_to<Load, Mma>(k);           // end Load (payload k), begin Mma: one stamp
//       ...                                    // mma on tile k
//       rec.switch_to<Mma, Load>(k);
//     }
//     rec.end<Load>(kt);
//   }                                          // the destructor flushes the slot header
//
// API (all in namespace tgpu unless a macro):
//   TGPU_EVENT(Name, id)          declares an event type (a struct with Name::id)
//   TGPU_TRACE_PARAM              appended to a kernel's parameter list
//   TGPU_TRACE_ARG                forwards the trace to a device function taking TGPU_TRACE_PARAM
//   TGPU_RECORDER(rec, Ev...)     declares the warp's recorder over those event types
//   rec.begin<T>()                opens T's range (v1: restarts it if open; v2: ranges
//                                 must nest, and T's must not be open)
//   rec.end<T>(payload = 0)       closes T's range (v2: the innermost) with a 32-bit
//                                 payload (v2: an entry more, only if one is passed)
//   rec.switch_to<A, B>(payload)  closes A (with payload) and opens B at one timer read
//                                 (v2: A is the innermost open range)
//   rec.instant<T>(payload = 0)   records an instant
//   rec.flush()                   writes the slot header now (the destructor does it anyway)
//   Trace                         the kernel argument (base, capacity, slot_count, and the
//                                 sampling: which warps of which blocks record)
//   globaltimer(), globaltimer_lo(), smid()   the raw reads, with the gate on or off
// Ranges of different types nest; a type's ranges do not nest with themselves. Events
// after flush() are not recorded. Every lane of the warp (v2: every lane active when the
// recorder is constructed) makes every call. v1 stores a record at the warp's next event
// (or the flush), so the store sits inside the next range, out of the way of the stamps;
// v2 stores a group when its 32nd entry is staged, or at the flush.
//
// The gate: compile with TGPU_ENABLED=1 to record. With TGPU_ENABLED undefined or 0, the
// kernel keeps its production parameter list and every call compiles to nothing: the PTX
// is identical to the same kernel with the instrumentation deleted
// (tests/recorder_compile.rs proves it). Arguments are still evaluated when the gate is off,
// as for any inline call, so keep payload expressions free of side effects.
//
// Where each call stamps: the timer reads carry a "memory" clobber, so the memory
// operations (loads, stores, barriers, async copies) issued between two calls stay inside
// the range. The compiler may still move pure register arithmetic across a stamp, as with
// any clock read.
#pragma once

namespace tgpu {

// ---------------------------------------------------------------------------------------
// Wire format v1. tests/header_constants.rs reads every `enum : unsigned int { NAME = V };`
// line of the header and checks it against src/format/wire.rs, by namespace and name.
// They are enumerators, not constexpr variables, because NVRTC emits a namespace-scope
// constexpr variable into the PTX as a global even when nothing uses it, and the gated-off
// kernel must not change.
// ---------------------------------------------------------------------------------------

/// "TGPU" as a little-endian u32: the first word of every buffer (written by the host).
enum : unsigned int { BUFFER_MAGIC = 0x55504754u };
/// "SLOT" as a little-endian u32: written by lane 0 when its warp flushes the slot.
enum : unsigned int { SLOT_MAGIC = 0x544F4C53u };
/// Wire format version.
enum : unsigned int { VERSION = 1u };
/// Size of the host-written buffer header.
enum : unsigned int { BUFFER_HEADER_SIZE = 64u };
/// Size of a slot header.
enum : unsigned int { SLOT_HEADER_SIZE = 64u };
/// Size of one record.
enum : unsigned int { RECORD_SIZE = 16u };
/// Record kind: a closed range [end - duration, end].
enum : unsigned int { KIND_RANGE = 0u };
/// Record kind: an instant at end (duration 0).
enum : unsigned int { KIND_INSTANT = 1u };
/// Slot flag: %smid at flush differs from %smid at the first event.
enum : unsigned int { SLOT_FLAG_MIGRATED = 1u };
/// Slot flag: a range was still open when the slot was flushed (it is not recorded).
enum : unsigned int { SLOT_FLAG_OPEN_AT_FLUSH = 2u };
/// Cluster rank written before sm_90 (no thread-block clusters).
enum : unsigned int { NO_CLUSTER = 0xFFFFFFFFu };

/// Byte offsets in the buffer header (written by the host; the device never reads it).
namespace buffer_offsets {
enum : unsigned int { MAGIC = 0u };
enum : unsigned int { VERSION = 4u };
enum : unsigned int { HEADER_SIZE = 6u };
enum : unsigned int { SLOT_HEADER_SIZE = 8u };
enum : unsigned int { RECORD_SIZE = 10u };
enum : unsigned int { SLOT_CAPACITY = 12u };
enum : unsigned int { SLOT_COUNT = 16u };
enum : unsigned int { WARPS_PER_BLOCK = 20u };
enum : unsigned int { LAUNCH_ID = 24u };
enum : unsigned int { GRID = 32u };
enum : unsigned int { BLOCK = 44u };
enum : unsigned int { FLAGS = 56u };
enum : unsigned int { RESERVED = 60u };
}  // namespace buffer_offsets

/// Byte offsets in a slot header (written by lane 0 at flush).
namespace slot_offsets {
enum : unsigned int { MAGIC = 0u };
enum : unsigned int { FLAGS = 4u };
enum : unsigned int { FIRST_TS = 8u };
enum : unsigned int { LAST_TS = 16u };
enum : unsigned int { SM_FIRST = 24u };
enum : unsigned int { SM_LAST = 28u };
enum : unsigned int { BLOCK_LINEAR = 32u };
enum : unsigned int { BLOCK_XYZ = 36u };
enum : unsigned int { WARP = 48u };
enum : unsigned int { CLUSTER_RANK = 52u };
enum : unsigned int { RECORD_COUNT = 56u };
enum : unsigned int { EVENTS_LOST = 60u };
}  // namespace slot_offsets

/// Byte offsets in a record.
namespace record_offsets {
enum : unsigned int { END_LO = 0u };
enum : unsigned int { DURATION = 4u };
enum : unsigned int { EVENT_ID = 8u };
enum : unsigned int { KIND = 10u };
enum : unsigned int { PAYLOAD = 12u };
}  // namespace record_offsets

// The flush writes the slot header as four 16-byte words and a record as one; these
// pin the word layout those stores assume to the offsets above.
static_assert(slot_offsets::MAGIC == 0 && slot_offsets::FLAGS == 4 && slot_offsets::FIRST_TS == 8,
              "slot header word 0: magic, flags, first_ts");
static_assert(slot_offsets::LAST_TS == 16 && slot_offsets::SM_FIRST == 24 && slot_offsets::SM_LAST == 28,
              "slot header word 1: last_ts, sm_first, sm_last");
static_assert(slot_offsets::BLOCK_LINEAR == 32 && slot_offsets::BLOCK_XYZ == 36,
              "slot header word 2: block_linear, block x y z");
static_assert(slot_offsets::WARP == 48 && slot_offsets::CLUSTER_RANK == 52 &&
                  slot_offsets::RECORD_COUNT == 56 && slot_offsets::EVENTS_LOST == 60,
              "slot header word 3: warp, cluster_rank, record_count, events_lost");
static_assert(record_offsets::END_LO == 0 && record_offsets::DURATION == 4 && record_offsets::EVENT_ID == 8 &&
                  record_offsets::KIND == 10 && record_offsets::PAYLOAD == 12 && RECORD_SIZE == 16,
              "record: end_lo, duration, event_id | kind << 16, payload");

// Record format v2 (docs/format.md, "Slot format v2"): the buffer and the slots are laid
// out as in v1 (the host cannot tell, and need not), but a slot whose magic is
// SLOT_MAGIC_V2 holds 8-byte entries, one per phase boundary, up to 2 x capacity of them:
// {time_lo, event_id | kind << 16}. Begin/end pairs and their nesting are rebuilt on the
// host; a payload is one more entry, after the entry it belongs to.

/// "SLT2" as a little-endian u32: the magic of a slot of v2 entries (written at flush).
enum : unsigned int { SLOT_MAGIC_V2 = 0x32544C53u };
/// Size of one v2 entry.
enum : unsigned int { ENTRY_SIZE = 8u };
/// Entry kind: a range of event_id opens.
enum : unsigned int { ENTRY_BEGIN = 0u };
/// Entry kind: the innermost open range closes; it must be event_id's.
enum : unsigned int { ENTRY_END = 1u };
/// Entry kind: the innermost open range closes and one of event_id opens, at one time.
enum : unsigned int { ENTRY_SWITCH = 2u };
/// Entry kind: an instant of event_id.
enum : unsigned int { ENTRY_INSTANT = 3u };
/// Entry kind: the time field holds the payload of the event the previous entry ended.
enum : unsigned int { ENTRY_PAYLOAD = 4u };
/// Deepest nesting a v2 slot may hold: a Recorder has at most 32 event types, and a type's
/// ranges do not nest with themselves.
enum : unsigned int { MAX_DEPTH = 32u };

/// Byte offsets in a v2 slot header (written by lane 0 at flush, but EVENTS_LOST, which the
/// warp adds to where it drops entries; bytes 44-63 stay zero).
namespace slot_v2_offsets {
enum : unsigned int { MAGIC = 0u };
enum : unsigned int { ENTRY_COUNT = 4u };
enum : unsigned int { LAST_TS = 8u };
enum : unsigned int { ANCHOR_TS = 16u };
enum : unsigned int { ENTRIES_LOST = 24u };
enum : unsigned int { SM = 28u };
enum : unsigned int { SLOT = 32u };
enum : unsigned int { CLUSTER_RANK = 36u };
enum : unsigned int { EVENTS_LOST = 40u };
enum : unsigned int { RESERVED = 44u };
}  // namespace slot_v2_offsets

/// Byte offsets in a v2 entry.
namespace entry_offsets {
enum : unsigned int { TIME_LO = 0u };
enum : unsigned int { EVENT_ID = 4u };
enum : unsigned int { KIND = 6u };
}  // namespace entry_offsets

static_assert(slot_v2_offsets::MAGIC == 0 && slot_v2_offsets::ENTRY_COUNT == 4 && slot_v2_offsets::LAST_TS == 8,
              "v2 slot header word 0: magic, entry_count, last_ts");
static_assert(slot_v2_offsets::ANCHOR_TS == 16 && slot_v2_offsets::ENTRIES_LOST == 24 && slot_v2_offsets::SM == 28,
              "v2 slot header word 1: anchor_ts, entries_lost, sm");
static_assert(slot_v2_offsets::SLOT == 32 && slot_v2_offsets::CLUSTER_RANK == 36,
              "v2 slot header: slot, cluster_rank as one 8-byte store");
static_assert(ENTRY_SWITCH == ENTRY_END + 1 && ENTRY_INSTANT == ENTRY_END + 2 && ENTRY_PAYLOAD == ENTRY_INSTANT + 1,
              "the kinds that end an event (end, switch, instant) are consecutive: detail::ends_event");
static_assert(entry_offsets::TIME_LO == 0 && entry_offsets::EVENT_ID == 4 && entry_offsets::KIND == 6 &&
                  ENTRY_SIZE == 8 && 2 * ENTRY_SIZE == RECORD_SIZE,
              "entry: time_lo, event_id | kind << 16; two entries take a record's room");

/// `Trace::capacity` with this bit set: `base` is the address of the buffer's address
/// (a kernel node of a captured graph, whose replay's prologue writes it; 0 = off).
enum : unsigned int { TRACE_INDIRECT = 0x80000000u };

// Streaming (docs/format.md, "Streaming slots"): a v2 warp's slot is a ring of 256-byte
// chunks in host memory mapped into the device, which the host drains while the kernel runs.

/// `Trace::capacity` with this bit set: the buffer is in mapped host memory and each slot a
/// ring of `capacity / 16` chunks (v2 only; never with TRACE_INDIRECT).
enum : unsigned int { TRACE_STREAM = 0x40000000u };
/// "STM2" as a little-endian u32: the magic of a streaming slot (written at flush).
enum : unsigned int { SLOT_MAGIC_STREAM = 0x324D5453u };
/// Size of one chunk of a ring: 31 entries and the meta, one 8-byte store per lane.
enum : unsigned int { CHUNK_SIZE = 256u };
/// Entries a chunk holds at most (positions 0-30; the meta is position 31).
enum : unsigned int { CHUNK_ENTRIES = 31u };
/// Set in every entry's kind and in the meta's info, so that no stored word is zero.
enum : unsigned int { STREAM_MARK = 0x8000u };
/// Meta info flag: entries of this warp were dropped since its previous chunk.
enum : unsigned int { CHUNK_GAP = 0x20u };
/// Meta info bits that hold the chunk's entry count.
enum : unsigned int { CHUNK_COUNT_MASK = 0x1Fu };
/// Meta info bits 6-14 hold %smid's low bits: the host names a warp's SM before it flushes.
enum : unsigned int { CHUNK_SM_SHIFT = 6u };
/// The %smid bits of the meta info, shifted down.
enum : unsigned int { CHUNK_SM_MASK = 0x1FFu };

/// Byte offsets in a streaming slot header (the warp's first lane writes bytes 0-35 at
/// flush; the host writes READ while the kernel runs; the rest stays zero).
namespace slot_stream_offsets {
enum : unsigned int { MAGIC = 0u };
enum : unsigned int { CHUNKS = 4u };
enum : unsigned int { LAST_TS = 8u };
enum : unsigned int { ENTRY_COUNT = 16u };
enum : unsigned int { EVENTS_LOST = 20u };
enum : unsigned int { SM = 24u };
enum : unsigned int { SLOT = 28u };
enum : unsigned int { CLUSTER_RANK = 32u };
enum : unsigned int { RESERVED = 36u };
enum : unsigned int { READ = 48u };
enum : unsigned int { RESERVED_AFTER_READ = 52u };
}  // namespace slot_stream_offsets

/// Byte offsets in a chunk: entries from 0, the meta in the last 8 bytes.
namespace chunk_offsets {
enum : unsigned int { STAMP_LO = 248u };
enum : unsigned int { STAMP_MID = 252u };
enum : unsigned int { INFO = 254u };
}  // namespace chunk_offsets

static_assert(slot_stream_offsets::MAGIC == 0 && slot_stream_offsets::CHUNKS == 4 && slot_stream_offsets::LAST_TS == 8,
              "stream slot header word 0: magic, chunks, last_ts");
static_assert(slot_stream_offsets::ENTRY_COUNT == 16 && slot_stream_offsets::EVENTS_LOST == 20 &&
                  slot_stream_offsets::SM == 24 && slot_stream_offsets::SLOT == 28,
              "stream slot header word 1: entry_count, events_lost, sm, slot");
static_assert(slot_stream_offsets::CLUSTER_RANK == 32 && slot_stream_offsets::RESERVED == 36,
              "stream slot header: cluster_rank, the flush's last word");
static_assert(CHUNK_SIZE == (CHUNK_ENTRIES + 1) * ENTRY_SIZE && chunk_offsets::STAMP_LO == CHUNK_ENTRIES * ENTRY_SIZE &&
                  chunk_offsets::STAMP_MID == chunk_offsets::STAMP_LO + 4 &&
                  chunk_offsets::INFO == chunk_offsets::STAMP_MID + 2,
              "chunk: 31 entries, then stamp_lo, stamp_mid | info << 16 as the 32nd lane's 8 bytes");
static_assert(CHUNK_SIZE % RECORD_SIZE == 0 && CHUNK_COUNT_MASK >= CHUNK_ENTRIES && (CHUNK_GAP & CHUNK_COUNT_MASK) == 0,
              "a chunk takes whole records; n and the gap flag share the info field");
static_assert(((CHUNK_SM_MASK << CHUNK_SM_SHIFT) & (STREAM_MARK | CHUNK_GAP | CHUNK_COUNT_MASK)) == 0 &&
                  (CHUNK_SM_MASK << CHUNK_SM_SHIFT) < STREAM_MARK,
              "the info field: the mark, the SM, the gap flag and n do not overlap");
static_assert(((0xFFFFFFFFu * ENTRY_SIZE) & (CHUNK_SIZE - 1u)) == chunk_offsets::STAMP_LO,
              "the recorder's first lane (rank ~0) stores at the meta's place");

// Watch mode (v2 streaming built with TGPU_WATCH=1; docs/format.md, "Watch cells"): each
// warp keeps what it is doing now in a cell of the streamed buffer, after the rings, which
// the host reads while the kernel runs: a head (started or done, the SM), then one record
// per nesting depth, written when an entry is stamped, by the lane that stamps it. A begin
// writes its depth's record, an end the record where its range was (so the records above
// the open ranges never hold an open one), a switch rewrites the innermost, an instant
// writes above the open ones; each record also carries what the warp closed last.

/// "WTCH" as a little-endian u32: a watch cell's head once its warp has started.
enum : unsigned int { WATCH_MAGIC = 0x48435457u };
/// "WEND" as a little-endian u32: a watch cell's head once its warp has flushed.
enum : unsigned int { WATCH_MAGIC_DONE = 0x444E4557u };
/// Size of a watch cell's head and of each of its records.
enum : unsigned int { WATCH_RECORD_SIZE = 16u };
/// Records per watch cell, one per depth: MAX_DEPTH open ranges and the record above them.
enum : unsigned int { WATCH_RECORDS = 33u };
/// Size of one warp's watch cell: the head, then WATCH_RECORDS records.
enum : unsigned int { WATCH_CELL_SIZE = 544u };
/// Watch record flags: set in every record, so that a written record is never zero.
enum : unsigned int { WATCH_MARK = 0x8000u };
/// Watch record flags bits that hold the entry's kind (ENTRY_BEGIN to ENTRY_INSTANT).
enum : unsigned int { WATCH_KIND_MASK = 0x7u };
/// Watch record flag: the warp had closed a range (or made an instant) by this entry; the
/// record's CLOSED_ID says which, the latest.
enum : unsigned int { WATCH_CLOSED = 0x8u };
/// Watch record flag: that range was closed with a payload, the record's PAYLOAD.
enum : unsigned int { WATCH_PAYLOAD = 0x10u };
/// Watch record flags bits 5-14: the warp's entry count, modulo 1024 (orders two records
/// stamped at one timer value).
enum : unsigned int { WATCH_SEQ_SHIFT = 5u };
/// The entry count's bits, shifted down.
enum : unsigned int { WATCH_SEQ_MASK = 0x3FFu };

/// Byte offsets in a watch cell's head (its warp's first lane writes it at construction
/// and at flush).
namespace watch_head_offsets {
enum : unsigned int { MAGIC = 0u };
enum : unsigned int { SM = 4u };
enum : unsigned int { TIME = 8u };
}  // namespace watch_head_offsets

/// Byte offsets in a watch record (one 16-byte store by the lane that stamped the entry).
namespace watch_offsets {
enum : unsigned int { TIME_LO = 0u };
enum : unsigned int { TIME_MID = 4u };
enum : unsigned int { FLAGS = 6u };
enum : unsigned int { EVENT_ID = 8u };
enum : unsigned int { CLOSED_ID = 10u };
enum : unsigned int { PAYLOAD = 12u };
}  // namespace watch_offsets

static_assert(WATCH_CELL_SIZE == WATCH_RECORD_SIZE * (WATCH_RECORDS + 1) && WATCH_RECORDS == MAX_DEPTH + 1,
              "a watch cell: the head, a record per depth of open ranges, and one above the deepest");
static_assert(watch_offsets::TIME_MID == 4 && watch_offsets::FLAGS == 6 && watch_offsets::EVENT_ID == 8 &&
                  watch_offsets::CLOSED_ID == 10 && watch_offsets::PAYLOAD == 12,
              "watch record: time_lo, time_mid | flags << 16, event_id | closed_id << 16, payload");
static_assert(ENTRY_INSTANT <= WATCH_KIND_MASK && (WATCH_KIND_MASK & (WATCH_CLOSED | WATCH_PAYLOAD)) == 0 &&
                  WATCH_CLOSED << 1 == WATCH_PAYLOAD && WATCH_PAYLOAD << 1 == 1u << WATCH_SEQ_SHIFT &&
                  (WATCH_SEQ_MASK << WATCH_SEQ_SHIFT) + (1u << WATCH_SEQ_SHIFT) == WATCH_MARK,
              "watch flags: the kind, closed, payload, the entry count and the mark, in that order");

/// The kernel argument: passed by value, so the device reads it from the parameter bank.
/// Mirrors `tracing_gpu::format::KernelArg`. `base == 0` records nothing. The last four
/// words are the sampling (docs/format.md, "Sampling"): which warps of which blocks
/// record; all zero, every warp.
struct Trace {
  /// Device address 64 bytes before slot 0 (the buffer's header, or in a sampled buffer
  /// its sampling block); 0 turns recording off for the launch.
  unsigned long long base;
  /// Records per slot; with `TRACE_INDIRECT`, `base` points at the buffer's address; with
  /// `TRACE_STREAM`, each slot is a ring (v2).
  unsigned int capacity;
  /// Number of slots: one per sampled warp; a warp whose slot would not be below it
  /// records nothing.
  unsigned int slot_count;
  /// The warps of each sampled block that record (bit w: warp w); 0: every warp.
  unsigned int warp_mask;
  /// Every block_stride-th block records, from block_offset on; 0 or 1: every block.
  unsigned int block_stride;
  /// The first block that records (with block_stride).
  unsigned int block_offset;
  /// One launch in launch_every records: the host's choice, carried for the record (an
  /// unsampled launch gets base 0); the device does not read it.
  unsigned int launch_every;
};
// (NVRTC 13.0 has no __builtin_offsetof: the field order above, with the size and
// alignment below, fixes the offsets at 0, 8, 12, 16, 20, 24 and 28.)
static_assert(sizeof(Trace) == 32 && alignof(Trace) == 8, "Trace is format::KernelArg: 32 bytes, 8-aligned");

namespace detail {

// Metafunctions answer with enumerators, never static constexpr members, which NVRTC
// would emit as globals (see the wire-format block).
template <class A, class B>
struct same {
  enum : bool { value = false };
};
template <class A>
struct same<A, A> {
  enum : bool { value = true };
};

/// Position of T in Ts... (compile time): the register that holds T's start time.
template <class T, class... Ts>
struct index_of;
template <class T, class... Ts>
struct index_of<T, T, Ts...> {
  enum : unsigned int { value = 0 };
};
template <class T, class U, class... Ts>
struct index_of<T, U, Ts...> {
  enum : unsigned int { value = 1 + index_of<T, Ts...>::value };
};

template <class T, class... Ts>
__host__ __device__ constexpr bool contains() {
  return (false || ... || same<T, Ts>::value);
}

template <class... Ts>
struct distinct {
  enum : bool { value = true };
};
template <class T, class... Ts>
struct distinct<T, Ts...> {
  enum : bool { value = !contains<T, Ts...>() && distinct<Ts...>::value };
};

/// Compile-time checks shared by the recording and the gated-off recorder, so that a
/// kernel that is wrong with the gate on does not compile with it off either.
template <class... Events>
struct checks {
  static_assert(sizeof...(Events) >= 1, "a Recorder needs at least one event type");
  static_assert(sizeof...(Events) <= 32, "a Recorder holds at most 32 event types");
  static_assert(distinct<Events...>::value, "each event type may appear once in a Recorder");
  template <class T>
  __host__ __device__ static constexpr bool has() {
    return contains<T, Events...>();
  }
};

}  // namespace detail
}  // namespace tgpu

namespace tgpu {

// Clock and place reads, available with the gate on or off (unused, they emit nothing).
// volatile: two reads are never merged, hoisted or dropped by the front end; "memory":
// loads and stores issued between two stamps stay between them. ptxas, though, may read
// the timer again where a plain read's value is used (it rematerializes it); the
// Recorder's own stamps are predicated reads, which it keeps where they are (see there).

/// `%globaltimer`: device nanoseconds (64-bit), the clock every record is in.
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
  return t;
}

/// The low 32 bits of `%globaltimer`: one instruction cheaper to use than the full read.
__device__ __forceinline__ unsigned int globaltimer_lo() {
  unsigned int t;
  asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t) : : "memory");
  return t;
}

/// `%smid`: the SM this warp runs on now.
__device__ __forceinline__ unsigned int smid() {
  unsigned int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

namespace detail {

// If `p`: `%globaltimer_lo` into `time` and `Word` into `word`, in one asm block: recorder
// v2's stamp (a predicated read, which ptxas keeps where it is: see v1's
// store_pending_and_stamp). Here, with the gate on or off, for the bench's yardstick of
// v2's staging (tools/bench/kernels/baselines.cuh), which is built with the gate off.
template <unsigned int Word>
__device__ __forceinline__ void stamp_if(bool p, unsigned int& time, unsigned int& word) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.u32 p, %2, 0;\n\t"
      "@p mov.u32 %0, %%globaltimer_lo;\n\t"
      "@p mov.u32 %1, %3;\n\t}"
      : "+r"(time), "+r"(word)
      : "r"(static_cast<unsigned int>(p)), "n"(Word)
      : "memory");
}

}  // namespace detail

}  // namespace tgpu

/// Declares an event type: `TGPU_EVENT(Load, 1);` gives `struct Load` with `Load::id == 1`.
/// Ids are 16-bit and must be distinct within a kernel; the host registry maps them to names.
#define TGPU_EVENT(Name, Id)                                             \
  struct Name {                                                          \
    static_assert((Id) >= 0 && (Id) <= 0xFFFF, "event ids are 16-bit"); \
    enum : unsigned int { id = (Id) };                                   \
  }

#if defined(TGPU_ENABLED) && TGPU_ENABLED

/// Appended to a kernel's parameter list: `, tgpu::Trace tgpu_trace` (nothing when off).
#define TGPU_TRACE_PARAM , ::tgpu::Trace tgpu_trace
/// Forwards the trace to a device function declared with TGPU_TRACE_PARAM (nothing when off).
#define TGPU_TRACE_ARG , tgpu_trace
/// Declares `name`, a recorder of the listed event types, on the kernel's trace.
#define TGPU_RECORDER(name, ...) ::tgpu::Recorder<__VA_ARGS__> name(tgpu_trace)
/// The record format the recorder writes: 2 (8-byte entries, staged across the warp's
/// lanes; the default) or 1 (16-byte records, one store per range by lane 0). The host
/// reads both from the same buffer: each slot says which it holds.
#ifndef TGPU_FORMAT
#define TGPU_FORMAT 2
#endif
#if TGPU_FORMAT != 1 && TGPU_FORMAT != 2
#error "TGPU_FORMAT is 1 or 2"
#endif

// TGPU_STREAM=1 builds the streaming code into the v2 recorder (a launch then streams
// when its argument says so, and records into fixed slots otherwise). Without it, the
// v2 recorder has no streaming code, so its fixed-slot path pays nothing for it, and a
// streaming argument records nothing.
// TGPU_WATCH=1 (v2, streaming): watch mode. Each warp of a streamed launch also keeps
// what it is doing now in its watch cell, in the mapped buffer after the rings, so that
// the host sees where every warp is while the kernel runs, or hangs: the lane that stamps
// an entry stores it there at once (one 16-byte store per entry, into host memory). It
// implies TGPU_STREAM=1. Without it the recorder has no watch code: the PTX is the same
// as before watch mode existed (tests/recorder_watch.rs).
#ifndef TGPU_WATCH
#define TGPU_WATCH 0
#endif
#if TGPU_WATCH
#if TGPU_FORMAT != 2
#error "TGPU_WATCH=1 needs the v2 recorder (TGPU_FORMAT=2)"
#endif
#ifndef TGPU_STREAM
#define TGPU_STREAM 1
#elif !TGPU_STREAM
#error "TGPU_WATCH=1 needs TGPU_STREAM=1: the watch cells live in the streamed buffer"
#endif
#endif

#ifndef TGPU_STREAM
#define TGPU_STREAM 0
#endif

// TGPU_KEEP_SLOT=1 (v2): a warp finds its slot at its first group store and keeps the
// slot's address in registers, instead of finding it again at every group store. Fewer
// cycles per group store for kernels with registers to spare (on the H200 the GEMM's
// per-k-tile phases +0.35 to +0.69 % instead of +0.85 to +1.21 % in the same runs); three
// registers held, which in a kernel short of them can cost more than it saves (the dense
// and streamed kernels of tools/bench: +4.5 % instead of +0.5 %, +35 % instead of +2 %:
// docs/performance.md, "What bounds the recorder goals left").
#ifndef TGPU_KEEP_SLOT
#define TGPU_KEEP_SLOT 0
#endif

namespace tgpu {
namespace detail {

__device__ __forceinline__ unsigned int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  return NO_CLUSTER;
#endif
}

__device__ __forceinline__ unsigned int thread_linear() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

__device__ __forceinline__ unsigned int block_linear() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

__device__ __forceinline__ void store4(unsigned long long addr, unsigned int a, unsigned int b, unsigned int c,
                                       unsigned int d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}

__device__ __forceinline__ void store2(unsigned long long addr, unsigned int a, unsigned int b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(addr), "r"(a), "r"(b));
}

__device__ __forceinline__ void store1(unsigned long long addr, unsigned int a) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(addr), "r"(a));
}

// A word the host writes while the kernel runs (a streaming slot's `read`), into `v` if
// `load`: a volatile load, that is relaxed at system scope, not cached and never merged
// with another. When the lanes of a warp load one address with one instruction, the warp
// sends one request and every lane receives its one answer.
__device__ __forceinline__ void load_volatile_if(bool load, unsigned long long addr, unsigned int& v) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.u32 p, %2, 0;\n\t"
      "@p ld.volatile.global.u32 %0, [%1];\n\t}"
      : "+r"(v)
      : "l"(addr), "r"(static_cast<unsigned int>(load))
      : "memory");
}

// Whether `p` holds in any active lane of the warp.
__device__ __forceinline__ bool any(bool p) {
  unsigned int active, r;
  asm volatile("activemask.b32 %0;" : "=r"(active));
  asm volatile(
      "{\n\t.reg .pred p, q;\n\t"
      "setp.ne.u32 p, %1, 0;\n\t"
      "vote.sync.any.pred q, p, %2;\n\t"
      "selp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(r)
      : "r"(static_cast<unsigned int>(p)), "r"(active));
  return r != 0;
}

// Whether this warp records under the argument's sampling and, if it does, its slot: the
// sampled warps numbered block by block (the sampled blocks in order, in each its sampled
// warps in order), so that the buffer holds slots for them alone and the host maps a slot
// back to its (block, warp) (docs/format.md, "Sampling"). A warp whose slot would not be
// below slot_count records nothing. Every recorder asks it once, at construction: a warp
// that is not sampled takes its recorder's not-recording path from there, and no event
// pays for sampling.
__device__ __forceinline__ bool sampled_slot(const Trace& trace, unsigned int& slot) {
  const unsigned int warps = (blockDim.x * blockDim.y * blockDim.z + 31u) >> 5;  // at most 32
  const unsigned int warp = thread_linear() >> 5;
  const unsigned int block = block_linear();
  const unsigned int mask =
      (trace.warp_mask != 0u ? trace.warp_mask : ~0u) & (warps >= 32u ? ~0u : (1u << warps) - 1u);
  const unsigned int stride = trace.block_stride > 1u ? trace.block_stride : 1u;
  const unsigned int from = block - trace.block_offset;  // wraps below the offset
  const unsigned int rank = stride > 1u ? from / stride : from;
  slot = rank * __popc(mask) + __popc(mask & ((1u << warp) - 1u));
  return block >= trace.block_offset && rank * stride == from && ((mask >> warp) & 1u) != 0u &&
         slot < trace.slot_count;
}

// store2, if `store`.
__device__ __forceinline__ void store2_if(bool store, unsigned long long addr, unsigned int a, unsigned int b) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.u32 p, %0, 0;\n\t"
      "@p st.global.v2.u32 [%1], {%2, %3};\n\t}" ::"r"(static_cast<unsigned int>(store)),
      "l"(addr), "r"(a), "r"(b));
}

// Whether a staged v2 entry (its word: event_id | kind << 16, without STREAM_MARK) ends an
// event: an end, a switch or an instant (consecutive kinds); a begin or a payload does not.
// (store_or_count makes the same test in its asm.)
__device__ __forceinline__ bool ends_event(unsigned int word) {
  return word - (ENTRY_END << 16) < ((ENTRY_INSTANT - ENTRY_END + 1) << 16);
}

// If `when`, which every active lane of the warp has alike: the mask of the active lanes
// whose `p` holds; 0 otherwise (predicated, not branched around).
__device__ __forceinline__ unsigned int ballot_if(bool when, bool p) {
  unsigned int active, m = 0u;
  asm volatile("activemask.b32 %0;" : "=r"(active));
  asm volatile(
      "{\n\t.reg .pred w, q;\n\t"
      "setp.ne.u32 w, %1, 0;\n\t"
      "setp.ne.u32 q, %2, 0;\n\t"
      "@w vote.sync.ballot.b32 %0, q, %3;\n\t}"
      : "+r"(m)
      : "r"(static_cast<unsigned int>(when)), "r"(static_cast<unsigned int>(p)), "r"(active));
  return m;
}

// A fixed slot's entry `i` of `cap` (the slot's header at `h`): stored if it fits; else, if
// it ends an event, counted lost: 1 added to the header's events_lost (a reduction in device
// memory, which returns nothing and which nothing waits for). Each lane counts its own
// entry: no vote, which inside the group store would put a convergence barrier on every
// event's path (recorder_sass.rs counts it). One asm block, the addresses made in it from
// `h`, so that the count holds no register and adds no branch to the store's code.
__device__ __forceinline__ void store_or_count(unsigned long long h, unsigned int i, unsigned int cap,
                                               unsigned int time, unsigned int word) {
  asm volatile(
      "{\n\t.reg .pred p, q;\n\t.reg .b32 k;\n\t.reg .b64 a;\n\t"
      "setp.lt.u32 p, %1, %2;\n\t"
      "mad.wide.u32 a, %1, %7, %0;\n\t"
      "@p st.global.v2.u32 [a+%8], {%3, %4};\n\t"
      "sub.u32 k, %4, %5;\n\t"
      "setp.lt.u32.and q, k, %6, !p;\n\t"
      "@q red.global.add.u32 [%0+%9], 1;\n\t}" ::"l"(h),
      "r"(i), "r"(cap), "r"(time), "r"(word), "n"(ENTRY_END << 16), "n"((ENTRY_INSTANT - ENTRY_END + 1) << 16),
      "n"(ENTRY_SIZE * 1u), "n"(SLOT_HEADER_SIZE * 1u), "n"(slot_v2_offsets::EVENTS_LOST * 1u)
      : "memory");
}

#if TGPU_WATCH
// Watch mode's stamp, in place of stamp_if (and of stage_with's stamp): if `p`, the
// timer's 64 bits read once, its low half into `time` and `Word` into `word`, as the stamp
// does, and the entry published at once in the watch cell whose record 0 is at `cell`:
// record `at` (the low byte of `rec`; above MAX_DEPTH it stores nothing, which is how a
// warp that does not watch stores nothing), {time_lo, time bits 32-47 | flags << 16,
// event_id | closed id << 16, payload}. `last` holds the closed id << 16 | the WATCH_CLOSED
// and WATCH_PAYLOAD flags, `payload` its payload; `rec` >> 8 the entry count. If `q`, the
// payload entry of stage_with (its payload is `payload`) goes into `time` and `word`. One
// asm block, so that the store stays with the stamp, and the stamp a predicated read.
template <unsigned int Word>
__device__ __forceinline__ void watch_stamp_if(bool p, bool q, unsigned int& time, unsigned int& high,
                                               unsigned int& word, unsigned long long cell, unsigned int rec,
                                               unsigned int last, unsigned int payload) {
  asm volatile(
      "{\n\t.reg .pred p, q, s;\n\t.reg .b64 t, a;\n\t.reg .b32 lo, hi, at, f, g;\n\t"
      "setp.ne.u32 p, %3, 0;\n\t"
      "setp.ne.u32 q, %4, 0;\n\t"
      "and.b32 at, %6, 0xFF;\n\t"
      "setp.le.u32.and s, at, %10, p;\n\t"
      "mov.u64 t, 0;\n\t"
      "@p mov.u64 t, %%globaltimer;\n\t"
      "mov.b64 {lo, hi}, t;\n\t"
      "@p mov.u32 %0, lo;\n\t"
      "@p mov.u32 %1, hi;\n\t"
      "@p mov.u32 %2, %11;\n\t"
      "@q mov.u32 %0, %8;\n\t"
      "@q mov.u32 %2, %12;\n\t"
      "shr.b32 f, %6, 8;\n\t"
      "bfi.b32 f, f, %7, %14, 10;\n\t"
      "shl.b32 f, f, 16;\n\t"
      "and.b32 hi, hi, 0xFFFF;\n\t"
      "or.b32 hi, hi, f;\n\t"
      "or.b32 hi, hi, %9;\n\t"
      "and.b32 g, %7, 0xFFFF0000;\n\t"
      "or.b32 g, g, %13;\n\t"
      "mad.wide.u32 a, at, %15, %5;\n\t"
      "@s st.global.v4.u32 [a], {lo, hi, g, %8};\n\t}"
      : "+r"(time), "+r"(high), "+r"(word)
      : "r"(static_cast<unsigned int>(p)), "r"(static_cast<unsigned int>(q)), "l"(cell), "r"(rec), "r"(last),
        "r"(payload), "r"((WATCH_MARK | (Word >> 16)) << 16), "n"(MAX_DEPTH * 1u), "n"(Word),
        "n"(ENTRY_PAYLOAD << 16), "n"(Word & 0xFFFFu), "n"(WATCH_SEQ_SHIFT * 1u), "n"(WATCH_RECORD_SIZE * 1u)
      : "memory");
}

#endif  // TGPU_WATCH

}  // namespace detail

#if TGPU_FORMAT == 1

/// A warp's recorder over the event types `Events...` (with the gate on, format v1).
///
/// Every lane runs the same straight-line code; only the store is predicated, on one
/// compare that folds "lane 0", "slot in range" and "slot not full" (lanes that never
/// write get a limit of 0).
///
/// The store is deferred by one event: an event stamps the time into a pending record held
/// in registers, and the next event (or the flush) stores it. So the store, its compare and
/// its address come before the next stamp in program order and the compiler schedules them
/// inside the user's range, in the shadow of its work; what is left between the work and
/// the stamp is the timer read itself.
template <class... Events>
class Recorder {
  using Checks = detail::checks<Events...>;
  enum : unsigned int { N = sizeof...(Events) };

  unsigned long long rec0_;   // address of record 0 of this warp's slot; 0 if this lane never writes
  unsigned int idx_;          // index of the pending record; 0xFFFFFFFF before the first event
  unsigned int lim_;          // capacity if this lane writes, else 0
  unsigned int pend_[4];      // the pending record: end_lo, duration, id | kind << 16, payload
  unsigned int start_[N];     // start time (low 32 bits) of each type's open range
  unsigned int open_;         // bit i: a range of Events[i] is open
  unsigned int sm_first_;     // %smid at construction
  unsigned long long first_;  // %globaltimer at construction

  template <class T>
  __host__ __device__ static constexpr unsigned int slot_of() {
    static_assert(Checks::template has<T>(), "event type not in this Recorder's list");
    return detail::index_of<T, Events...>::value;
  }

  template <class T, unsigned int Kind>
  __host__ __device__ static constexpr unsigned int word() {
    return static_cast<unsigned int>(T::id) | (Kind << 16);
  }

  // Every stamp is a *predicated* timer read: only a lane that writes (lim_ != 0) reads,
  // into a register that the other lanes leave as it was. ptxas takes a plain read of
  // %globaltimer_lo for a side-effect-free value and may rematerialize it, that is, read
  // the timer again where the value is needed instead of keeping it: seen with ptxas 13.5
  // (sm_90a, the GEMM of tools/bench/kernels/gemm.cu), where a stamp held in a uniform
  // register and needed in a vector register by the deferred store was read anew at that
  // store, moving the record's end by the length of the next phase. A predicated read
  // merges with the register's old value, which a second read cannot reproduce, so it
  // stays where it is. (tools/bench/tests/: recorder_sass.rs, gemm_kernel.rs count them.)

  // Stores the pending record (if there is one and it fits), steps the index, then reads
  // the timer into pend_[0] (the next pending record's end) and returns it: all in one asm
  // block, so that everything but the stamp comes ahead of it in the PTX (ptxas does not
  // move instructions up across a timer read; here it is free to schedule them into the
  // user's range). idx_ == 0xFFFFFFFF (no pending record yet) fails the compare as a full
  // slot does. The 16 is RECORD_SIZE (static_asserted above).
  __device__ __forceinline__ unsigned int store_pending_and_stamp() {
    asm volatile(
        "{\n\t.reg .pred p, q;\n\t.reg .b64 a;\n\t"
        "mad.wide.u32 a, %1, 16, %2;\n\t"
        "setp.lt.u32 p, %1, %3;\n\t"
        "@p st.global.cs.v4.u32 [a], {%0, %4, %5, %6};\n\t"
        "add.u32 %1, %1, 1;\n\t"
        "setp.ne.u32 q, %3, 0;\n\t"
        "@q mov.u32 %0, %%globaltimer_lo;\n\t}"
        : "+r"(pend_[0]), "+r"(idx_)
        : "l"(rec0_), "r"(lim_), "r"(pend_[1]), "r"(pend_[2]), "r"(pend_[3])
        : "memory");
    return pend_[0];
  }

  __device__ __forceinline__ void set_pending(unsigned int end, unsigned int duration, unsigned int word,
                                              unsigned int payload) {
    pend_[0] = end;
    pend_[1] = duration;
    pend_[2] = word;
    pend_[3] = payload;
  }

 public:
  /// Finds this warp's slot and stamps the start. Call it in every thread of the warp
  /// (only lane 0 writes); one recorder per warp per launch.
  __device__ __forceinline__ explicit Recorder(Trace trace) : idx_(0xFFFFFFFFu), open_(0) {
    unsigned int slot;
    // A streaming argument is for v2 only (docs/format.md): with it, v1 records nothing.
    const bool lane = detail::sampled_slot(trace, slot) && (detail::thread_linear() & 31u) == 0 &&
                      !(trace.capacity & TRACE_STREAM);
    // Whether to stamp the start: decided from the argument alone, so that a graph node's
    // load below is waited for only where its result is first used (the first store).
    const bool stamps = lane && trace.base != 0;
    if (trace.capacity & TRACE_INDIRECT) {
      // A kernel node of a graph: each replay's prologue has written where its buffer is.
      trace.capacity &= ~TRACE_INDIRECT;
      trace.base = trace.base != 0 ? *reinterpret_cast<const unsigned long long*>(trace.base) : 0ull;
    }
    const bool writes = lane && trace.base != 0;
    const unsigned long long stride =
        SLOT_HEADER_SIZE + static_cast<unsigned long long>(trace.capacity) * RECORD_SIZE;
    rec0_ = writes ? trace.base + BUFFER_HEADER_SIZE + slot * stride + SLOT_HEADER_SIZE : 0ull;
    lim_ = writes ? trace.capacity : 0u;
    // Predicated like the stamps (see store_pending_and_stamp): first_ stays in registers
    // until the flush writes it as the slot's first_ts, a long way for ptxas to be tempted
    // to read the timer again instead.
    first_ = 0;
    asm volatile(
        "{\n\t.reg .pred q;\n\t"
        "setp.ne.u32 q, %1, 0;\n\t"
        "@q mov.u64 %0, %%globaltimer;\n\t}"
        : "+l"(first_)
        : "r"(static_cast<unsigned int>(stamps))
        : "memory");
    sm_first_ = smid();
    set_pending(0u, 0u, 0u, 0u);
    // An end<T>() without its begin<T>() then spans from the recorder's start: still a
    // valid range.
    for (unsigned int i = 0; i < N; ++i) start_[i] = static_cast<unsigned int>(first_);
  }

  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Flushes the slot, unless flush() already did.
  __device__ __forceinline__ ~Recorder() { flush(); }

  /// Opens a range of type T. A second begin<T>() before end<T>() restarts it.
  template <class T>
  __device__ __forceinline__ void begin() {
    constexpr unsigned int i = slot_of<T>();
    // The stamp, predicated as store_pending_and_stamp's (see there why).
    asm volatile(
        "{\n\t.reg .pred q;\n\t"
        "setp.ne.u32 q, %1, 0;\n\t"
        "@q mov.u32 %0, %%globaltimer_lo;\n\t}"
        : "+r"(start_[i])
        : "r"(lim_)
        : "memory");
    open_ |= 1u << i;
  }

  /// Closes T's range: one record [begin, now] with a 32-bit payload.
  template <class T>
  __device__ __forceinline__ void end(unsigned int payload = 0) {
    constexpr unsigned int i = slot_of<T>();
    const unsigned int t = store_pending_and_stamp();
    set_pending(t, t - start_[i], word<T, KIND_RANGE>(), payload);
    open_ &= ~(1u << i);
  }

  /// Closes A's range (with `payload`) and opens B's at the same instant: one timer read.
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int payload = 0) {
    constexpr unsigned int a = slot_of<A>();
    constexpr unsigned int b = slot_of<B>();
    const unsigned int t = store_pending_and_stamp();
    set_pending(t, t - start_[a], word<A, KIND_RANGE>(), payload);
    start_[b] = t;
    open_ = (open_ & ~(1u << a)) | (1u << b);
  }

  /// Records an instant of type T with a 32-bit payload.
  template <class T>
  __device__ __forceinline__ void instant(unsigned int payload = 0) {
    (void)slot_of<T>();
    const unsigned int t = store_pending_and_stamp();
    set_pending(t, 0u, word<T, KIND_INSTANT>(), payload);
  }

  /// Stores the pending record, writes the slot header (lane 0 of a recording warp) and
  /// stops recording. Later calls, the destructor's included, do nothing.
  __device__ __forceinline__ void flush() {
    if (rec0_ != 0) {
      const unsigned long long last = globaltimer();
      if (idx_ < lim_) {
        detail::store4(rec0_ + static_cast<unsigned long long>(idx_) * RECORD_SIZE, pend_[0], pend_[1], pend_[2],
                       pend_[3]);
      }
      const unsigned int events = idx_ + 1;  // wraps to 0 when there was none
      const unsigned int kept = events < lim_ ? events : lim_;
      const unsigned int sm_last = smid();
      const unsigned int flags =
          (sm_last != sm_first_ ? SLOT_FLAG_MIGRATED : 0u) | (open_ != 0 ? SLOT_FLAG_OPEN_AT_FLUSH : 0u);
      const unsigned long long h = rec0_ - SLOT_HEADER_SIZE;
      detail::store4(h, SLOT_MAGIC, flags, static_cast<unsigned int>(first_),
                     static_cast<unsigned int>(first_ >> 32));
      detail::store4(h + 16, static_cast<unsigned int>(last), static_cast<unsigned int>(last >> 32), sm_first_,
                     sm_last);
      detail::store4(h + 32, detail::block_linear(), blockIdx.x, blockIdx.y, blockIdx.z);
      detail::store4(h + 48, detail::thread_linear() >> 5, detail::cluster_rank(), kept, events - kept);
    }
    rec0_ = 0;
    lim_ = 0;
  }
};

#else  // TGPU_FORMAT == 2

/// A warp's recorder over the event types `Events...` (with the gate on, format v2).
///
/// Every event is one 8-byte entry (a payload, one more, staged with it by the next lane),
/// and the warp's lanes hold them:
/// the n-th entry of a group stamps into lane n's registers (a predicated timer read, so
/// ptxas cannot read the timer again later, see v1's store_pending_and_stamp), and when
/// each lane holds one, the warp stores the group with one coalesced store: per event,
/// a compare, the stamp, the entry's word, the count and the group test; no address, no
/// capacity check, no store. The slot's address is made only when something is stored: a
/// warp that records nothing does nothing but ask whether it is sampled, count its lanes
/// (and, in a graph node, load where its buffer is), and writes nothing at all.
///
/// Streaming (TRACE_STREAM in the argument) changes what a group store does, and which
/// lanes stage: the warp's first lane stores each chunk's meta and keeps the header's
/// counts in its staging registers, and the others stage, 31 in a full warp; the ring's
/// counters take stored_'s place. So streaming costs the events no register and no
/// instruction: per event, the two modes run the same code. A group is a chunk, the
/// ring's next one, stored with one store, or dropped when the ring is full. (A warp of
/// one lane has no lane to stage: it records nothing when streaming.)
///
/// The lanes are those active at construction (`activemask`), ranked: a kernel whose
/// threads returned early still stages in the lanes it has. So construct it where the
/// warp runs converged (the kernel's start, after a barrier, outside divergent code),
/// and let every one of those lanes make every call, as with v1.
template <class... Events>
class Recorder {
  using Checks = detail::checks<Events...>;

  Trace trace_;          // the argument, kept, slot_count the warp's slot (found at
                         // construction); the slot's address is made at each store (a graph
                         // node's, without the streaming code: the buffer's address in base,
                         // TRACE_INDIRECT left in capacity, which slot_capacity() masks); with
                         // TGPU_KEEP_SLOT=1, then kept here
                         // (see keep_slot)
  unsigned int lane_;    // this lane's rank among the warp's lanes (streaming: minus one, so
                         // ~0 in the first lane, which stages nothing); ~0 if it records nothing
  unsigned int group_;   // entries staged per store: the warp's lanes (streaming: minus one);
                         // 0 if it records nothing
  unsigned int last_;    // group_ - 1: k_ of the entry that fills the group
  unsigned int last2_;   // the least k_ at which an entry and its payload fill the group
  unsigned int before_;  // lane_ - 1: k_ at which this lane takes an entry's payload
  unsigned int k_;       // entries staged in the current group
  unsigned int prev_;    // (lane_ - 1) mod group_: k_ of the entry staged before this lane's
  unsigned int prev2_;   // (lane_ - 2) mod group_: k_ of the pair staged before this lane's
                         // entry (both ~0, or near it, in a lane that stages nothing)
  bool turn_;            // k_ == lane_: this lane takes the next entry (set by the call before)
  unsigned int stored_;  // entries of the groups before it; streaming: chunks stored << 16 |
                         // the host's `read` as last loaded, both modulo 2^16
  unsigned int time_;    // this lane's staged entry: the stamp (or a payload); streaming, in
                         // the first lane: events lost << 1 | 1 if entries were dropped since
                         // the last chunk
  unsigned int word_;    //   and event_id | kind << 16; streaming, in the first lane: chunks
                         //   stored
#if TGPU_WATCH
  unsigned long long cell_;    // watch mode: the address of record 0 of this warp's watch cell
  unsigned int rec_;           // the entry count << 8 | the ranges open now, in every lane;
                               // WATCH_OFF in the depth's byte if the warp does not watch
  unsigned int watch_last_;    // what the warp closed last: its id << 16 | WATCH_CLOSED
                               // (| WATCH_PAYLOAD), in every lane; 0 before anything closed
  unsigned int watch_payload_;  // and its payload
  unsigned int high_;  // bits 32-63 of this lane's staged stamp (see store_watched); in the
                       // first lane: the entries stored in chunks, for the header
  enum : unsigned int { WATCH_OFF = 0x80u };  // a depth byte that no call brings to MAX_DEPTH

  // The entry count and the record an entry of kind `Word >> 16` writes (as rec_ holds
  // them), and rec_ after it: a begin writes at its depth and opens one more, an end
  // closes the innermost and writes where it was, a switch rewrites the innermost, an
  // instant writes above the open ones. A closing entry is what the warp closed last,
  // `Closed` with `payload` (if `Paid`), from its own record on.
  template <unsigned int Word, unsigned int Closed, bool Paid>
  __device__ __forceinline__ unsigned int watch_next(unsigned int payload) {
    constexpr unsigned int kind = Word >> 16;
    const unsigned int rec = kind == ENTRY_END || kind == ENTRY_SWITCH ? rec_ - 1u : rec_;
    rec_ += kind == ENTRY_BEGIN ? 0x101u : kind == ENTRY_END ? 0xFFu : 0x100u;
    if (kind != ENTRY_BEGIN) {
      watch_last_ = Closed << 16 | WATCH_CLOSED | (Paid ? WATCH_PAYLOAD : 0u);
      watch_payload_ = Paid ? payload : 0u;
    }
    return rec;
  }

  // The start of a streamed launch's warp: its watch cell found (after the slots) and its
  // head written by the warp's first lane; nothing for a launch that does not stream.
  __device__ __forceinline__ void watch_start(const Trace& trace, bool first) {
    cell_ = 0ull;
    rec_ = WATCH_OFF;
    watch_last_ = 0u;
    watch_payload_ = 0u;
    high_ = 0u;
    if (trace.base == 0 || !(trace.capacity & TRACE_STREAM)) return;
    unsigned int slot;
    if (!detail::sampled_slot(trace, slot)) return;
    const unsigned int capacity = trace.capacity & ~CAPACITY_FLAGS;
    cell_ = header_of(trace.base, capacity, trace.slot_count) +
            static_cast<unsigned long long>(slot) * WATCH_CELL_SIZE + WATCH_RECORD_SIZE;
    rec_ = 0u;
    if (first) watch_head(WATCH_MAGIC);
  }

  // The first lane: the head, started or done, with the SM and the time.
  __device__ __forceinline__ void watch_head(unsigned int magic) {
    const unsigned long long t = globaltimer();
    detail::store4(cell_ - WATCH_RECORD_SIZE, magic, smid(), static_cast<unsigned int>(t),
                   static_cast<unsigned int>(t >> 32));
  }
#endif

  template <class T, unsigned int Kind>
  __host__ __device__ static constexpr unsigned int word() {
    static_assert(Checks::template has<T>(), "event type not in this Recorder's list");
    return static_cast<unsigned int>(T::id) | (Kind << 16);
  }

  // Whether this launch streams: a build with TGPU_STREAM=1 given a streaming argument.
  // A constant false without it, so that the streaming code compiles away.
  __device__ __forceinline__ bool streaming() const {
    return TGPU_STREAM && (trace_.capacity & TRACE_STREAM) != 0;
  }

  // The buffer's address: the argument's, or (with the streaming code) a graph node's,
  // loaded from the word its replay's prologue wrote; 0 if nothing is recorded.
  __device__ __forceinline__ unsigned long long buffer_base() const {
#if TGPU_STREAM
    // A graph node's buffer, in a build with the streaming code (see the constructor).
    if (trace_.capacity & TRACE_INDIRECT) {
      return streaming() ? 0ull : *reinterpret_cast<const unsigned long long*>(trace_.base);
    }
#endif
    // (Without TGPU_STREAM a streaming argument never gets here: it records nothing.)
    return trace_.base;
  }

  // The flags in the argument's capacity that a build reads (the constructor leaves them).
  enum : unsigned int { CAPACITY_FLAGS = TRACE_INDIRECT | (TGPU_STREAM ? TRACE_STREAM : 0u) };

  // The slot's capacity in records: the argument's, without its flags. Opaque to the
  // compiler, so that the slot's address computed from it stays in the store's code, and
  // not ahead of the kernel's loops, where it would hold registers across every event.
  __device__ __forceinline__ unsigned int slot_capacity() const {
    unsigned int capacity = trace_.capacity & ~CAPACITY_FLAGS;
    asm volatile("" : "+r"(capacity));
    return capacity;
  }

  // The address of slot `slot`'s header in the buffer at `base`.
  __device__ __forceinline__ static unsigned long long header_of(unsigned long long base, unsigned int capacity,
                                                                 unsigned int slot) {
    return base + BUFFER_HEADER_SIZE +
           static_cast<unsigned long long>(slot) *
               (SLOT_HEADER_SIZE + static_cast<unsigned long long>(capacity) * RECORD_SIZE);
  }

  // Finds the slot: its header's address and its capacity in records; false if this launch
  // records nothing (a graph node's base is the word its constructor loaded, 0 when the
  // replay records nothing or the argument also asks to stream; a warp that is not sampled
  // never gets here: its group_ is 0). Runs once per group store and at the flush, never
  // per event. With TGPU_KEEP_SLOT=1 the first finds it and keeps it (see keep_slot), the
  // later ones take it from there.
  __device__ __forceinline__ bool locate(unsigned long long& header, unsigned int& capacity,
                                         unsigned int& slot) {
#if TGPU_KEEP_SLOT
    keep_slot();
    header = trace_.base - 1ull;
    capacity = trace_.capacity & ~CAPACITY_FLAGS;
    slot = trace_.slot_count;
    return (static_cast<unsigned int>(trace_.base) & 1u) != 0;
#else
    const unsigned long long base = buffer_base();
    capacity = slot_capacity();
    slot = trace_.slot_count;
    if (base == 0) return false;
    // The slot's offset made opaque, so that `base` is added here, where the address is
    // used: a graph node's base is the word its constructor loaded, and with the sum made
    // in parts, ptxas hoisted `base + BUFFER_HEADER_SIZE` to the kernel's start, where
    // every warp of every recorded node then waited for the load from L2 before its first
    // call (recorder_sass.rs checks where the first wait is).
    unsigned long long offset = header_of(0ull, capacity, slot);
    asm volatile("" : "+l"(offset));
    header = base + offset;
    return true;
#endif
  }

#if TGPU_KEEP_SLOT
  // TGPU_KEEP_SLOT=1: finds the slot's address, once, and keeps it in trace_, where the
  // argument was: base becomes the header's address with bit 0 set (the buffer's address
  // and a graph node's word are aligned, so bit 0 is free until then); trace_ stays as it
  // is if this launch records nothing. A call of its own ahead of locate's
  // answer, not a branch inside it, so that ptxas puts no convergence barrier on every
  // event's path (recorder_sass.rs counts it).
  __device__ __forceinline__ void keep_slot() {
    if (static_cast<unsigned int>(trace_.base) & 1u) return;
    const unsigned long long base = buffer_base();
    const unsigned int capacity = slot_capacity();
    if (base == 0) return;
    // The slot, found at construction, written back as a new value (opaque to the
    // compiler): left as it was, ptxas copied the slot's address on every event's path
    // of the unrolled switch_to loop (recorder_sass.rs: 7.5 instructions a range, not 7).
    unsigned int slot = trace_.slot_count;
    asm volatile("" : "+r"(slot));
    trace_.base = header_of(base, capacity, slot) + 1ull;
    trace_.slot_count = slot;
  }
#endif

  // The group is full: every lane stores its entry (those past the slot's end are
  // dropped, and those that end an event counted in the header's events_lost). When this store holds the slot's last kept entry,
  // lane 0 writes anchor_ts now, so that the times of the kept entries unwrap from a stamp
  // just after them. Streaming: the group is the ring's next chunk, stamped now.
  __device__ __forceinline__ void store_group() {
    unsigned long long h;
    unsigned int capacity, slot;
    if (locate(h, capacity, slot)) {
      if (streaming()) {
#if TGPU_WATCH
        store_watched(h, capacity, group_, globaltimer());
#else
        store_chunk(h, capacity, group_, globaltimer());
#endif
      } else {
        const unsigned int cap = capacity * (RECORD_SIZE / ENTRY_SIZE);
        const unsigned int i = stored_ + lane_;
        detail::store_or_count(h, i, cap, time_, word_);
        if (lane_ == 0 && stored_ < cap && cap - stored_ <= group_) {
          const unsigned long long t = globaltimer();
          detail::store2(h + slot_v2_offsets::ANCHOR_TS, static_cast<unsigned int>(t),
                         static_cast<unsigned int>(t >> 32));
        }
      }
    }
    // Counted here, where the store's branches join, rather than in the slot's branch: so
    // ptxas puts no convergence barrier on every event's path (recorder_sass.rs counts it).
    stored_ += streaming() ? 0u : group_;
    k_ = 0;
  }

  // The place of this lane's entry in a chunk made of the stagers' entries from `from` on:
  // below n for the chunk's n entries, ~0 in the first lane (the meta's, see store_chunk).
  __device__ __forceinline__ unsigned int place(unsigned int from) const {
#if TGPU_WATCH
    return lane_ == 0xFFFFFFFFu ? lane_ : lane_ - from;
#else
    return lane_;
#endif
  }

  // Streaming: the n staged entries become the ring's next chunk, stamped `stamp`, or are
  // dropped (and flagged in the next chunk) if the ring is full; the first lane counts the
  // dropped entries that end an event, for the header's events_lost. Every lane keeps the same
  // counters (stored_) and so decides alike; they load the host's `read` again only when
  // the value they have says the ring is full: once per ring's worth of chunks while the
  // host keeps up. When the host falls behind, a load across PCIe at every chunk would
  // slow the warp most exactly when its chunks are dropped anyway: so each dropped chunk
  // moves the kept `read` one back, and the warp loads it again only after `backoff`
  // more drops (a ring's worth, at most 2^14), dropping whole stretches of chunks in
  // between, each counted. A ring's chunks are a power of two, at most 2^15, so that the
  // position is the count's low bits and `written - read` (at most chunks + backoff) is
  // exact modulo 2^16. No fence: the host takes a chunk as complete when its meta and its
  // n entries all carry STREAM_MARK. The entries are the stagers' from `from` on (watch
  // mode may store a group as several chunks, see store_watched).
  // Straight-line code (the load and the store predicated, not branched around) with few
  // values live at once, so that the events' code around it keeps its registers.
  __device__ __forceinline__ void store_chunk(unsigned long long h, unsigned int capacity, unsigned int n,
                                              unsigned long long stamp, unsigned int from = 0u) {
    const unsigned int chunks = capacity / (CHUNK_SIZE / RECORD_SIZE);
    const unsigned int backoff = (chunks - 1u) & 0x3FFFu;  // a ring's worth, at most 2^14, less one
    const unsigned int ahead = ((stored_ >> 16) - stored_) & 0xFFFFu;
    unsigned int read = stored_;
    detail::load_volatile_if(ahead >= chunks && ((ahead - chunks) & backoff) == 0u, h + slot_stream_offsets::READ,
                             read);
    stored_ = (stored_ & 0xFFFF0000u) | (read & 0xFFFFu);
    // n is 0 only in a warp of one lane (group_ 0), which has no lane to stage.
    const bool keep = n != 0 && (((stored_ >> 16) - stored_) & 0xFFFFu) < chunks;
    const bool first = lane_ == 0xFFFFFFFFu;
    // The chunk's position is below `chunks` whatever `chunks` is: no store leaves the slot.
    // A lane stores at 8 * place(from) in the chunk, modulo its size: the first lane (~0) at 248,
    // the meta's place.
    const unsigned int at = SLOT_HEADER_SIZE + ((stored_ >> 16) & (chunks - 1u)) * CHUNK_SIZE +
                            ((place(from) * ENTRY_SIZE) & (CHUNK_SIZE - 1u));
    const unsigned int info = STREAM_MARK | (smid() & CHUNK_SM_MASK) << CHUNK_SM_SHIFT |
                              ((time_ & 1u) != 0 ? CHUNK_GAP : 0u) | n;
    detail::store2_if(keep && (first || place(from) < n), h + at, first ? static_cast<unsigned int>(stamp) : time_,
                      first ? (static_cast<unsigned int>(stamp >> 32) & 0xFFFFu) | (info << 16)
                            : word_ | (STREAM_MARK << 16));
    stored_ = keep ? stored_ + 0x10000u : (stored_ & 0xFFFF0000u) | ((stored_ - 1u) & 0xFFFFu);
    // The lanes' entries are in their registers only: a vote counts those that end an event.
    // (Unlike the fixed slots' count, in device memory, mapped host memory takes no atomics
    // that one could count with lane by lane.) Its cost: ptxas puts a convergence barrier
    // (BSSY/BSYNC) around each call site's group store in a build with the streaming code.
    const unsigned int lost = __popc(detail::ballot_if(!keep, place(from) < n && detail::ends_event(word_)));
    if (first) {
      word_ += keep ? 1u : 0u;
      time_ = keep ? time_ & ~1u : (time_ + (lost << 1)) | 1u;
    }
  }

#if TGPU_WATCH
  // Watch mode: the n staged entries stored as the ring's next chunk stamped `stamp`, or, if
  // the warp was silent for about 2^31 ns (2.1 s) or more among them, as several. A chunk's
  // entries unwrap backwards from its stamp by their low 32 bits, which holds only while
  // consecutive ones (and the last one and the stamp) are less than 2^31 ns apart
  // (docs/format.md, "Reading a ring"); a hung warp's wait that ends after seconds is not.
  // So a chunk ends before each such silence, stamped at most 2^16 ns after its last entry,
  // whose time the lane that stamped it keeps whole (high_, from watch mode's 64-bit read).
  // Each group store pays a vote for it; only after a silence does the warp find, with
  // shuffles, where the silences were.
  __device__ __forceinline__ void store_watched(unsigned long long h, unsigned int capacity, unsigned int n,
                                                unsigned long long stamp) {
    if (!detail::any(before_stamp(n, stamp) > SILENCE)) {
      store_counted(h, capacity, n, stamp, 0u);
      return;
    }
    // Rare, and kept apart from the common path, which holds no more registers for it:
    // each pass stores one chunk, working out afresh where it ends, with a stamp and the
    // slot's address of its own, so that nothing but two counts is held across passes.
    unsigned int from = 0u;
#pragma unroll 1
    do {
      from = store_to_silence(n, from);
    } while (from < n);
  }

  // How long before `at` this lane's entry was made, if it stages one of the n entries and
  // it has a time (a payload entry's time_ is the payload): 1 + that time in units of
  // 2^16 ns, rounded down (at most ~0); 0 if it has none. In these units a silence is
  // SILENCE or more, 2^31 - 2^16 ns or more, so that in a chunk that has none, the entries
  // and the stamp are less than 2^31 ns apart. (A chunk may so end a little earlier than
  // it must, which costs nothing.)
  enum : unsigned int { SILENCE = (1u << 15) - 1u };
  __device__ __forceinline__ unsigned int before_stamp(unsigned int n, unsigned long long at) const {
    const unsigned long long ago = at - (static_cast<unsigned long long>(high_) << 32 | time_);
    const unsigned int units = ago >> 16 >= 0xFFFFFFFEull ? 0xFFFFFFFEu : static_cast<unsigned int>(ago >> 16);
    return lane_ < n && (word_ >> 16) != ENTRY_PAYLOAD ? units + 1u : 0u;
  }

  // Stores the chunk of the n staged entries that starts at stager `from`: up to the next
  // entry that a silence comes before, stamped at most 2^16 ns after the entry before it;
  // or up to the last, stamped now (or, if a silence is before now, at most 2^16 ns after
  // the last entry). Returns where it ended.
  __device__ __forceinline__ unsigned int store_to_silence(unsigned int n, unsigned int from) {
    unsigned long long h;
    unsigned int capacity, slot;
    locate(h, capacity, slot);  // true: the warp is storing
    const unsigned long long stamp = globaltimer();
    const unsigned int ago = before_stamp(n, stamp);
    unsigned int active, below;
    asm volatile("activemask.b32 %0;" : "=r"(active));
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(below));
    // The lane before this one among the active ones: its stager before (the first
    // stager's, the first lane, which stages nothing; the first lane's, itself). A payload
    // entry takes the time of the entry before it (none, 0, for one carried into the
    // group's first place: that entry is in the chunk before).
    const unsigned int prior = active & below;
    const int src = prior != 0u ? 31 - __clz(prior) : __ffs(active) - 1;
    const unsigned int prior_ago = __shfl_sync(active, ago, src);
    const unsigned int own = ago != 0u || lane_ >= n ? ago : prior_ago;
    const unsigned int before = __shfl_sync(active, own, src);
    const int next =
        __ffs(detail::ballot_if(true, ago != 0u && lane_ > from && before > ago && before - ago >= SILENCE)) - 1;
    const int last = 31 - __clz(detail::ballot_if(true, lane_ < n));
    const unsigned int end = __shfl_sync(active, next >= 0 ? before : own, next >= 0 ? next : last);
    const unsigned int to = next >= 0 ? __popc(active & ((1u << next) - 1u)) - 1u : n;
    // Its stamp: `stamp`, or at most 2^16 ns after its last entry.
    store_counted(h, capacity, to - from,
                  next >= 0 || end > SILENCE ? stamp - (static_cast<unsigned long long>(end - 1u) << 16) : stamp,
                  from);
    return to;
  }

  // store_chunk, the first lane counting the entries stored (high_), for the header.
  __device__ __forceinline__ void store_counted(unsigned long long h, unsigned int capacity, unsigned int n,
                                                unsigned long long stamp, unsigned int from) {
    const unsigned int chunks = word_;
    store_chunk(h, capacity, n, stamp, from);
    if (lane_ == 0xFFFFFFFFu) high_ += (word_ - chunks) * n;
  }
#endif

  // One entry: the lane whose turn it is stamps it and takes its word.
  //
  // Whose turn it is, the call before decided (turn_, held in a predicate register), so
  // that the stamp waits on no compare: a compare feeding the predicated read costs ~13
  // cycles, and a call right after another (a begin after an end) has nothing to hide
  // them behind, its k_ coming out of the join of the other's group-store branch. The
  // next entry is k_ + 1 modulo group_ (0 after the one that fills the group): compared
  // here as k_ == prev_, it needs nothing from the group store. It is compared after the
  // stamp, so that it can take the register the stamp has just read (no copy in a loop
  // of one call), and before the branch, held there by the empty asm (LLVM would sink it
  // past the join, where it waits again). stage_with still compares its own turn where
  // it is made (its payload's compare is there anyway) and sets turn_ for a stage() after
  // it; where none follows, that compare is dead code and goes.
  template <unsigned int Word, unsigned int Closed = Word & 0xFFFFu>
  __device__ __forceinline__ void stage() {
    const bool fills = k_ == last_;
#if TGPU_WATCH
    const unsigned int rec = watch_next<Word, Closed, false>(0u);
    detail::watch_stamp_if<Word>(turn_, false, time_, high_, word_, cell_, rec, watch_last_, watch_payload_);
#else
    detail::stamp_if<Word>(turn_, time_, word_);
#endif
    turn_ = k_ == prev_;
    asm volatile("" ::"r"(static_cast<unsigned int>(turn_)));
    ++k_;
    if (fills) store_group();
  }

  // An entry and its payload entry, staged together: the next lane takes the payload,
  // at the cost of one more compare and two moves, not of a second entry's count and
  // group test. When the entry fills the group, the payload starts the next one.
  template <unsigned int Word, unsigned int Closed = Word & 0xFFFFu>
  __device__ __forceinline__ void stage_with(unsigned int payload) {
    const bool fills = k_ >= last2_;
#if TGPU_WATCH
    const unsigned int rec = watch_next<Word, Closed, true>(payload);
    detail::watch_stamp_if<Word>(k_ == lane_, k_ == before_, time_, high_, word_, cell_, rec, watch_last_,
                                 payload);
#else
    asm volatile(
        "{\n\t.reg .pred p, q;\n\t"
        "setp.eq.u32 p, %2, %3;\n\t"
        "setp.eq.u32 q, %2, %4;\n\t"
        "@p mov.u32 %0, %%globaltimer_lo;\n\t"
        "@p mov.u32 %1, %6;\n\t"
        "@q mov.u32 %0, %5;\n\t"
        "@q mov.u32 %1, %7;\n\t}"
        : "+r"(time_), "+r"(word_)
        : "r"(k_), "r"(lane_), "r"(before_), "r"(payload), "n"(Word), "n"(ENTRY_PAYLOAD << 16)
        : "memory");
#endif
    turn_ = k_ == prev2_;
    asm volatile("" ::"r"(static_cast<unsigned int>(turn_)));
    k_ += 2;
    if (fills) {
      // k_ is group_ (the pair filled the group) or group_ + 1 (its payload had no lane
      // among the group's; streaming in a full warp, the 32nd lane took it, and stores
      // the meta instead).
      const bool carry = k_ > group_;
      store_group();
      if (carry) {
        if (lane_ == 0) {
          time_ = payload;
          word_ = ENTRY_PAYLOAD << 16;
        }
        k_ = 1;
        if (group_ == 1) store_group();
      }
    }
  }

  // Flush, streaming: the staged entries as a last chunk stamped `last`, then (the first
  // lane) the header's bytes 0-35; `read` (48) is the host's. Every chunk before this one
  // holds group_ entries.
  __device__ __forceinline__ void flush_stream(unsigned long long h, unsigned int capacity, unsigned int slot,
                                               unsigned long long last) {
    const bool first = lane_ == 0xFFFFFFFFu;
    // A warp that recorded nothing writes nothing: the first lane counts the chunks stored.
    if (k_ == 0 && !detail::any(first && word_ != 0)) return;
#if TGPU_WATCH
    if (k_ != 0) store_watched(h, capacity, k_, last);
#else
    const unsigned int full = word_;
    if (k_ != 0) store_chunk(h, capacity, k_, last);
#endif
    if (first) {
      detail::store4(h, SLOT_MAGIC_STREAM, word_, static_cast<unsigned int>(last),
                     static_cast<unsigned int>(last >> 32));
#if TGPU_WATCH
      const unsigned int entries = high_;
#else
      const unsigned int entries = full * group_ + (word_ - full) * k_;
#endif
      detail::store4(h + slot_stream_offsets::ENTRY_COUNT, entries, time_ >> 1, smid(), slot);
      detail::store1(h + slot_stream_offsets::CLUSTER_RANK, detail::cluster_rank());
    }
  }

 public:
  /// Counts the warp's lanes. Call it in every thread of the warp; one recorder per warp
  /// per launch.
  __device__ __forceinline__ explicit Recorder(Trace trace)
      : trace_(trace), k_(0), stored_(0), time_(0), word_(0) {
    unsigned int active, below;
    asm volatile("activemask.b32 %0;" : "=r"(active));
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(below));
    const bool stream = (trace.capacity & TRACE_STREAM) != 0;
    // A build without the streaming code records nothing from a streaming argument, and a
    // warp that is not sampled nothing at all. The warp learns it here, once, and keeps its
    // slot where the argument's slot_count was. Asked through a vote, which ptxas knows the
    // warp shares: taken from the thread index alone, `records` looked different per lane,
    // and every event's count and group test moved out of the uniform registers (two more
    // instructions per event, recorder_sass.rs).
    unsigned int slot = trace.slot_count;  // past the last: none, unless sampled_slot says
    const bool records =
        trace.base != 0 && (TGPU_STREAM || !stream) && detail::any(detail::sampled_slot(trace, slot));
    // The slot is the same in every lane: made uniform (a reduction, which ptxas knows the
    // warp shares), it is held in a uniform register across the user's code, not in one of
    // the kernel's own. Held in one, it was the register by which ptxas, keeping the decode
    // step's attention at 32, issued its value loop's loads one at a time: +36 % with a
    // null trace (docs/lab/performance-history.md, session 21).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    trace_.slot_count = __reduce_max_sync(active, slot);
#else
    trace_.slot_count = slot;
#endif
    // Streaming, the first lane stores the metas: the others stage, ranked from 0.
    const unsigned int first = TGPU_STREAM && stream ? 1u : 0u;
    group_ = records ? __popc(active) - first : 0u;
    last_ = group_ - 1u;
    last2_ = group_ > 1u ? group_ - 2u : last_;
    lane_ = records ? __popc(active & below) - first : 0xFFFFFFFFu;
    before_ = records ? lane_ - 1u : 0xFFFFFFFFu;
    // Modulo group_, for lane_ < group_; a lane that stages nothing (lane_ ~0) gets values
    // near ~0, which k_ never reaches.
    prev_ = lane_ == 0u ? group_ - 1u : before_;  // (last_ there: a silent warp's path +1)
    prev2_ = lane_ >= 2u ? lane_ - 2u : group_ > 1u ? lane_ + group_ - 2u : 0u;
    turn_ = lane_ == 0u;
#if TGPU_WATCH
    watch_start(trace, (active & below) == 0u);
#endif
#if !TGPU_STREAM
    // A graph node: where its buffer is (the word its replay's prologue wrote), loaded now
    // and used at the first store, long after. Loaded there instead, the load waited on
    // L2 at the end of every node of every replay: on the H200 a 100-node graph replayed
    // 1.4 points slower (docs/performance.md), and prefetching the word into L1 here
    // (no register held) slower still. The cost: the address held in registers. A build
    // with the streaming code loads it at the first store (locate): there, loading it
    // here made a streamed kernel 35 % slower on the H200, for a reason not found.
    // The load is predicated on lane_, which differs per lane: the word is the same in
    // every lane, and loaded under a condition the warp shares, ptxas may move it into
    // uniform registers right after the load, where the warp waits for it (on the H200
    // the 100-node graph of 8-block kernels replayed +7.4 % slower instead of +5.6 %).
    // The flag stays in trace_.capacity, which slot_capacity() masks: changed here, the
    // capacity was a value of the kernel's registers across the user's code, where the
    // argument's is one ptxas can read again from the parameter bank (the same attention).
    if (trace.capacity & TRACE_INDIRECT) {
      const unsigned long long* word = reinterpret_cast<const unsigned long long*>(trace.base);
      trace_.base = 0ull;
      if (lane_ != 0xFFFFFFFFu) trace_.base = *word;
    }
#endif
  }

  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Flushes the slot, unless flush() already did.
  __device__ __forceinline__ ~Recorder() { flush(); }

  /// Opens a range of type T, nested in the ranges open now (T's own must not be open).
  template <class T>
  __device__ __forceinline__ void begin() {
    stage<word<T, ENTRY_BEGIN>()>();
  }

  /// Closes T's range, the innermost open one.
  template <class T>
  __device__ __forceinline__ void end() {
    stage<word<T, ENTRY_END>()>();
  }

  /// Closes T's range with a 32-bit payload: one more entry.
  template <class T>
  __device__ __forceinline__ void end(unsigned int payload) {
    stage_with<word<T, ENTRY_END>()>(payload);
  }

  /// Closes A's range (the innermost open one) and opens B's: one entry, one timer read.
  template <class A, class B>
  __device__ __forceinline__ void switch_to() {
    static_assert(Checks::template has<A>(), "event type not in this Recorder's list");
    stage<word<B, ENTRY_SWITCH>(), A::id>();
  }

  /// Closes A's range with a payload and opens B's.
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int payload) {
    static_assert(Checks::template has<A>(), "event type not in this Recorder's list");
    stage_with<word<B, ENTRY_SWITCH>(), A::id>(payload);
  }

  /// Records an instant of type T.
  template <class T>
  __device__ __forceinline__ void instant() {
    stage<word<T, ENTRY_INSTANT>()>();
  }

  /// Records an instant of type T with a 32-bit payload.
  template <class T>
  __device__ __forceinline__ void instant(unsigned int payload) {
    stage_with<word<T, ENTRY_INSTANT>()>(payload);
  }

  /// Stores the staged entries and (lane 0) the slot header, and stops recording; a warp
  /// that recorded nothing writes nothing. Later calls, the destructor's included, do
  /// nothing.
  __device__ __forceinline__ void flush() {
#if TGPU_WATCH
    // The warp's first lane marks its watch cell done (its lane_ is ~0 while streaming).
    if (cell_ != 0ull && lane_ == 0xFFFFFFFFu) watch_head(WATCH_MAGIC_DONE);
    cell_ = 0ull;
    rec_ = WATCH_OFF;
#endif
    const unsigned int count = stored_ + k_;
    unsigned long long h;
    unsigned int capacity, slot;
    // Streaming, stored_ is not a count (it may wrap to 0): flush_stream asks the first lane.
    if (group_ != 0 && (count != 0 || streaming()) && locate(h, capacity, slot)) {
      const unsigned long long last = globaltimer();
      if (streaming()) {
        flush_stream(h, capacity, slot, last);
      } else {
        const unsigned int cap = capacity * (RECORD_SIZE / ENTRY_SIZE);
        const unsigned int i = stored_ + lane_;
        if (lane_ < k_) detail::store_or_count(h, i, cap, time_, word_);
        if (lane_ == 0) {
          const unsigned int kept = count < cap ? count : cap;
          const unsigned int lo = static_cast<unsigned int>(last), hi = static_cast<unsigned int>(last >> 32);
          detail::store4(h, SLOT_MAGIC_V2, kept, lo, hi);
          if (stored_ < cap) {
            // The slot did not fill before this flush: its last kept entry is staged or
            // stored, and the flush's stamp anchors it.
            detail::store4(h + slot_v2_offsets::ANCHOR_TS, lo, hi, count - kept, smid());
          } else {
            detail::store2(h + slot_v2_offsets::ENTRIES_LOST, count - kept, smid());
          }
          detail::store2(h + slot_v2_offsets::SLOT, slot, detail::cluster_rank());
        }
      }
    }
    group_ = 0;
    last_ = 0xFFFFFFFFu;
    last2_ = 0xFFFFFFFFu;
    lane_ = 0xFFFFFFFFu;
    before_ = 0xFFFFFFFFu;
    prev_ = 0xFFFFFFFFu;
    prev2_ = 0xFFFFFFFFu;
    turn_ = false;
    k_ = 0;
    stored_ = 0;
  }
};

#endif  // TGPU_FORMAT

}  // namespace tgpu

#else  // gate off: same names, no state, no code

#define TGPU_TRACE_PARAM
#define TGPU_TRACE_ARG
#define TGPU_RECORDER(name, ...) ::tgpu::Recorder<__VA_ARGS__> name

namespace tgpu {

/// The gated-off recorder: the same interface and compile-time checks, and nothing else.
template <class... Events>
class Recorder {
  using Checks = detail::checks<Events...>;

 public:
  __device__ __forceinline__ Recorder() {}
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  template <class T>
  __device__ __forceinline__ void begin() {
    static_assert(Checks::template has<T>(), "event type not in this Recorder's list");
  }
  template <class T>
  __device__ __forceinline__ void end(unsigned int = 0) {
    static_assert(Checks::template has<T>(), "event type not in this Recorder's list");
  }
  template <class A, class B>
  __device__ __forceinline__ void switch_to(unsigned int = 0) {
    static_assert(Checks::template has<A>() && Checks::template has<B>(), "event type not in this Recorder's list");
  }
  template <class T>
  __device__ __forceinline__ void instant(unsigned int = 0) {
    static_assert(Checks::template has<T>(), "event type not in this Recorder's list");
  }
  __device__ __forceinline__ void flush() {}
};

}  // namespace tgpu

#endif
