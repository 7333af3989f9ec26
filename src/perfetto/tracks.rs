//! The track registry: which uuid and which writer sequence each track has,
//! and the descriptors that declare them.
//!
//! The tree one GPU gets:
//!
//! ```text
//! GPU 0: NVIDIA H200            process track (synthetic pid)
//! ├── kernels                   one slice per launch (more lanes if launches overlap)
//! ├── events lost               counter: events lost to full slots and rings, cumulative
//! └── SMs                       ordered by rank: SM 2 before SM 10
//!     └── SM 2
//!         ├── block 7 warp 3    the warp's events
//!         └── block 7 warp 3 #2 a second lane, only if its events overlap
//! ```
//!
//! The GPU, its "SMs" track, its SMs, kernel lanes and counter are declared
//! by the thread that writes the batch's kernel slice, before the batch's
//! warps are encoded; a warp's lanes by the encoder that writes its events
//! ([`WarpTracks`]), in the same output and before them. An SM's uuid is
//! derived from the GPU and the SM ([`sm_uuid`]), so any encoder names it.
//!
//! The "SMs" level exists because Perfetto ignores `child_ordering` on a
//! process track: an ordinary track in between is what makes the explicit
//! order hold.
//!
//! Every warp lane writes on a sequence of its own, whose defaults name the
//! track: its packets then carry neither a track uuid nor a clock id, only a
//! timestamp delta on the sequence's incremental clock. Every packet repeats
//! the sequence id, so a warp with many events in a batch borrows one of the
//! ids below 128 (one byte instead of two; [`ShortSeqs`]) and restarts that
//! sequence for its track; a warp with few keeps the lane's own id.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::proto::{
    Clock, ClockSnapshot, CounterDescriptor, InternedData, ProcessDescriptor, TracePacket,
    TracePacketDefaults, TrackDescriptor, TrackEventDefaults, CHILD_ORDERING_EXPLICIT,
    CLOCK_BOOTTIME, CLOCK_INCREMENTAL, SEQ_INCREMENTAL_STATE_CLEARED, UNIT_COUNT,
};
use super::proto::{Data, Enc};

/// Synthetic process ids of GPUs start here: above Linux's largest pid
/// (`pid_max` ≤ 2²²), so a GPU never merges with a real process.
pub(crate) const GPU_PID_BASE: i32 = 0x4000_0000;

/// Track uuids and sequence ids, shared by everything that writes into one trace.
#[derive(Debug)]
pub(crate) struct Ids {
    uuid: AtomicU64,
    seq: AtomicU32,
}

/// The sequence of low-volume packets (descriptors, kernel slices, counters),
/// timestamped absolutely on the trace clock.
pub(crate) const MISC_SEQUENCE: u32 = 1;

impl Ids {
    pub(crate) fn new() -> Ids {
        Ids {
            uuid: AtomicU64::new(1),
            seq: AtomicU32::new(MISC_SEQUENCE + 1),
        }
    }
    pub(crate) fn uuid(&self) -> u64 {
        self.uuid.fetch_add(1, Ordering::Relaxed)
    }
    pub(crate) fn sequence(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

/// The first packet of a sequence that uses the incremental clock: clears the
/// sequence's state, sets its defaults, interns what every packet of it may
/// use, and starts its clock at `t0` (trace-clock ns).
pub(crate) fn sequence_start(
    seq: u32,
    track_uuid: u64,
    t0: u64,
    interned: Option<InternedData>,
) -> TracePacket {
    TracePacket {
        trusted_packet_sequence_id: Some(seq),
        sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
        trace_packet_defaults: Some(TracePacketDefaults {
            timestamp_clock_id: Some(CLOCK_INCREMENTAL),
            track_event_defaults: Some(TrackEventDefaults {
                track_uuid: Some(track_uuid),
            }),
        }),
        interned_data: interned,
        data: Some(Data::ClockSnapshot(ClockSnapshot {
            clocks: vec![
                Clock {
                    clock_id: Some(CLOCK_BOOTTIME),
                    timestamp: Some(t0),
                    is_incremental: None,
                },
                Clock {
                    clock_id: Some(CLOCK_INCREMENTAL),
                    timestamp: Some(t0),
                    is_incremental: Some(true),
                },
            ],
            primary_trace_clock: None,
        })),
        ..Default::default()
    }
}

/// A descriptor packet on the misc sequence.
pub(crate) fn descriptor(d: TrackDescriptor) -> TracePacket {
    TracePacket {
        trusted_packet_sequence_id: Some(MISC_SEQUENCE),
        data: Some(Data::TrackDescriptor(d)),
        ..Default::default()
    }
}

/// A writer sequence as a lane uses it.
#[derive(Debug)]
pub(crate) struct Seq {
    /// The id; 0 until the lane is bound ([`Lane::bind`]).
    pub(crate) id: u32,
    /// The encoded `trusted_packet_sequence_id` field (key and varint), which
    /// every packet repeats.
    pub(crate) field: [u8; 6],
    pub(crate) field_len: u8,
    /// The sequence clock's value after the last packet (trace-clock ns);
    /// `None` until the sequence has (re)started.
    pub(crate) clock: Option<u64>,
    /// Event-name iids already interned on this sequence.
    pub(crate) names: Bits,
    /// Argument-name (declared payload) iids already interned on this sequence.
    pub(crate) args: Bits,
}

/// A set of small integers (interned ids).
#[derive(Debug, Default)]
pub(crate) struct Bits(Vec<u64>);

impl Bits {
    #[inline]
    pub(crate) fn has(&self, i: u32) -> bool {
        self.0
            .get(i as usize / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
    pub(crate) fn mark(&mut self, i: u32) {
        let w = i as usize / 64;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }
}

impl Seq {
    fn new(id: u32) -> Seq {
        let mut e = Enc::default();
        if id != 0 {
            e.uint(super::proto::field::PACKET_SEQUENCE_ID, u64::from(id));
        }
        let mut field = [0u8; 6];
        field[..e.len()].copy_from_slice(&e.buf);
        Seq {
            id,
            field,
            field_len: e.len() as u8,
            clock: None,
            names: Bits::default(),
            args: Bits::default(),
        }
    }
}

/// Sequence ids below 128, lent to lanes: the writer's own, taken from
/// [`Ids`] while it hands out such ids, then reused, the longest-held first.
/// A lane that gets one restarts the sequence (clears its state, sets its
/// defaults to the lane's track, re-anchors its clock); the lane it was
/// taken from notices on its next use ([`Lane::bind`]).
#[derive(Debug, Default)]
pub(crate) struct ShortSeqs {
    ids: Vec<u32>,
    /// Per id: the lane (uuid) holding it, and the warp write (round) that took it.
    holder: Vec<(u64, u64)>,
    next: usize,
    /// [`Ids`] has passed 127.
    exhausted: bool,
}

impl ShortSeqs {
    /// A pool of these ids and no others: an encoder's share, when several
    /// encoders write one trace (each id is restarted by one encoder only).
    pub(crate) fn reserved(ids: Vec<u32>) -> ShortSeqs {
        ShortSeqs {
            // Lane uuids and rounds start at 1: (0, 0) is held by nobody.
            holder: vec![(0, 0); ids.len()],
            ids,
            next: 0,
            exhausted: true,
        }
    }

    /// An id for lane `uuid`; `None` when every id is held by a lane of the
    /// current `round` (a warp with over a hundred lanes).
    fn take(&mut self, ids: &Ids, uuid: u64, round: u64) -> Option<(usize, u32)> {
        if !self.exhausted {
            let id = ids.sequence();
            if id < 128 {
                self.ids.push(id);
                self.holder.push((uuid, round));
                return Some((self.ids.len() - 1, id));
            }
            // Not short: given up (ids are plentiful).
            self.exhausted = true;
        }
        for _ in 0..self.ids.len() {
            let i = self.next;
            self.next = (i + 1) % self.ids.len();
            if self.holder[i].1 != round {
                self.holder[i] = (uuid, round);
                return Some((i, self.ids[i]));
            }
        }
        None
    }
}

/// One lane of a warp: a track, its sequence, and where its clock stands.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) uuid: u64,
    /// The sequence the lane writes on now.
    pub(crate) seq: Seq,
    /// While `seq` is a short one: its [`ShortSeqs`] slot, and the lane's own
    /// sequence, put aside.
    short: Option<usize>,
    own: Option<Seq>,
    /// Time of the lane's last packet (trace-clock ns): the next must not be
    /// earlier. `None` until the first.
    pub(crate) last_ts: Option<u64>,
    /// Ends of the slices open on this lane, innermost last.
    pub(crate) stack: Vec<u64>,
    /// The warp write (round) it was last bound for; 0: none yet.
    pub(crate) bound: u64,
}

impl Lane {
    /// Picks the sequence for a warp write (`round`): a short one if `short`
    /// and one is to be had (the one the lane holds, if nobody took it since),
    /// else the lane's own (created on first use).
    pub(crate) fn bind(&mut self, ids: &Ids, pool: &mut ShortSeqs, short: bool, round: u64) {
        self.bound = round;
        if let Some(slot) = self.short {
            if short && pool.holder[slot].0 == self.uuid {
                pool.holder[slot].1 = round;
                return;
            }
            self.short = None;
            self.seq = self.own.take().unwrap_or_else(|| Seq::new(0));
        }
        if short {
            if let Some((slot, id)) = pool.take(ids, self.uuid, round) {
                self.own = Some(std::mem::replace(&mut self.seq, Seq::new(id)));
                self.short = Some(slot);
                return;
            }
        }
        if self.seq.id == 0 {
            self.seq = Seq::new(ids.sequence());
        }
    }

    /// Whether the lane writes on a borrowed short sequence.
    pub(crate) fn is_short(&self) -> bool {
        self.short.is_some()
    }
}

/// A warp's lanes.
#[derive(Debug)]
pub(crate) struct Warp {
    pub(crate) lanes: Vec<Lane>,
    /// Per lane, from when an event may go on it without a look at the lane:
    /// its last packet's time while no slice is open on it, 0 while one is
    /// (the event may nest, or the slice end before it).
    pub(crate) free: LaneTree,
    /// The lanes bound in the current warp write, in the order of first use.
    pub(crate) used: Vec<usize>,
    rank: i32,
    name: String,
    sm_uuid: u64,
}

/// Lanes by the earliest time each takes a new slice, for first-fit lane
/// searches: the first lane (lowest index) free at a time, from a given
/// lane on, in O(log lanes). Slices come in any order of start (streamed
/// parts, several devices, a capture's order), so no lane is free for good:
/// a scan would visit every lane of the history, a tree visits its height.
#[derive(Debug, Default)]
pub(crate) struct LaneTree {
    /// Stored as a binary heap is: node `k` holds the least time below it
    /// (children `2k` and `2k + 1`, root 1, index 0 unused); lane `i`'s time
    /// is leaf `width + i`, and leaves past the last lane hold `u64::MAX`
    /// (never free). Empty until the first lane.
    free_from: Vec<u64>,
}

impl LaneTree {
    /// Leaves in the tree: a power of two, at least the lanes.
    fn width(&self) -> usize {
        self.free_from.len() / 2
    }

    /// The first lane from `from` on free at `t` (its time at most `t`).
    pub(crate) fn first_free(&self, from: usize, t: u64) -> Option<usize> {
        let width = self.width();
        if from >= width {
            return None;
        }
        // Up from the leaf while the rest of the subtree holds nothing free
        // (or `k` is a left child: its right sibling is tried next)...
        let mut k = width + from;
        while self.free_from[k] > t {
            if k.is_multiple_of(2) {
                k += 1;
            } else {
                loop {
                    if k == 1 {
                        return None;
                    }
                    k /= 2;
                    if k.is_multiple_of(2) {
                        break;
                    }
                }
                k += 1;
            }
        }
        // ...then down to its leftmost free leaf.
        while k < width {
            k *= 2;
            if self.free_from[k] > t {
                k += 1;
            }
        }
        Some(k - width)
    }

    /// Adds lane `lane` (the next), free from `t`.
    pub(crate) fn push(&mut self, lane: usize, t: u64) {
        let width = self.width();
        if lane == width {
            let wider = (2 * width).max(1);
            let mut tree = vec![u64::MAX; 2 * wider];
            tree[wider..wider + width].copy_from_slice(&self.free_from[width..]);
            for k in (1..wider).rev() {
                tree[k] = tree[2 * k].min(tree[2 * k + 1]);
            }
            self.free_from = tree;
        }
        self.set(lane, t);
    }

    /// Lane `lane` is free from `t` on.
    pub(crate) fn set(&mut self, lane: usize, t: u64) {
        let mut k = self.width() + lane;
        self.free_from[k] = t;
        while k > 1 {
            k /= 2;
            self.free_from[k] = self.free_from[2 * k].min(self.free_from[2 * k + 1]);
        }
    }
}

/// The kernels track's lanes: a kernel slice goes on the first whose last
/// slice ended by its start, on a new one if none has.
#[derive(Debug, Default)]
struct KernelLanes {
    uuids: Vec<u64>,
    ends: LaneTree,
}

/// One GPU's tracks above its warps.
#[derive(Debug)]
pub(crate) struct Gpu {
    ordinal: u32,
    uuid: u64,
    sms_uuid: u64,
    /// The SMs declared so far.
    sms: HashSet<u32>,
    kernel_lanes: KernelLanes,
    pub(crate) lost: Option<u64>,
    /// Events lost so far on this GPU (the counter's value).
    pub(crate) lost_total: u64,
    /// The track of the watchdog's snapshots, once one came.
    watchdog: Option<u64>,
}

/// Every device track of a trace above the warps: GPUs, their SMs, kernel
/// lanes and counters. The warps' tracks are [`WarpTracks`].
#[derive(Debug, Default)]
pub(crate) struct DeviceTracks {
    gpus: Vec<Gpu>,
}

impl DeviceTracks {
    /// The GPU with this ordinal, declared (into `out`) on first use.
    pub(crate) fn gpu(&mut self, ids: &Ids, ordinal: u32, name: &str, out: &mut Enc) -> usize {
        if let Some(i) = self.gpus.iter().position(|g| g.ordinal == ordinal) {
            return i;
        }
        let g = Gpu {
            ordinal,
            uuid: ids.uuid(),
            sms_uuid: ids.uuid(),
            sms: HashSet::new(),
            kernel_lanes: KernelLanes::default(),
            lost: None,
            lost_total: 0,
            watchdog: None,
        };
        let title = if name.is_empty() {
            format!("GPU {ordinal}")
        } else {
            format!("GPU {ordinal}: {name}")
        };
        out.packet(&descriptor(TrackDescriptor {
            uuid: Some(g.uuid),
            name: Some(title.clone()),
            process: Some(ProcessDescriptor {
                pid: Some(GPU_PID_BASE.saturating_add_unsigned(ordinal)),
                process_name: Some(title),
                process_labels: vec!["tracing-gpu".into()],
            }),
            ..Default::default()
        }));
        out.packet(&descriptor(TrackDescriptor {
            uuid: Some(g.sms_uuid),
            parent_uuid: Some(g.uuid),
            name: Some("SMs".into()),
            child_ordering: Some(CHILD_ORDERING_EXPLICIT),
            ..Default::default()
        }));
        self.gpus.push(g);
        self.gpus.len() - 1
    }

    pub(crate) fn get(&mut self, gpu: usize) -> &mut Gpu {
        &mut self.gpus[gpu]
    }
}

impl Gpu {
    /// The kernel lane (its uuid) of a kernel slice over `start..end`: the
    /// first free at `start`, declared if none is; it is
    /// busy until `end` from now on.
    pub(crate) fn kernel_lane(
        &mut self,
        ids: &Ids,
        (start, end): (u64, u64),
        out: &mut Enc,
    ) -> u64 {
        let lanes = &mut self.kernel_lanes;
        let lane = lanes.ends.first_free(0, start).unwrap_or_else(|| {
            let lane = lanes.uuids.len();
            let uuid = ids.uuid();
            out.packet(&descriptor(TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(self.uuid),
                name: Some(lane_name("kernels", lane)),
                ..Default::default()
            }));
            lanes.uuids.push(uuid);
            lanes.ends.push(lane, 0);
            lane
        });
        lanes.ends.set(lane, end);
        lanes.uuids[lane]
    }

    /// The events-lost counter track, declared on first use.
    pub(crate) fn lost_track(&mut self, ids: &Ids, out: &mut Enc) -> u64 {
        if let Some(u) = self.lost {
            return u;
        }
        let uuid = ids.uuid();
        out.packet(&descriptor(TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(self.uuid),
            name: Some("events lost".into()),
            counter: Some(CounterDescriptor {
                unit: Some(UNIT_COUNT),
                unit_name: None,
            }),
            ..Default::default()
        }));
        self.lost = Some(uuid);
        uuid
    }

    /// Declares SM `sm` (into `out`) if it is new. Its uuid is [`sm_uuid`],
    /// so whichever encoder writes its warps knows it without asking.
    /// The GPU's track of watchdog snapshots (declared at first use).
    pub(crate) fn watchdog_track(&mut self, ids: &Ids, out: &mut Enc) -> u64 {
        if let Some(u) = self.watchdog {
            return u;
        }
        let uuid = ids.uuid();
        out.packet(&descriptor(TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(self.uuid),
            name: Some("watchdog".into()),
            ..Default::default()
        }));
        self.watchdog = Some(uuid);
        uuid
    }

    pub(crate) fn declare_sm(&mut self, sm: u32, out: &mut Enc) {
        if self.sms.insert(sm) {
            out.packet(&descriptor(TrackDescriptor {
                uuid: Some(sm_uuid(self.ordinal, sm)),
                parent_uuid: Some(self.sms_uuid),
                name: Some(format!("SM {sm}")),
                child_ordering: Some(CHILD_ORDERING_EXPLICIT),
                sibling_order_rank: Some(rank(u64::from(sm))),
                ..Default::default()
            }));
        }
    }
}

/// SM tracks' uuids: `ordinal << 32 | sm` above 2⁶², a range that the
/// counter of [`Ids`] (one per track, from 1) never reaches. Derived rather
/// than counted, because the SMs are declared by the thread that writes the
/// batch's kernel slice ([`Gpu::declare_sm`]) and their warps by any encoder.
pub(crate) fn sm_uuid(ordinal: u32, sm: u32) -> u64 {
    1 << 62 | u64::from(ordinal) << 32 | u64::from(sm)
}

/// The warps' tracks of an encoder: (GPU ordinal, SM, block, warp) → lanes.
/// Their SMs must have been declared ([`Gpu::declare_sm`]).
#[derive(Debug, Default)]
pub(crate) struct WarpTracks {
    warps: HashMap<(u32, u32, u32, u32), Warp>,
}

impl WarpTracks {
    /// The warp (block `block`, warp `warp`) on SM `sm` of GPU `ordinal`, its
    /// first lane declared on first use.
    pub(crate) fn warp(
        &mut self,
        ids: &Ids,
        (ordinal, sm): (u32, u32),
        block: u32,
        warp: u32,
        out: &mut Enc,
    ) -> &mut Warp {
        let w = self
            .warps
            .entry((ordinal, sm, block, warp))
            .or_insert_with(|| Warp {
                lanes: Vec::new(),
                free: LaneTree::default(),
                used: Vec::new(),
                // A block has at most 32 warps; 64 lanes per warp leave room.
                rank: rank((u64::from(block) * 32 + u64::from(warp)) * 64),
                name: format!("block {block} warp {warp}"),
                sm_uuid: sm_uuid(ordinal, sm),
            });
        if w.lanes.is_empty() {
            w.add_lane(ids, out);
        }
        w
    }
}

impl Warp {
    /// Declares one more lane of this warp (with no sequence until
    /// [`Lane::bind`]); returns its index.
    pub(crate) fn add_lane(&mut self, ids: &Ids, out: &mut Enc) -> usize {
        let n = self.lanes.len();
        let uuid = ids.uuid();
        out.packet(&descriptor(TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(self.sm_uuid),
            name: Some(lane_name(&self.name, n)),
            sibling_order_rank: Some(self.rank.saturating_add(n.min(63) as i32)),
            ..Default::default()
        }));
        self.lanes.push(Lane {
            uuid,
            seq: Seq::new(0),
            short: None,
            own: None,
            last_ts: None,
            stack: Vec::new(),
            bound: 0,
        });
        self.free.push(n, 0);
        n
    }
}

/// `base`, `base #2`, `base #3`...
fn lane_name(base: &str, lane: usize) -> String {
    if lane == 0 {
        base.to_owned()
    } else {
        format!("{base} #{}", lane + 1)
    }
}

fn rank(v: u64) -> i32 {
    v.min(i32::MAX as u64) as i32
}

#[cfg(test)]
mod tests {
    use super::LaneTree;

    /// The lane of each slice, as [`super::Gpu::kernel_lane`] picks it.
    fn lanes_of(slices: &[(u64, u64)]) -> Vec<usize> {
        let mut lanes = 0;
        let mut tree = LaneTree::default();
        slices
            .iter()
            .map(|&(start, end)| {
                let lane = tree.first_free(0, start).unwrap_or_else(|| {
                    tree.push(lanes, 0);
                    lanes += 1;
                    lanes - 1
                });
                tree.set(lane, end);
                lane
            })
            .collect()
    }

    /// The first lane whose last end is by `start`, by scanning every lane.
    fn scanned(slices: &[(u64, u64)]) -> Vec<usize> {
        let mut ends: Vec<u64> = Vec::new();
        slices
            .iter()
            .map(|&(start, end)| {
                let lane = ends.iter().position(|&e| e <= start).unwrap_or_else(|| {
                    ends.push(0);
                    ends.len() - 1
                });
                ends[lane] = end;
                lane
            })
            .collect()
    }

    #[test]
    fn the_first_free_lane_from_any_lane_matches_a_scan() {
        let times = [5u64, 9, 1, 7, 3, 8, 2, 6, 4];
        let mut tree = LaneTree::default();
        for (lane, &t) in times.iter().enumerate() {
            tree.push(lane, t);
            for from in 0..=lane + 1 {
                for at in 0..10 {
                    let scan = (from..=lane).find(|&i| times[i] <= at);
                    assert_eq!(tree.first_free(from, at), scan, "{lane} {from} {at}");
                }
            }
        }
    }

    #[test]
    fn overlapping_slices_take_a_lane_each() {
        assert_eq!(lanes_of(&[(10, 20); 5]), [0, 1, 2, 3, 4]);
        // One after the other: one lane; touching counts as after.
        assert_eq!(lanes_of(&[(0, 10), (10, 20), (20, 30)]), [0, 0, 0]);
    }

    #[test]
    fn a_nested_slice_takes_the_next_lane() {
        assert_eq!(
            lanes_of(&[(0, 100), (10, 20), (30, 40), (50, 200)]),
            [0, 1, 1, 1]
        );
    }

    #[test]
    fn the_lowest_free_lane_is_reused() {
        // Lanes 0-3 busy; 1 and 3 free up by 25: the next slice takes 1, then 3.
        let slices = [
            (0, 50),
            (0, 20),
            (0, 60),
            (0, 25),
            (30, 70),
            (30, 70),
            (30, 70),
        ];
        assert_eq!(lanes_of(&slices), [0, 1, 2, 3, 1, 3, 4]);
    }

    #[test]
    fn an_earlier_start_after_a_later_one_finds_the_lanes_free_then() {
        // Lane 0 ends at 100, lane 1 at 10; a slice at 200 takes lane 0, and
        // a later one starting at 50 must not: lane 0 is busy until 300 now.
        assert_eq!(
            lanes_of(&[(0, 100), (0, 10), (200, 300), (50, 60)]),
            [0, 1, 0, 1]
        );
        // Earlier than every end: a new lane.
        assert_eq!(lanes_of(&[(100, 200), (50, 60), (0, 10)]), [0, 1, 2]);
    }

    #[test]
    fn lanes_match_a_scan_of_every_lane() {
        // splitmix64: slices of random starts and lengths, in random order,
        // across the tree's growth (1, 2, 4, ... leaves).
        let mut state = 7u64;
        let mut next = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for round in 0..50 {
            let span = 10 + round * 40;
            let slices: Vec<(u64, u64)> = (0..300)
                .map(|_| {
                    let start = next() % span;
                    (start, start + next() % 100)
                })
                .collect();
            assert_eq!(lanes_of(&slices), scanned(&slices), "round {round}");
        }
    }
}
