//! Every way a trace buffer can be wrong.

use crate::format::{BUFFER_MAGIC, MAX_DEPTH, SLOT_MAGIC, SLOT_MAGIC_V2, VERSION};

/// Every way a buffer can fail [`super::Buffer::decode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header says the buffer holds (or than the header itself).
    #[error("trace buffer truncated: {len} bytes, the header needs {needed}")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        needed: u64,
    },
    /// The first four bytes are not `"TGPU"`.
    #[error("not a trace buffer: magic {found:#010x}, expected {BUFFER_MAGIC:#010x} (\"TGPU\")")]
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// A version this reader does not know.
    #[error("unsupported trace format version {found} (this reader reads {VERSION})")]
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// A buffer-header field that must have one value has another.
    #[error("buffer header field {field} is {found}, expected {expected}")]
    BadHeaderField {
        /// The field's name, as in `docs/format.md`.
        field: &'static str,
        /// The value found.
        found: u64,
        /// The value v1 requires.
        expected: u64,
    },
    /// A grid or block dimension is zero: no launch has that shape.
    #[error("launch shape has an empty dimension: grid {grid:?}, block {block:?}")]
    EmptyLaunch {
        /// Grid dimensions.
        grid: [u32; 3],
        /// Block dimensions.
        block: [u32; 3],
    },
    /// `slot_count` slots of `slot_capacity` records do not fit in memory at all.
    #[error("buffer size overflows: {slot_count} slots of {capacity} records")]
    SizeOverflow {
        /// Slots claimed.
        slot_count: u32,
        /// Records per slot claimed.
        capacity: u32,
    },
    /// A slot header magic that is neither zero, `"SLOT"` (v1) nor `"SLT2"` (v2).
    #[error(
        "slot {slot}: bad slot magic {found:#010x}, expected 0, {SLOT_MAGIC:#010x} (\"SLOT\") \
         or {SLOT_MAGIC_V2:#010x} (\"SLT2\")"
    )]
    BadSlotMagic {
        /// Slot index.
        slot: u32,
        /// The magic found.
        found: u32,
    },
    /// A never-flushed slot (zero magic) with non-zero bytes in it.
    #[error("slot {slot}: never flushed (zero magic) but holds data at byte {offset} of the slot")]
    UnflushedSlotNotEmpty {
        /// Slot index.
        slot: u32,
        /// Offset of the first non-zero 16-byte group within the slot.
        offset: usize,
    },
    /// `record_count` exceeds `slot_capacity` (v1), or `entry_count` twice it (v2:
    /// `capacity` is then in entries).
    #[error("slot {slot}: {count} records or entries, past the slot's capacity of {capacity}")]
    CountOverCapacity {
        /// Slot index.
        slot: u32,
        /// Records claimed.
        count: u32,
        /// Capacity.
        capacity: u32,
    },
    /// A flushed slot whose index lies past the last warp of the grid.
    #[error("slot {slot}: flushed, but the grid has only {warps} warps")]
    SlotOutsideGrid {
        /// Slot index.
        slot: u32,
        /// Warps in the launch (blocks × warps per block).
        warps: u64,
    },
    /// The slot's block or warp is not the one its index says.
    #[error(
        "slot {slot}: header says block {found_block} {found_xyz:?} warp {found_warp}, \
         its index means block {expected_block} {expected_xyz:?} warp {expected_warp}"
    )]
    Misplaced {
        /// Slot index.
        slot: u32,
        /// `block_linear` the index implies.
        expected_block: u32,
        /// `blockIdx` the index implies.
        expected_xyz: [u32; 3],
        /// Warp the index implies.
        expected_warp: u32,
        /// `block_linear` in the header.
        found_block: u32,
        /// `blockIdx` in the header.
        found_xyz: [u32; 3],
        /// Warp in the header.
        found_warp: u32,
    },
    /// A v2 slot header whose `slot` field is not the slot's index.
    #[error("slot {slot}: v2 header says slot {found}")]
    WrongSlot {
        /// Slot index.
        slot: u32,
        /// The index in the header.
        found: u32,
    },
    /// A v2 slot header with a non-zero byte where the format reserves zeros.
    #[error("slot {slot}: v2 header byte {offset} is reserved, and not zero")]
    ReservedNotZero {
        /// Slot index.
        slot: u32,
        /// Offset of the first non-zero reserved byte within the slot header.
        offset: usize,
    },
    /// A v2 slot that counts more events lost than entries lost: each event lost
    /// is an entry lost (the one that would have ended it).
    #[error("slot {slot}: {events} events lost, more than its {entries} entries lost")]
    EventsLostOverEntries {
        /// Slot index.
        slot: u32,
        /// `events_lost`, as the header says.
        events: u32,
        /// `entries_lost`, as the header says.
        entries: u32,
    },
    /// A v2 slot whose `anchor_ts` is after its `last_ts`.
    #[error("slot {slot}: anchor_ts {anchor_ts} is after last_ts {last_ts}")]
    AnchorAfterLast {
        /// Slot index.
        slot: u32,
        /// The anchor (the time just after the last written entry).
        anchor_ts: u64,
        /// The flush time.
        last_ts: u64,
    },
    /// A v2 entry 2³¹ ns or more before `anchor_ts` by the unwrap rule: it lies after
    /// the anchor, or the warp was silent for too long before it.
    #[error("slot {slot} entry {entry}: {by_ns} ns before anchor_ts, 2^31 ns or more")]
    EntryFarFromAnchor {
        /// Slot index.
        slot: u32,
        /// Entry index within the slot (the last entry with a time).
        entry: u32,
        /// How far before the anchor.
        by_ns: u64,
    },
    /// The entries of a v2 slot span more time than `anchor_ts` counts from zero.
    #[error(
        "slot {slot}: the entries span {span_ns} ns back from anchor_ts {anchor_ts}, before time 0"
    )]
    SpanBeforeZero {
        /// Slot index.
        slot: u32,
        /// Time from the first entry to the anchor.
        span_ns: u64,
        /// The anchor.
        anchor_ts: u64,
    },
    /// A v2 payload entry that follows no end, switch or instant, or that has an event id.
    #[error("slot {slot} entry {entry}: a payload entry must follow an end, a switch or an instant, with event id 0")]
    StrayPayload {
        /// Slot index.
        slot: u32,
        /// Entry index within the slot.
        entry: u32,
    },
    /// A v2 end or switch entry with no range open.
    #[error("slot {slot} entry {entry}: closes a range of event {id}, but none is open")]
    NothingOpen {
        /// Slot index.
        slot: u32,
        /// Entry index within the slot.
        entry: u32,
        /// The entry's event id.
        id: u16,
    },
    /// A v2 end entry whose event is not the innermost open range's: ranges must nest.
    #[error("slot {slot} entry {entry}: ends event {id}, but the innermost open range is event {open}: ranges must nest")]
    NotInnermost {
        /// Slot index.
        slot: u32,
        /// Entry index within the slot.
        entry: u32,
        /// The entry's event id.
        id: u16,
        /// The event of the innermost open range.
        open: u16,
    },
    /// A v2 begin (or switch) of an event whose range is already open.
    #[error("slot {slot} entry {entry}: opens event {id}, whose range is already open (a type's ranges do not nest)")]
    AlreadyOpen {
        /// Slot index.
        slot: u32,
        /// Entry index within the slot.
        entry: u32,
        /// The entry's event id.
        id: u16,
    },
    /// A v2 begin that would nest deeper than 32 ranges, the most a v2 slot holds.
    #[error("slot {slot} entry {entry}: opens a range {MAX_DEPTH} deep already")]
    TooDeep {
        /// Slot index.
        slot: u32,
        /// Entry index within the slot.
        entry: u32,
    },
    /// `last_ts` before `first_ts` in a slot header.
    #[error("slot {slot}: time runs backwards, last_ts {last_ts} < first_ts {first_ts}")]
    SlotTimesBackwards {
        /// Slot index.
        slot: u32,
        /// First timer read.
        first_ts: u64,
        /// Flush time.
        last_ts: u64,
    },
    /// A record kind other than range (0) or instant (1).
    #[error("slot {slot} record {record}: unknown kind {kind}")]
    UnknownKind {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// The kind found.
        kind: u16,
    },
    /// An instant whose duration is not zero.
    #[error("slot {slot} record {record}: instant with non-zero duration {duration} ns")]
    InstantWithDuration {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// The duration found.
        duration: u32,
    },
    /// An event id the registry given to the decoder does not hold.
    #[error("slot {slot} record {record}: event id {id} is not in the registry")]
    UnknownEventId {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// The id found.
        id: u16,
    },
    /// A record ends before the previous record (or, for the first, before `first_ts`).
    #[error("slot {slot} record {record}: time runs backwards, it ends {by_ns} ns before the previous end")]
    TimeBackwards {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// How far back.
        by_ns: u64,
    },
    /// A range that starts before the slot's `first_ts`: an end before its begin.
    #[error("slot {slot} record {record}: ends at {end} after {duration} ns, so it began before first_ts {first_ts}")]
    StartBeforeFirst {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// The record's end (device ns).
        end: u64,
        /// The record's duration.
        duration: u32,
        /// The slot's first timer read.
        first_ts: u64,
    },
    /// A record that ends after the slot's `last_ts`.
    #[error("slot {slot} record {record}: ends at {end}, after last_ts {last_ts}")]
    EndAfterLast {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// The record's end (device ns, as reconstructed).
        end: u128,
        /// The slot's flush time.
        last_ts: u64,
    },
    /// A packed buffer's slot that does not come after the one before it.
    #[error("packed buffer: slot {slot} comes after slot {previous}; slots must increase")]
    PackedOutOfOrder {
        /// Slot index (from its header).
        slot: u32,
        /// The index of the slot before it.
        previous: u32,
    },
    /// A packed record whose start is after its end, or before the slot's `first_ts`.
    #[error(
        "slot {slot} record {record}: starts at {start}, outside first_ts {first_ts}..end {end}"
    )]
    PackedStartOutside {
        /// Slot index.
        slot: u32,
        /// Record index within the slot.
        record: u32,
        /// The record's start (device ns).
        start: u64,
        /// The record's end (device ns).
        end: u64,
        /// The slot's first_ts.
        first_ts: u64,
    },
    /// A streaming slot whose warp says it stored more (or fewer) chunks than
    /// the reader found complete once the launch had finished.
    #[error("slot {slot}: the warp stored {stored} chunks, {read} were found complete")]
    RingUnread {
        /// Slot index.
        slot: u32,
        /// Chunks stored, as the flushed header says.
        stored: u32,
        /// Chunks read.
        read: u32,
    },
}
