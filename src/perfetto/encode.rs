//! Device batches → TrackEvent packets: the encoding core that both
//! [`super::TraceWriter`] and the layer's writer thread run.
//!
//! The bulk path (one warp's events) allocates nothing per event: events are
//! collected into a reused scratch vector, put in begin order only if they are
//! not already, and encoded straight into the output buffer, two small
//! packets per range: a begin (timestamp delta, sequence id, name iid, and the
//! payload if its type declares one) and an end (timestamp delta, sequence id).

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use super::proto::{
    field, Clock, ClockSnapshot, Data, DebugAnnotation, Enc, EventType, TracePacket,
    TracePacketDefaults, TrackEvent, CLOCK_BOOTTIME, CLOCK_MONOTONIC, CLOCK_REALTIME,
    SEQ_INCREMENTAL_STATE_CLEARED,
};
use super::tracks::{sequence_start, DeviceTracks, Ids, Lane, ShortSeqs, Warp, MISC_SEQUENCE};
use super::PerfettoError;
use crate::batch::Batch;
use crate::clock::HostClock;
use crate::format::EventKind;
use crate::registry::{unknown_event_name, EventRegistry};

/// Output is handed to the underlying writer in pieces of about this size.
pub(crate) const FLUSH_AT: usize = 1 << 20;

/// A warp with at least this many events in a batch writes them on a short
/// sequence id: restarting a sequence costs about 50 bytes, one byte less per
/// packet (two per range) repays that after about 25 events.
pub(crate) const SHORT_SEQ_MIN_EVENTS: usize = 64;

/// What a [`super::TraceWriter`] has written so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Bytes handed to the output.
    pub bytes: u64,
    /// Device events written (each a slice: range or instant).
    pub device_events: u64,
    /// Kernel slices written (one per batch).
    pub kernels: u64,
    /// Device records the slots had to drop (shown on the counter tracks).
    pub dropped: u64,
    /// Host slices written (spans entered, events), by a layer.
    pub host_slices: u64,
    /// Flow arrows from a host launch span to its kernel.
    pub flows: u64,
}

/// The flow id of a launch: the same on the host span and the kernel slice.
pub(crate) fn launch_flow_id(launch_id: u64) -> u64 {
    // Never zero: Perfetto reads 0 as "no id".
    launch_id.wrapping_add(1).max(1)
}

/// Starts the flow of launch `launch_id` at a host slice: remembers that its
/// kernel slice ends one ([`Core::batch`]), and returns the flow id.
pub(crate) fn start_flow(origins: &Mutex<HashSet<u64>>, launch_id: u64) -> u64 {
    origins.lock().insert(launch_id);
    launch_flow_id(launch_id)
}

/// Strings interned by iid, the same on every sequence: iid `i` is
/// `strings[i]` wherever it is used (iid 0 is never used).
#[derive(Debug)]
pub(crate) struct Interned {
    strings: Vec<Arc<str>>,
    by_string: HashMap<Arc<str>, u32>,
}

impl Interned {
    fn new() -> Interned {
        Interned {
            strings: vec![Arc::from("")],
            by_string: HashMap::new(),
        }
    }

    fn iid(&mut self, s: &Arc<str>) -> u32 {
        let next = self.strings.len() as u32;
        let iid = *self.by_string.entry(s.clone()).or_insert(next);
        if iid == next {
            self.strings.push(s.clone());
        }
        iid
    }
}

/// Event id → the iids of its name and of its payload's argument name, for
/// the registry of the batch at hand.
#[derive(Debug)]
pub(crate) struct Names {
    /// Event names (`TrackEvent.name_iid`).
    names: Interned,
    /// Declared payload names (`DebugAnnotation.name_iid`).
    args: Interned,
    /// Event id → (name iid, argument iid or 0: no payload); (0, _) not looked
    /// up yet. Only as long as the largest id seen, so that a change of
    /// registry costs little.
    table: Vec<(u32, u32)>,
    registry: Option<Arc<EventRegistry>>,
    /// The iids of the instant that marks a warp's dropped records, once used.
    dropped: Option<(u32, u32)>,
}

impl Names {
    fn new() -> Names {
        Names {
            names: Interned::new(),
            args: Interned::new(),
            table: Vec::new(),
            registry: None,
            dropped: None,
        }
    }

    /// The iids of the instant a warp with dropped records gets: name
    /// `dropped records`, argument `records` (the count).
    fn dropped(&mut self) -> (u32, u32) {
        *self.dropped.get_or_insert_with(|| {
            (
                self.names.iid(&Arc::from("dropped records")),
                self.args.iid(&Arc::from("records")),
            )
        })
    }

    fn use_registry(&mut self, r: &Arc<EventRegistry>) {
        if !self
            .registry
            .as_ref()
            .is_some_and(|cur| Arc::ptr_eq(cur, r))
        {
            self.table.clear();
            self.registry = Some(r.clone());
        }
    }

    #[inline]
    fn iids(&mut self, id: u16) -> (u32, u32) {
        match self.table.get(id as usize) {
            Some(&(n, a)) if n != 0 => (n, a),
            _ => self.intern(id),
        }
    }

    #[cold]
    fn intern(&mut self, id: u16) -> (u32, u32) {
        let (name, arg): (Arc<str>, Option<&Arc<str>>) = match &self.registry {
            Some(r) => (
                Arc::from(&*r.display_name(id)),
                r.info(id).and_then(|e| e.payload.as_ref()),
            ),
            None => (Arc::from(unknown_event_name(id)), None),
        };
        let arg = arg.map_or(0, |a| self.args.iid(a));
        let iids = (self.names.iid(&name), arg);
        if self.table.len() <= id as usize {
            self.table.resize(id as usize + 1, (0, 0));
        }
        self.table[id as usize] = iids;
        iids
    }
}

/// One device event, on the trace clock, ready to encode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevEvent {
    start: u64,
    end: u64,
    iid: u32,
    /// The payload's argument name iid; 0: the type declares no payload.
    arg: u32,
    payload: u32,
    instant: bool,
}

/// The encoder state of one trace: tracks, sequences, interned names. Writes
/// into an in-memory buffer; [`TraceWriter`] drains that to its output.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) ids: Arc<Ids>,
    /// Launch ids whose host span carries a flow origin not yet terminated.
    pub(crate) flow_origins: Arc<Mutex<HashSet<u64>>>,
    pub(crate) enc: Enc,
    pub(crate) stats: WriteStats,
    tracks: DeviceTracks,
    names: Names,
    scratch: Vec<DevEvent>,
    short: ShortSeqs,
    /// Warp writes so far (the round of [`ShortSeqs`]).
    round: u64,
}

impl Core {
    pub(crate) fn new(ids: Arc<Ids>, flow_origins: Arc<Mutex<HashSet<u64>>>) -> Core {
        let mut enc = Enc::with_capacity(FLUSH_AT + (64 << 10));
        // The trace clock, and what the other host clocks read at the same time.
        let boot = HostClock::Boottime.now_ns();
        let clock = |id, c: HostClock| Clock {
            clock_id: Some(id),
            timestamp: Some(c.now_ns()),
            is_incremental: None,
        };
        enc.packet(&TracePacket {
            trusted_packet_sequence_id: Some(MISC_SEQUENCE),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            trace_packet_defaults: Some(TracePacketDefaults {
                timestamp_clock_id: Some(CLOCK_BOOTTIME),
                track_event_defaults: None,
            }),
            data: Some(Data::ClockSnapshot(ClockSnapshot {
                clocks: vec![
                    Clock {
                        clock_id: Some(CLOCK_BOOTTIME),
                        timestamp: Some(boot),
                        is_incremental: None,
                    },
                    clock(CLOCK_MONOTONIC, HostClock::Monotonic),
                    clock(CLOCK_REALTIME, HostClock::Realtime),
                ],
                primary_trace_clock: Some(CLOCK_BOOTTIME as i32),
            })),
            ..Default::default()
        });
        Core {
            ids,
            flow_origins,
            enc,
            stats: WriteStats::default(),
            tracks: DeviceTracks::default(),
            names: Names::new(),
            scratch: Vec::new(),
            short: ShortSeqs::default(),
            round: 0,
        }
    }

    /// Encodes one batch: its warps' events, its kernel slice, its drops.
    /// Whenever more than [`FLUSH_AT`] bytes are buffered after a warp, they
    /// go to `sink` (which returns the bytes it wrote), so a large batch
    /// streams through a bounded buffer instead of growing it.
    pub(crate) fn batch(
        &mut self,
        b: &Batch,
        sink: &mut dyn FnMut(&[u8]) -> Result<u64, PerfettoError>,
    ) -> Result<(), PerfettoError> {
        let Core {
            ids,
            enc,
            tracks,
            names,
            scratch,
            stats,
            short,
            round,
            ..
        } = self;
        let gpu = tracks.gpu(ids, b.device.ordinal, &b.device.name, enc);
        names.use_registry(&b.registry);
        let cap = b.buffer.view();
        let cal = &*b.calibration;
        let (mut first, mut last) = (u64::MAX, 0u64);
        for slot in cap.slots() {
            first = first.min(slot.header.first_ts);
            last = last.max(slot.header.last_ts);
        }
        // The checkpoint segment is found once for the batch's device window.
        let map = cal.mapper(first, last);
        let mut dropped = 0u64;
        let mut slots = 0u64;
        for slot in cap.slots() {
            let h = &slot.header;
            slots += 1;
            dropped += u64::from(h.drop_count);
            scratch.clear();
            let mut in_order = true;
            let mut prev = (0u64, Reverse(u64::MAX));
            for ev in slot.events() {
                let start = map.boottime(ev.start_ns);
                let (end, instant) = match ev.kind {
                    EventKind::Range => (map.boottime(ev.end_ns), false),
                    EventKind::Instant => (start, true),
                };
                let key = (start, Reverse(end));
                in_order &= key >= prev;
                prev = key;
                let (iid, arg) = names.iids(ev.id);
                scratch.push(DevEvent {
                    start,
                    end,
                    iid,
                    arg,
                    payload: ev.payload,
                    instant,
                });
            }
            let events = scratch.len() as u64;
            if h.drop_count > 0 {
                // Where the loss happened: an instant on the warp's own track at
                // its last record, after every event it kept (so still in order).
                let at = map.boottime(h.last_ts);
                let (iid, arg) = names.dropped();
                in_order &= (at, Reverse(at)) >= prev;
                scratch.push(DevEvent {
                    start: at,
                    end: at,
                    iid,
                    arg,
                    payload: h.drop_count,
                    instant: true,
                });
            }
            if scratch.is_empty() {
                continue;
            }
            if !in_order {
                // Records are in end order; slices must open in start order,
                // the outer one first. Stable, so equal events keep record order.
                scratch.sort_by_key(|e| (e.start, Reverse(e.end)));
            }
            let warp = tracks
                .get(gpu)
                .warp(ids, h.sm_first, h.block_linear, h.warp, enc);
            *round += 1;
            emit_warp(enc, ids, (short, *round), warp, scratch, names);
            stats.device_events += events;
            if enc.len() > FLUSH_AT {
                stats.bytes += sink(&enc.buf)?;
                enc.clear();
            }
        }
        stats.dropped += dropped;
        let (start, end) = if slots > 0 {
            (map.boottime(first), map.boottime(last))
        } else {
            (b.launch.host_launch_ns, b.launch.host_complete_ns)
        };
        if start == 0 || end < start {
            return Ok(()); // Nothing recorded and no host times: no kernel to draw.
        }
        // The flow of a launch whose host span started one ([`start_flow`]).
        let flow = self
            .flow_origins
            .lock()
            .remove(&b.launch.launch_id)
            .then(|| launch_flow_id(b.launch.launch_id));
        self.kernel(gpu, b, start, end, slots, dropped, flow);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn kernel(
        &mut self,
        gpu: usize,
        b: &Batch,
        start: u64,
        end: u64,
        warps: u64,
        dropped: u64,
        flow: Option<u64>,
    ) {
        let Core {
            ids, enc, tracks, ..
        } = self;
        let g = tracks.get(gpu);
        let lane = g.kernel_lane(ids, start, enc);
        let uuid = g.kernel_lanes[lane].uuid;
        g.kernel_lanes[lane].last_end = end;
        let l = &b.launch;
        let arg = |name: &str| DebugAnnotation {
            name: Some(name.into()),
            ..Default::default()
        };
        let dims = |d: [u32; 3]| format!("{}×{}×{}", d[0], d[1], d[2]);
        let mut args = vec![
            DebugAnnotation {
                uint_value: Some(l.launch_id),
                ..arg("launch_id")
            },
            DebugAnnotation {
                string_value: Some(dims(l.grid)),
                ..arg("grid")
            },
            DebugAnnotation {
                string_value: Some(dims(l.block)),
                ..arg("block")
            },
            DebugAnnotation {
                uint_value: Some(b.buffer.event_count()),
                ..arg("events")
            },
            DebugAnnotation {
                uint_value: Some(warps),
                ..arg("warps")
            },
            DebugAnnotation {
                uint_value: Some(dropped),
                ..arg("dropped")
            },
        ];
        if l.host_launch_ns != 0 && start >= l.host_launch_ns {
            args.push(DebugAnnotation {
                uint_value: Some(start - l.host_launch_ns),
                ..arg("launch_to_start_ns")
            });
        }
        let packet = |ts: u64, ev: TrackEvent| TracePacket {
            timestamp: Some(ts),
            trusted_packet_sequence_id: Some(MISC_SEQUENCE),
            data: Some(Data::TrackEvent(ev)),
            ..Default::default()
        };
        enc.packet(&packet(
            start,
            TrackEvent {
                r#type: Some(EventType::SliceBegin as i32),
                track_uuid: Some(uuid),
                name: Some(if l.kernel.is_empty() {
                    format!("launch {}", l.launch_id)
                } else {
                    l.kernel.clone()
                }),
                debug_annotations: args,
                terminating_flow_ids: flow.into_iter().collect(),
                ..Default::default()
            },
        ));
        enc.packet(&packet(
            end,
            TrackEvent {
                r#type: Some(EventType::SliceEnd as i32),
                track_uuid: Some(uuid),
                ..Default::default()
            },
        ));
        self.stats.kernels += 1;
        self.stats.flows += u64::from(flow.is_some());
        if dropped > 0 {
            let g = tracks.get(gpu);
            let counter = g.dropped_track(ids, enc);
            let before = g.dropped_total;
            g.dropped_total += dropped;
            for (ts, v) in [(start, before), (end, g.dropped_total)] {
                enc.packet(&packet(
                    ts,
                    TrackEvent {
                        r#type: Some(EventType::Counter as i32),
                        track_uuid: Some(counter),
                        counter_value: Some(v.min(i64::MAX as u64) as i64),
                        ..Default::default()
                    },
                ));
            }
        }
    }
}

/// Puts a warp's events (in begin order) on its lanes: an event goes on the
/// first lane where it nests inside the open slice (or where nothing is open
/// and the lane's clock has not passed its start), so slices on each lane
/// nest strictly and each lane's packets are in time order.
pub(crate) fn emit_warp(
    enc: &mut Enc,
    ids: &Ids,
    (pool, round): (&mut ShortSeqs, u64),
    warp: &mut Warp,
    events: &[DevEvent],
    names: &Names,
) {
    let short = events.len() >= SHORT_SEQ_MIN_EVENTS;
    for lane in &mut warp.lanes {
        lane.bind(ids, pool, short, round);
    }
    for ev in events {
        let mut li = 0;
        loop {
            if li == warp.lanes.len() {
                let n = warp.add_lane(ids, enc);
                warp.lanes[n].bind(ids, pool, short, round);
            }
            let lane = &mut warp.lanes[li];
            while let Some(&end) = lane.stack.last() {
                if end > ev.start {
                    break;
                }
                lane.stack.pop();
                emit_end(enc, lane, end);
            }
            let fits = match lane.stack.last() {
                Some(&open_end) => open_end >= ev.end,
                None => lane.last_ts.is_none_or(|t| t <= ev.start),
            };
            if fits {
                break;
            }
            li += 1;
        }
        let lane = &mut warp.lanes[li];
        let kind = if ev.instant {
            EventType::Instant
        } else {
            lane.stack.push(ev.end);
            EventType::SliceBegin
        };
        emit_named(enc, lane, ev.start, kind, ev, names);
    }
    for lane in &mut warp.lanes {
        while let Some(end) = lane.stack.pop() {
            emit_end(enc, lane, end);
        }
    }
}

/// The sequence clock of `lane` before its next packet, (re)starting the
/// sequence first if needed.
#[inline]
pub(crate) fn lane_clock(enc: &mut Enc, lane: &mut Lane, ts: u64) -> u64 {
    match lane.seq.clock {
        Some(t) => t,
        None => start_lane(enc, lane, ts),
    }
}

/// Starts the lane's sequence: its own at `ts`; a short one at 0. A short id
/// is restarted for lane after lane, and Perfetto rejects a clock snapshot
/// whose BOOTTIME is earlier than the previous one of the same clocks (the
/// same sequence): 0 is never earlier, at the cost of one long first delta.
#[cold]
pub(crate) fn start_lane(enc: &mut Enc, lane: &mut Lane, ts: u64) -> u64 {
    let t0 = if lane.is_short() { 0 } else { ts };
    enc.packet(&sequence_start(lane.seq.id, lane.uuid, t0, None));
    t0
}

/// A varint at `b[n..]`; returns the index after it. `b` has room: callers
/// size it for the longest packet.
#[inline(always)]
pub(crate) fn put_varint(b: &mut [u8], mut n: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        b[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    b[n] = v as u8;
    n + 1
}

/// Field keys of the hot packets, as single bytes (all field numbers < 16).
pub(crate) const KEY_PACKET: u8 = (field::TRACE_PACKET << 3 | 2) as u8;
pub(crate) const KEY_TIMESTAMP: u8 = (field::PACKET_TIMESTAMP << 3) as u8;
pub(crate) const KEY_TRACK_EVENT: u8 = (field::PACKET_TRACK_EVENT << 3 | 2) as u8;
pub(crate) const KEY_TYPE: u8 = (field::EVENT_TYPE << 3) as u8;
pub(crate) const KEY_NAME_IID: u8 = (field::EVENT_NAME_IID << 3) as u8;
pub(crate) const KEY_ANNOTATIONS: u8 = (field::EVENT_DEBUG_ANNOTATIONS << 3 | 2) as u8;
pub(crate) const KEY_ANNOTATION_NAME_IID: u8 = (field::ANNOTATION_NAME_IID << 3) as u8;
pub(crate) const KEY_ANNOTATION_UINT: u8 = (field::ANNOTATION_UINT << 3) as u8;

/// Writes the packet header (`Trace.packet` key, length placeholder, timestamp
/// delta, sequence id) into `b`; returns the index after it.
#[inline(always)]
pub(crate) fn packet_head(b: &mut [u8; 64], lane: &Lane, delta: u64) -> usize {
    b[0] = KEY_PACKET;
    b[2] = KEY_TIMESTAMP;
    let n = put_varint(b, 3, delta);
    let s = lane.seq.field_len as usize;
    b[n..n + s].copy_from_slice(&lane.seq.field[..s]);
    n + s
}

/// A slice begin or an instant on `lane` at `ts`: one packet of at most 49
/// bytes, written in place ([`put_packet`]) (the first use of a name on the
/// lane takes the general path, which interns it). The payload goes in only
/// if the event's type declares one.
#[inline]
pub(crate) fn emit_named(
    enc: &mut Enc,
    lane: &mut Lane,
    ts: u64,
    kind: EventType,
    ev: &DevEvent,
    names: &Names,
) {
    let prev = lane_clock(enc, lane, ts);
    if !lane.seq.names.has(ev.iid) || (ev.arg != 0 && !lane.seq.args.has(ev.arg)) {
        return emit_interning(enc, lane, ts, ts - prev, kind, ev, names);
    }
    lane.last_ts = Some(ts);
    lane.seq.clock = Some(ts);
    let (iid, arg, payload) = (ev.iid, ev.arg, ev.payload);
    put_packet(enc, |b| {
        let mut n = packet_head(b, lane, ts - prev);
        b[n] = KEY_TRACK_EVENT;
        let te = n + 2;
        b[te] = KEY_TYPE;
        b[te + 1] = kind as u8;
        b[te + 2] = KEY_NAME_IID;
        n = put_varint(b, te + 3, u64::from(iid));
        if arg != 0 {
            b[n] = KEY_ANNOTATIONS;
            let an = n + 2;
            b[an] = KEY_ANNOTATION_NAME_IID;
            n = put_varint(b, an + 1, u64::from(arg));
            b[n] = KEY_ANNOTATION_UINT;
            n = put_varint(b, n + 1, u64::from(payload));
            b[an - 1] = (n - an) as u8;
        }
        // Every length here is below 128: one byte each.
        b[te - 1] = (n - te) as u8;
        b[1] = (n - 2) as u8;
        n
    });
}

/// Appends one hot packet: `build` writes it into 64 zeroed bytes at the end
/// of the output and returns its length, and the rest is cut off again. The
/// bytes are written in place: building the packet in a stack array and
/// copying it would reload freshly stored bytes as wide words, which stalls
/// on store forwarding (measured: about 40 % of the writer's time).
#[inline(always)]
pub(crate) fn put_packet(enc: &mut Enc, build: impl FnOnce(&mut [u8; 64]) -> usize) {
    let len = enc.buf.len();
    enc.buf.resize(len + 64, 0);
    let room: &mut [u8; 64] = (&mut enc.buf[len..])
        .try_into()
        .expect("64 bytes were just added");
    let n = build(room);
    enc.buf.truncate(len + n);
}

/// [`emit_named`] for a name (or payload name) not yet interned on the
/// lane's sequence.
#[cold]
pub(crate) fn emit_interning(
    enc: &mut Enc,
    lane: &mut Lane,
    ts: u64,
    delta: u64,
    kind: EventType,
    ev: &DevEvent,
    names: &Names,
) {
    lane.last_ts = Some(ts);
    lane.seq.clock = Some(ts);
    let new_name = !lane.seq.names.has(ev.iid);
    let new_arg = ev.arg != 0 && !lane.seq.args.has(ev.arg);
    lane.seq.names.mark(ev.iid);
    if ev.arg != 0 {
        lane.seq.args.mark(ev.arg);
    }
    let p = enc.open(field::TRACE_PACKET);
    enc.uint(field::PACKET_TIMESTAMP, delta);
    enc.uint(field::PACKET_SEQUENCE_ID, u64::from(lane.seq.id));
    let i = enc.open(field::PACKET_INTERNED_DATA);
    for (new, field_no, iid, strings) in [
        (new_name, field::INTERNED_EVENT_NAMES, ev.iid, &names.names),
        (
            new_arg,
            field::INTERNED_ANNOTATION_NAMES,
            ev.arg,
            &names.args,
        ),
    ] {
        if new {
            let e = enc.open(field_no);
            enc.uint(field::INTERNED_IID, u64::from(iid));
            enc.bytes(
                field::INTERNED_NAME,
                strings.strings[iid as usize].as_bytes(),
            );
            enc.close(e);
        }
    }
    enc.close(i);
    let t = enc.open(field::PACKET_TRACK_EVENT);
    enc.uint(field::EVENT_TYPE, kind as u64);
    enc.uint(field::EVENT_NAME_IID, u64::from(ev.iid));
    if ev.arg != 0 {
        let a = enc.open(field::EVENT_DEBUG_ANNOTATIONS);
        enc.uint(field::ANNOTATION_NAME_IID, u64::from(ev.arg));
        enc.uint(field::ANNOTATION_UINT, u64::from(ev.payload));
        enc.close(a);
    }
    enc.close(t);
    enc.close(p);
}

/// A slice end on `lane`: one packet of at most 23 bytes.
#[inline]
pub(crate) fn emit_end(enc: &mut Enc, lane: &mut Lane, ts: u64) {
    let prev = lane_clock(enc, lane, ts);
    lane.last_ts = Some(ts);
    lane.seq.clock = Some(ts);
    put_packet(enc, |b| {
        let n = packet_head(b, lane, ts - prev);
        b[n] = KEY_TRACK_EVENT;
        b[n + 1] = 2;
        b[n + 2] = KEY_TYPE;
        b[n + 3] = EventType::SliceEnd as u8;
        b[1] = (n + 4 - 2) as u8;
        n + 4
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{DeviceInfo, LaunchInfo};
    use crate::clock::Calibration;
    use crate::decode::OwnedBuffer;
    use crate::format::BufferBuilder;
    use crate::perfetto::{proto, TraceWriter};
    use prost::Message;

    /// The hot path's hand-built packets, read back with the prost messages.
    #[test]
    fn hot_packets_decode_as_perfetto_messages() {
        let mut cb = BufferBuilder::new([1, 1, 1], [32, 1, 1], 4);
        cb.warp(0, 0)
            .unwrap()
            .sm(5, 5)
            .range(1, 1_000, 1_300, 7)
            .range(2, 1_332, 1_500, 300)
            .instant(1, 1_600, 9);
        // mma declares its payload (the k-tile), wait does not.
        let reg = EventRegistry::from_pairs([(1, "mma"), (2, "wait")])
            .unwrap()
            .with_payload(1, "k_tile")
            .unwrap();
        let batch = Batch {
            device: Arc::new(DeviceInfo::default()),
            launch: LaunchInfo {
                launch_id: 3,
                kernel: "k".into(),
                ..Default::default()
            },
            buffer: Arc::new(OwnedBuffer::decode(cb.finish(), None).unwrap()),
            calibration: Arc::new(Calibration::exact(0, 1_000_000, 0.0)),
            registry: Arc::new(reg),
        };
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        w.write_batch(&batch).unwrap();
        let (bytes, stats) = w.finish().unwrap();
        assert_eq!(stats.device_events, 3);
        assert_eq!(stats.kernels, 1);
        let trace = proto::Trace::decode(&bytes[..]).unwrap();
        let start = trace
            .packet
            .iter()
            .position(|p| {
                p.trace_packet_defaults.is_some()
                    && p.trusted_packet_sequence_id != Some(MISC_SEQUENCE)
            })
            .expect("the warp's sequence starts");
        let seq = trace.packet[start].trusted_packet_sequence_id;
        let events: Vec<_> = trace.packet[start + 1..]
            .iter()
            .filter(|p| p.trusted_packet_sequence_id == seq)
            .map(|p| {
                let Some(proto::Data::TrackEvent(e)) = &p.data else {
                    panic!("not an event: {p:?}")
                };
                (p.timestamp.unwrap(), e.clone(), p.interned_data.clone())
            })
            .collect();
        let kinds: Vec<_> = events
            .iter()
            .map(|(t, e, _)| (*t, e.r#type.unwrap()))
            .collect();
        let (b, e, i) = (
            EventType::SliceBegin as i32,
            EventType::SliceEnd as i32,
            EventType::Instant as i32,
        );
        // Deltas on the lane's incremental clock: 0, +300, +32, +168, +100.
        assert_eq!(kinds, [(0, b), (300, e), (32, b), (168, e), (100, i)]);
        // The first use of a name interns it, with its payload's name.
        let (_, first, interned) = &events[0];
        let names = interned.as_ref().expect("the first use interns the name");
        assert_eq!(names.event_names[0].name.as_deref(), Some("mma"));
        assert_eq!(first.name_iid, names.event_names[0].iid);
        let k_tile = &names.debug_annotation_names[0];
        assert_eq!(k_tile.name.as_deref(), Some("k_tile"));
        let (_, wait, interned) = &events[2];
        let names = interned.as_ref().expect("wait is new on the lane");
        assert_eq!(names.event_names[0].name.as_deref(), Some("wait"));
        assert!(names.debug_annotation_names.is_empty());
        assert!(
            wait.debug_annotations.is_empty(),
            "wait declares no payload: none is written"
        );
        assert!(events[4].2.is_none(), "mma and k_tile are interned already");
        let payloads: Vec<_> = [0, 4]
            .iter()
            .map(|&k| {
                let a = &events[k].1.debug_annotations[0];
                assert_eq!(a.name_iid, k_tile.iid);
                a.uint_value.unwrap()
            })
            .collect();
        assert_eq!(payloads, [7, 9]);
        assert!(
            events[1].1.track_uuid.is_none(),
            "the track comes from the defaults"
        );
    }
}
