//! Warps' events → TrackEvent packets: the hot path, which one encoder
//! ([`super::device::DeviceEncoder`]) or several encoder threads ([`super::parallel`])
//! run.
//!
//! The bulk path (one warp's events) allocates nothing per event: events are
//! collected into a reused scratch vector, put in begin order only if they are
//! not already, and encoded straight into the output buffer, two small
//! packets per range: a begin (timestamp delta, sequence id, name iid, and the
//! payload if its type declares one) and an end (timestamp delta, sequence id).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use super::error::PerfettoError;
use super::owners::{warp_key, Owners};
use super::proto::{field, Enc, EventType};
use super::tracks::{sequence_start, Ids, Lane, ShortSeqs, Warp, WarpTracks};
use crate::batch::Batch;
use crate::deliver::watched::Watched;
use crate::format::EventKind;
use crate::registry::{unknown_event_name, EventRegistry};
use crate::watch::State;

/// Output is handed to the underlying writer in pieces of about this size.
pub(crate) const FLUSH_AT: usize = 1 << 20;

/// A warp with at least this many events in a batch writes them on a short
/// sequence id: restarting a sequence costs about 50 bytes, one byte less per
/// packet (two per range) repays that after about 25 events.
pub(crate) const SHORT_SEQ_MIN_EVENTS: usize = 64;

/// Strings interned by iid, the same on every sequence of one encoder: iid
/// `i` is `strings[i]` wherever that encoder uses it (iid 0 is never used).
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
    /// The iids of the instant that marks a warp's events lost, once used.
    lost: Option<(u32, u32)>,
}

impl Default for Names {
    fn default() -> Names {
        Names {
            names: Interned::new(),
            args: Interned::new(),
            table: Vec::new(),
            registry: None,
            lost: None,
        }
    }
}

impl Names {
    /// The iids of the instant a warp with events lost gets: name
    /// `events lost`, argument `events` (the count).
    fn lost(&mut self) -> (u32, u32) {
        *self.lost.get_or_insert_with(|| {
            (
                self.names.iid(&Arc::from("events lost")),
                self.args.iid(&Arc::from("events")),
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

/// Encodes warps' events: their tracks, their lanes' sequences, the names
/// interned on them. One per encoder; each owns the sequences it writes on.
#[derive(Debug, Default)]
pub(crate) struct WarpEncoder {
    tracks: WarpTracks,
    names: Names,
    scratch: Vec<DevEvent>,
    short: ShortSeqs,
    /// Warp writes so far (the round of [`ShortSeqs`]).
    round: u64,
    /// One of several encoders: the warps it writes. `None`: every warp.
    owners: Option<Owners>,
}

impl WarpEncoder {
    /// Encoder `index` of `n`: it writes the warps [`Owners`] gives it, and
    /// borrows only these short sequence ids ([`ShortSeqs::reserved`]).
    pub(crate) fn sharded(index: usize, n: usize, ids: Vec<u32>) -> WarpEncoder {
        WarpEncoder {
            short: ShortSeqs::reserved(ids),
            owners: Some(Owners::new(index, n)),
            ..WarpEncoder::default()
        }
    }

    /// Encodes the events of the warps of `b` that this encoder writes into `enc`,
    /// `window` being the batch's device time window ([`DeviceEncoder::head`](super::device::DeviceEncoder::head), which
    /// also declared their SMs). Whenever more than [`FLUSH_AT`] bytes are
    /// buffered after a warp, `sink` takes them (and leaves `enc` empty).
    /// Returns the device events written.
    pub(crate) fn batch(
        &mut self,
        ids: &Ids,
        enc: &mut Enc,
        b: &Batch,
        (first, last): (u64, u64),
        sink: &mut dyn FnMut(&mut Enc) -> Result<(), PerfettoError>,
    ) -> Result<u64, PerfettoError> {
        let WarpEncoder {
            tracks,
            names,
            scratch,
            short,
            round,
            owners,
        } = self;
        names.use_registry(&b.registry);
        let cap = b.buffer.view();
        // The checkpoint segment is found once for the batch's device window.
        let map = b.calibration.mapper(first, last);
        let ordinal = b.device.ordinal;
        let mean = cap.event_count() / cap.slots().len().max(1) as u64;
        let mut written = 0;
        for slot in cap.slots() {
            let h = &slot.header;
            if let Some(o) = owners {
                let key = warp_key(ordinal, h.sm_first, h.block_linear, h.warp);
                if !o.mine(key, u64::from(slot.event_count()), mean) {
                    continue;
                }
            }
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
            if h.events_lost > 0 {
                // Where the loss happened: an instant on the warp's own track at
                // its last record, after every event it kept (so still in order).
                let at = map.boottime(h.last_ts);
                let (iid, arg) = names.lost();
                in_order &= (at, Reverse(at)) >= prev;
                scratch.push(DevEvent {
                    start: at,
                    end: at,
                    iid,
                    arg,
                    payload: h.events_lost,
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
            let warp = tracks.warp(ids, (ordinal, h.sm_first), h.block_linear, h.warp, enc);
            *round += 1;
            emit_warp(enc, ids, (short, *round), warp, scratch, names);
            written += events;
            if enc.len() > FLUSH_AT {
                sink(enc)?;
            }
        }
        Ok(written)
    }

    /// Writes the ranges that each running warp of snapshot `w` (those this encoder
    /// owns) had open, outermost first, as slices begun at their since times
    /// and never ended, on the warp's own tracks ([`emit_open`]); more than
    /// [`FLUSH_AT`] bytes buffered after a warp go to `sink`, as in
    /// [`WarpEncoder::batch`].
    pub(crate) fn open(
        &mut self,
        ids: &Ids,
        enc: &mut Enc,
        w: &Watched,
        sink: &mut dyn FnMut(&mut Enc) -> Result<(), PerfettoError>,
    ) -> Result<(), PerfettoError> {
        let WarpEncoder {
            tracks,
            names,
            scratch,
            short,
            round,
            owners,
        } = self;
        names.use_registry(&w.registry);
        let s = &w.snapshot;
        let per_block = s.warps_per_block.max(1);
        for warp in &s.warps {
            let (block, index) = (warp.slot / per_block, warp.slot % per_block);
            let open = match &warp.state {
                State::Running { open, .. } => &open[..],
                _ => &[],
            };
            // Every warp asked, in order, so that every encoder's copy agrees.
            let key = warp_key(w.device.ordinal, warp.sm, block, index);
            let mine = owners
                .as_mut()
                .is_none_or(|o| o.mine(key, open.len() as u64, 1));
            if open.is_empty() || !mine {
                continue;
            }
            scratch.clear();
            scratch.extend(open.iter().map(|o| DevEvent {
                start: w.clock.to_host(o.since_ns),
                end: u64::MAX,
                iid: names.iids(o.id).0,
                // What it will close with is not known yet.
                arg: 0,
                payload: 0,
                instant: false,
            }));
            let track = tracks.warp(ids, (w.device.ordinal, warp.sm), block, index, enc);
            *round += 1;
            emit_open(enc, ids, (short, *round), track, scratch, names);
            // A snapshot of every warp of a large grid writes tens of MB.
            if enc.len() > FLUSH_AT {
                sink(enc)?;
            }
        }
        Ok(())
    }
}

/// Puts a warp's ranges open at a snapshot (outermost first) on one lane, begun
/// and never ended: the first lane on which nothing was written after the
/// outermost one's start, else a new lane. Slices written earlier on that lane
/// ended before it, so the open ones nest with them; ranges that closed inside
/// the open ones since (written on the lane where they fit) stay on theirs.
fn emit_open(
    enc: &mut Enc,
    ids: &Ids,
    (pool, round): (&mut ShortSeqs, u64),
    warp: &mut Warp,
    events: &[DevEvent],
    names: &Names,
) {
    let Some(first) = events.first() else {
        return;
    };
    let free = |l: &Lane| l.stack.is_empty() && l.last_ts.is_none_or(|t| t <= first.start);
    let li = match warp.lanes.iter().position(free) {
        Some(li) => li,
        None => warp.add_lane(ids, enc),
    };
    let lane = &mut warp.lanes[li];
    lane.bind(ids, pool, false, round);
    for ev in events {
        // Never popped: anything after would nest inside.
        lane.stack.push(ev.end);
        emit_named(enc, lane, ev.start, EventType::SliceBegin, ev, names);
    }
    warp.free.set(li, free_from(lane));
}

/// Puts a warp's events (in begin order) on its lanes: an event goes on the
/// first lane where it nests inside the open slice (or where nothing is open
/// and the lane's clock has not passed its start), so slices on each lane
/// nest strictly and each lane's packets are in time order. A warp of a few
/// lanes (nearly every warp) is scanned, lane by lane, as the cheapest way; one
/// of more (launches that overlap, each a few events on it) looks its lanes up
/// in [`Warp::free`], a lookup per event rather than a visit of every lane.
pub(crate) fn emit_warp(
    enc: &mut Enc,
    ids: &Ids,
    (pool, round): (&mut ShortSeqs, u64),
    warp: &mut Warp,
    events: &[DevEvent],
    names: &Names,
) {
    let short = events.len() >= SHORT_SEQ_MIN_EVENTS;
    // Kept up to date per event, the tree cost the writer 13-17 % on warps of one
    // lane (`cargo bench --bench perfetto -- device/write`); scanned, such a warp
    // pays nothing for it, and its leaves are set once, at the end of the write.
    let scan = warp.lanes.len() <= SCAN_LANES;
    if scan {
        for (li, lane) in warp.lanes.iter_mut().enumerate() {
            lane.bind(ids, pool, short, round);
            warp.used.push(li);
        }
    }
    for ev in events {
        let mut li = next_lane(warp, scan, 0, ev.start);
        loop {
            if li == warp.lanes.len() {
                warp.add_lane(ids, enc);
            }
            let lane = &mut warp.lanes[li];
            if lane.bound != round {
                lane.bind(ids, pool, short, round);
                warp.used.push(li);
            }
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
            if !scan {
                warp.free.set(li, free_from(lane));
            }
            li = next_lane(warp, scan, li + 1, ev.start);
        }
        let lane = &mut warp.lanes[li];
        let kind = if ev.instant {
            EventType::Instant
        } else {
            lane.stack.push(ev.end);
            EventType::SliceBegin
        };
        emit_named(enc, lane, ev.start, kind, ev, names);
        if !scan {
            warp.free.set(li, free_from(lane));
        }
    }
    // In lane order, as a visit of every lane would close them (scanned, the
    // lanes were bound in order, and added ones come after).
    if !scan {
        warp.used.sort_unstable();
    }
    for &li in &warp.used {
        let lane = &mut warp.lanes[li];
        while let Some(end) = lane.stack.pop() {
            emit_end(enc, lane, end);
        }
        warp.free.set(li, free_from(lane));
    }
    warp.used.clear();
}

/// Lanes up to which a warp is scanned rather than looked up.
const SCAN_LANES: usize = 8;

/// The lane to try next for an event starting at `t`, from lane `from` on: the
/// next one when scanning, else the first the tree says may take it (a new lane
/// if none).
fn next_lane(warp: &Warp, scan: bool, from: usize, t: u64) -> usize {
    match scan {
        true => from,
        false => warp.free.first_free(from, t).unwrap_or(warp.lanes.len()),
    }
}

/// [`Warp::free`]'s time for `lane`.
fn free_from(lane: &Lane) -> u64 {
    if lane.stack.is_empty() {
        lane.last_ts.unwrap_or(0)
    } else {
        0
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
    // All of the field's bytes, a fixed-size copy (the bytes past its length
    // are overwritten or cut off): a copy of its length alone is a call to
    // memcpy per packet (11 % of the writer's instructions, callgrind).
    let field = &lane.seq.field;
    b[n..n + field.len()].copy_from_slice(field);
    // At most 19 (3 + a 10-byte varint + 6), said once so that the callers'
    // fixed-offset writes after it need no bounds check each.
    let end = n + lane.seq.field_len as usize;
    assert!(end <= 19, "a packet head is at most 19 bytes");
    end
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
