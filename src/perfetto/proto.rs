//! The subset of Perfetto's trace protos that tracing-gpu writes, as hand-written
//! `prost` messages carrying Perfetto's field numbers (from
//! `protos/perfetto/trace/trace_packet.proto`, `track_event/*.proto`,
//! `clock_snapshot.proto`, `interned_data/interned_data.proto`). No `protoc` at
//! build time, no generated crate.
//!
//! These messages encode everything that is written once or rarely: track
//! descriptors, clock snapshots, interned names, kernel slices. The per-event
//! packets (slice begin and end on a warp or a thread track) are written by
//! `Enc` (crate-private) directly, with the same field numbers (the constants in `field`);
//! the unit tests decode `Enc`'s bytes with these messages, so the two cannot
//! drift apart.
//!
//! Every field is proto2 `optional`: presence matters to Perfetto (a packet
//! without `timestamp` is not a packet at time 0).
//!
//! Weighed against a crate generated from Perfetto's own .proto files,
//! `perfetto_protos` 0.51.1 (rust-protobuf 3, Perfetto v51.1), and kept:
//! - **Speed**, the packets this file builds as messages, encoded into one
//!   buffer, release build, best of 7 rounds, 5 runs on a shared 2-core
//!   machine: a slice with a payload argument 145-223 ns here against
//!   331-512 ns, a track descriptor 164-259 ns against 314-333 ns; the same
//!   bytes per packet (25.0 and 35.8). The per-event packets use neither
//!   (`Enc`, and `encode.rs`'s fixed byte patterns).
//! - **Schema fidelity**: the same. perfetto_protos' parser reads our packets as
//!   equal to its own, with no unknown fields; and each of the 55 fields here has
//!   the number and type of Perfetto v51.1's .proto files (enums as `int32`).
//!   That comparison found `TrackDescriptor.process_ordering` (tag 19), unused
//!   and absent from v51.1: removed. `tests/check_perfetto.py` parses the
//!   traces the tests write with Perfetto's own schema (PyPI's `perfetto`).
//! - **Cost**: perfetto_protos generates 14 MB of Rust from 226 files at build
//!   time, with a vendored `protoc`: a 137 MB rlib, and about 10 minutes of a
//!   release build here, for the 15 messages we use.

/// A whole trace file: a stream of `packet` fields (what the tests read back).
#[cfg(test)]
#[derive(Clone, PartialEq, prost::Message)]
pub struct Trace {
    /// The packets, in file order.
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

/// One packet of a trace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TracePacket {
    /// Timestamp, in the clock `timestamp_clock_id` (or the sequence default).
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    /// The clock of `timestamp`; builtin ids 1-63, sequence-scoped 64-127.
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
    /// The writer sequence this packet belongs to (interning, defaults and
    /// incremental clocks are per sequence).
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    /// Interned strings introduced by this packet.
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    /// [`SEQ_INCREMENTAL_STATE_CLEARED`], [`SEQ_NEEDS_INCREMENTAL_STATE`].
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    /// Defaults for the following packets of this sequence.
    #[prost(message, optional, tag = "59")]
    pub trace_packet_defaults: Option<TracePacketDefaults>,
    /// The payload.
    #[prost(oneof = "Data", tags = "11, 60, 6, 50")]
    pub data: Option<Data>,
}

/// `TracePacket.sequence_flags`: the sequence's interning, defaults and
/// incremental clocks start afresh with this packet.
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;

/// The payload of a [`TracePacket`] (the `data` oneof; only the members we use).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Data {
    /// A slice begin or end, an instant, a counter value.
    #[prost(message, tag = "11")]
    TrackEvent(TrackEvent),
    /// A track (thread, process, GPU, SM, warp, counter).
    #[prost(message, tag = "60")]
    TrackDescriptor(TrackDescriptor),
    /// Clock readings taken at one instant.
    #[prost(message, tag = "6")]
    ClockSnapshot(ClockSnapshot),
    /// zlib-compressed bytes of a [`Trace`] (more packets).
    #[prost(bytes, tag = "50")]
    CompressedPackets(Vec<u8>),
}

/// `TrackEvent.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    /// Not set.
    Unspecified = 0,
    /// Opens a slice on the track.
    SliceBegin = 1,
    /// Closes the innermost open slice on the track.
    SliceEnd = 2,
    /// A zero-duration slice.
    Instant = 3,
    /// A value on a counter track.
    Counter = 4,
}

/// An event on a track.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackEvent {
    /// What kind of event.
    #[prost(enumeration = "EventType", optional, tag = "9")]
    pub r#type: Option<i32>,
    /// The track; the sequence default when absent.
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    /// Interned name ([`InternedData::event_names`]).
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    /// Literal name.
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    /// Arguments shown with the slice.
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// Value of a counter event.
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
    /// Flows that start at (or pass through) this event.
    #[prost(fixed64, repeated, packed = "false", tag = "47")]
    pub flow_ids: Vec<u64>,
    /// Flows that end at this event.
    #[prost(fixed64, repeated, packed = "false", tag = "48")]
    pub terminating_flow_ids: Vec<u64>,
}

/// A named argument of an event.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DebugAnnotation {
    /// Interned name ([`InternedData::debug_annotation_names`]).
    #[prost(uint64, optional, tag = "1")]
    pub name_iid: Option<u64>,
    /// Literal name.
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
    /// Boolean value.
    #[prost(bool, optional, tag = "2")]
    pub bool_value: Option<bool>,
    /// Unsigned value.
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    /// Signed value.
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    /// Floating-point value.
    #[prost(double, optional, tag = "5")]
    pub double_value: Option<f64>,
    /// String value.
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
}

/// Describes a track: its uuid, parent, name, and what it belongs to.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackDescriptor {
    /// Unique in the trace.
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    /// Nests this track under another (see Perfetto's notes on process and
    /// thread parents).
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    /// Display name.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    /// Makes this the track of a process.
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    /// Makes this the track of a thread.
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    /// Makes this a counter track.
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
    /// How the UI orders this track's children ([`CHILD_ORDERING_EXPLICIT`]).
    #[prost(int32, optional, tag = "11")]
    pub child_ordering: Option<i32>,
    /// Rank among siblings when the parent orders explicitly.
    #[prost(int32, optional, tag = "12")]
    pub sibling_order_rank: Option<i32>,
}

/// `TrackDescriptor.child_ordering`: children ordered by `sibling_order_rank`.
pub const CHILD_ORDERING_EXPLICIT: i32 = 3;

/// A process.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessDescriptor {
    /// Process id (a synthetic one for a GPU).
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// Display name.
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
    /// Labels shown next to the name.
    #[prost(string, repeated, tag = "8")]
    pub process_labels: Vec<String>,
}

/// A thread.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadDescriptor {
    /// Its process's id.
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// Thread id.
    #[prost(int32, optional, tag = "2")]
    pub tid: Option<i32>,
    /// Display name.
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

/// Makes a track a counter track.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CounterDescriptor {
    /// [`UNIT_COUNT`] and friends.
    #[prost(int32, optional, tag = "3")]
    pub unit: Option<i32>,
    /// Free-form unit name.
    #[prost(string, optional, tag = "6")]
    pub unit_name: Option<String>,
}

/// `CounterDescriptor.unit`: a plain count.
pub const UNIT_COUNT: i32 = 2;

/// Strings introduced on a sequence, referred to by iid afterwards.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedData {
    /// Event names (`TrackEvent.name_iid`).
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<EventName>,
    /// Argument names (`DebugAnnotation.name_iid`).
    #[prost(message, repeated, tag = "3")]
    pub debug_annotation_names: Vec<DebugAnnotationName>,
}

/// An interned event name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventName {
    /// Its id on the sequence.
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// The name.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// An interned argument name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DebugAnnotationName {
    /// Its id on the sequence.
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// The name.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// Readings of several clocks at one instant.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClockSnapshot {
    /// The readings.
    #[prost(message, repeated, tag = "1")]
    pub clocks: Vec<Clock>,
    /// The clock the trace's timeline is drawn in ([`CLOCK_BOOTTIME`]).
    #[prost(int32, optional, tag = "2")]
    pub primary_trace_clock: Option<i32>,
}

/// One clock's reading in a [`ClockSnapshot`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct Clock {
    /// Builtin (1-63) or sequence-scoped (64-127) clock id.
    #[prost(uint32, optional, tag = "1")]
    pub clock_id: Option<u32>,
    /// Its reading.
    #[prost(uint64, optional, tag = "2")]
    pub timestamp: Option<u64>,
    /// Timestamps in this clock are deltas from the previous packet's.
    #[prost(bool, optional, tag = "3")]
    pub is_incremental: Option<bool>,
}

/// Builtin clock id of `CLOCK_REALTIME`.
pub const CLOCK_REALTIME: u32 = 1;
/// Builtin clock id of `CLOCK_MONOTONIC`.
pub const CLOCK_MONOTONIC: u32 = 3;
/// Builtin clock id of `CLOCK_BOOTTIME`: the trace clock.
pub const CLOCK_BOOTTIME: u32 = 6;
/// The sequence-scoped incremental clock every sequence of ours declares.
pub const CLOCK_INCREMENTAL: u32 = 64;

/// Defaults for the packets of one sequence.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TracePacketDefaults {
    /// Default `TracePacket.timestamp_clock_id`.
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
    /// Defaults of track events.
    #[prost(message, optional, tag = "11")]
    pub track_event_defaults: Option<TrackEventDefaults>,
}

/// Defaults of the track events of one sequence.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackEventDefaults {
    /// Default `TrackEvent.track_uuid`.
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
}

/// Field numbers used by [`Enc`]'s hand-written packets (the same as the
/// `tag`s above).
pub(crate) mod field {
    /// `Trace.packet`.
    pub const TRACE_PACKET: u32 = 1;
    /// `TracePacket.timestamp`.
    pub const PACKET_TIMESTAMP: u32 = 8;
    /// `TracePacket.trusted_packet_sequence_id`.
    pub const PACKET_SEQUENCE_ID: u32 = 10;
    /// `TracePacket.track_event`.
    pub const PACKET_TRACK_EVENT: u32 = 11;
    /// `TracePacket.interned_data`.
    pub const PACKET_INTERNED_DATA: u32 = 12;
    /// `TracePacket.compressed_packets`.
    pub const PACKET_COMPRESSED: u32 = 50;
    /// `TrackEvent.type`.
    pub const EVENT_TYPE: u32 = 9;
    /// `TrackEvent.name_iid`.
    pub const EVENT_NAME_IID: u32 = 10;
    /// `TrackEvent.name`.
    pub const EVENT_NAME: u32 = 23;
    /// `TrackEvent.debug_annotations`.
    pub const EVENT_DEBUG_ANNOTATIONS: u32 = 4;
    /// `TrackEvent.flow_ids`.
    pub const EVENT_FLOW_IDS: u32 = 47;
    /// `InternedData.event_names`.
    pub const INTERNED_EVENT_NAMES: u32 = 2;
    /// `InternedData.debug_annotation_names`.
    pub const INTERNED_ANNOTATION_NAMES: u32 = 3;
    /// `EventName.iid` (and `DebugAnnotationName.iid`).
    pub const INTERNED_IID: u32 = 1;
    /// `EventName.name` (and `DebugAnnotationName.name`).
    pub const INTERNED_NAME: u32 = 2;
    /// `DebugAnnotation.name_iid`.
    pub const ANNOTATION_NAME_IID: u32 = 1;
    /// `DebugAnnotation.name`.
    pub const ANNOTATION_NAME: u32 = 10;
    /// `DebugAnnotation.bool_value`.
    pub const ANNOTATION_BOOL: u32 = 2;
    /// `DebugAnnotation.uint_value`.
    pub const ANNOTATION_UINT: u32 = 3;
    /// `DebugAnnotation.int_value`.
    pub const ANNOTATION_INT: u32 = 4;
    /// `DebugAnnotation.double_value`.
    pub const ANNOTATION_DOUBLE: u32 = 5;
    /// `DebugAnnotation.string_value`.
    pub const ANNOTATION_STRING: u32 = 6;
}

const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;

/// A byte buffer that packets are encoded into directly, without building
/// messages: the writer's hot path. Nested lengths are back-patched: one byte is
/// reserved, and the body moved on the rare occasion it is 128 bytes or more.
#[derive(Debug, Default, Clone)]
pub(crate) struct Enc {
    /// The encoded bytes.
    pub(crate) buf: Vec<u8>,
}

/// A length-delimited field opened by [`Enc::open`], closed by [`Enc::close`].
#[derive(Debug, Clone, Copy)]
#[must_use = "a length-delimited field must be closed"]
pub(crate) struct Open(usize);

impl Enc {
    /// An empty buffer with room for `cap` bytes.
    pub(crate) fn with_capacity(cap: usize) -> Enc {
        Enc {
            buf: Vec::with_capacity(cap),
        }
    }

    /// Appends a base-128 varint.
    #[inline]
    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// Appends a field key.
    #[inline]
    fn key(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }

    /// Appends a varint field.
    #[inline]
    pub(crate) fn uint(&mut self, field: u32, v: u64) {
        self.key(field, WIRE_VARINT);
        self.varint(v);
    }

    /// Appends a signed varint field (`int64`: two's complement, not zigzag).
    #[inline]
    pub(crate) fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    /// Appends a `fixed64` field.
    #[inline]
    pub(crate) fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, WIRE_FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `double` field.
    #[inline]
    pub(crate) fn double(&mut self, field: u32, v: f64) {
        self.fixed64(field, v.to_bits());
    }

    /// Appends a bytes or string field.
    #[inline]
    pub(crate) fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, WIRE_LEN);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// Opens a length-delimited field (a nested message).
    #[inline]
    pub(crate) fn open(&mut self, field: u32) -> Open {
        self.key(field, WIRE_LEN);
        self.buf.push(0);
        Open(self.buf.len())
    }

    /// Closes the field `open` opened, writing its length.
    #[inline]
    pub(crate) fn close(&mut self, open: Open) {
        let start = open.0;
        let len = self.buf.len() - start;
        if len < 0x80 {
            self.buf[start - 1] = len as u8;
            return;
        }
        // Rare: a body of 128 bytes or more needs a longer length prefix.
        let mut tmp = [0u8; 10];
        let mut n = 0;
        let mut v = len as u64;
        while v >= 0x80 {
            tmp[n] = v as u8 | 0x80;
            v >>= 7;
            n += 1;
        }
        tmp[n] = v as u8;
        n += 1;
        let extra = n - 1;
        self.buf.splice(start - 1..start, tmp[..n].iter().copied());
        debug_assert_eq!(self.buf.len() - start - extra, len);
    }

    /// Appends an encoded `prost` message as one `Trace.packet`.
    pub(crate) fn packet(&mut self, packet: &TracePacket) {
        use prost::Message;
        self.key(field::TRACE_PACKET, WIRE_LEN);
        self.varint(packet.encoded_len() as u64);
        // Encoding into a Vec cannot run out of room.
        let _ = packet.encode(&mut self.buf);
    }

    /// Bytes written.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing is written.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Forgets the contents, keeping the allocation.
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn hand_encoded_packets_decode_as_the_messages() {
        let mut e = Enc::default();
        let p = e.open(field::TRACE_PACKET);
        e.uint(field::PACKET_TIMESTAMP, 0);
        e.uint(field::PACKET_SEQUENCE_ID, 300);
        let i = e.open(field::PACKET_INTERNED_DATA);
        let n = e.open(field::INTERNED_EVENT_NAMES);
        e.uint(field::INTERNED_IID, 5);
        e.bytes(field::INTERNED_NAME, "x".repeat(200).as_bytes());
        e.close(n);
        e.close(i);
        let t = e.open(field::PACKET_TRACK_EVENT);
        e.uint(field::EVENT_TYPE, EventType::SliceBegin as u64);
        e.uint(field::EVENT_NAME_IID, 5);
        let a = e.open(field::EVENT_DEBUG_ANNOTATIONS);
        e.uint(field::ANNOTATION_NAME_IID, 1);
        e.uint(field::ANNOTATION_UINT, 1 << 40);
        e.close(a);
        let a = e.open(field::EVENT_DEBUG_ANNOTATIONS);
        e.bytes(field::ANNOTATION_NAME, b"neg");
        e.int(field::ANNOTATION_INT, -3);
        e.close(a);
        let a = e.open(field::EVENT_DEBUG_ANNOTATIONS);
        e.bytes(field::ANNOTATION_NAME, b"f");
        e.double(field::ANNOTATION_DOUBLE, 0.5);
        e.close(a);
        e.fixed64(field::EVENT_FLOW_IDS, u64::MAX - 1);
        e.close(t);
        e.close(p);
        e.packet(&TracePacket {
            timestamp: Some(7),
            trusted_packet_sequence_id: Some(1),
            ..Default::default()
        });

        let trace = Trace::decode(&e.buf[..]).unwrap();
        assert_eq!(trace.packet.len(), 2);
        let p = &trace.packet[0];
        assert_eq!(
            p.timestamp,
            Some(0),
            "a zero timestamp is present, not absent"
        );
        assert_eq!(p.trusted_packet_sequence_id, Some(300));
        let names = &p.interned_data.as_ref().unwrap().event_names;
        assert_eq!(names[0].iid, Some(5));
        assert_eq!(names[0].name.as_deref().unwrap().len(), 200);
        let Some(Data::TrackEvent(ev)) = &p.data else {
            panic!("not a track event: {p:?}")
        };
        assert_eq!(ev.r#type, Some(EventType::SliceBegin as i32));
        assert_eq!(ev.name_iid, Some(5));
        assert_eq!(ev.debug_annotations[0].name_iid, Some(1));
        assert_eq!(ev.debug_annotations[0].uint_value, Some(1 << 40));
        assert_eq!(ev.debug_annotations[1].name.as_deref(), Some("neg"));
        assert_eq!(ev.debug_annotations[1].int_value, Some(-3));
        assert_eq!(ev.debug_annotations[2].double_value, Some(0.5));
        assert_eq!(ev.flow_ids, [u64::MAX - 1]);
        assert_eq!(trace.packet[1].timestamp, Some(7));
    }

    #[test]
    fn long_bodies_get_longer_length_prefixes() {
        for len in [0usize, 1, 127, 128, 129, 16_383, 16_384, 70_000] {
            let mut e = Enc::default();
            let o = e.open(field::TRACE_PACKET);
            e.buf.extend(std::iter::repeat_n(0u8, len));
            e.close(o);
            let mut want = Enc::default();
            want.bytes(field::TRACE_PACKET, &vec![0u8; len]);
            assert_eq!(e.buf, want.buf, "body of {len} bytes");
        }
    }
}
