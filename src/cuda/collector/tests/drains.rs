//! Streamed launches through the simulated device: warps write their rings in
//! host memory by the protocol of docs/format.md ("Streaming slots"), from
//! threads of their own, while the collector reads them; a paced warp loses
//! nothing across many wraps of a small ring, a warp whose host falls behind
//! drops its newest entries and counts the events lost exactly, a collector held back
//! stops the drain (so that the warps drop, not the host pile up parts), and
//! parts reach the sink while the launch runs.
use super::*;
use crate::batch::Part;
use crate::cuda::device::Shape;
use crate::cuda::drain::CHUNK_RECORDS;
use crate::cuda::job::Watchdog;
use crate::deliver::SinkLayer;
use crate::format::Sampling;
use crate::format::{
    slot_stream_offsets as so, Event, EventKind, CHUNK_ENTRIES, CHUNK_GAP, CHUNK_SIZE,
    CHUNK_SM_SHIFT, ENTRY_BEGIN, ENTRY_END, ENTRY_INSTANT, ENTRY_PAYLOAD, ENTRY_SWITCH,
    SLOT_HEADER_SIZE, SLOT_MAGIC_STREAM, STREAM_MARK,
};

/// Every batch delivered, kept whole.
#[derive(Default, Clone)]
pub(super) struct Batches(pub(super) Arc<Mutex<Vec<Arc<Batch>>>>);

impl BatchSink for Batches {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.0.lock().push(batch.clone());
    }
    fn flush(&self) {}
}

/// One simulated warp writing its ring, as the v2 recorder does in streaming mode.
pub(super) struct Warp {
    memory: Arc<Memory>,
    /// The slot's byte offset in the memory.
    slot: usize,
    pub(super) index: u32,
    chunks: u32,
    pub(super) written: u32,
    read: u32,
    gap: bool,
    /// Events lost: the entries of dropped chunks that end an event, as the
    /// recorder counts them.
    pub(super) lost: u32,
    /// Chunks dropped.
    pub(super) gaps: u32,
    stored: u32,
    /// The entries staged, each with the device time it was made at.
    staged: Vec<(u64, u64)>,
    /// Wait for room instead of dropping.
    paced: bool,
}

pub(super) fn word(t: u64, id: u16, kind: u16) -> u64 {
    (t as u32) as u64 | (id as u64) << 32 | ((kind | STREAM_MARK) as u64) << 48
}

/// How far apart a chunk's entries may not be (docs/format.md, "Long silences":
/// the recorder ends its chunks at this, or up to 2¹⁶ ns sooner).
const SILENCE_NS: u64 = 1 << 31;

impl Warp {
    /// Stages entry `w`, made at device time `now`.
    pub(super) fn entry(&mut self, w: u64, now: u64) {
        self.staged.push((w, now));
        if self.staged.len() == CHUNK_ENTRIES {
            self.store(now);
        }
    }

    /// The staged entries as the ring's next chunk stamped `stamp`, or, as the
    /// recorder in watch mode, as several: a chunk ends before each entry made
    /// [`SILENCE_NS`] or more after the one before it, stamped with that one's
    /// time, and the last takes its last entry's time when `stamp` is that far
    /// after it. A payload entry has no time of its own.
    fn store(&mut self, stamp: u64) {
        let staged = std::mem::take(&mut self.staged);
        let timed = |w: u64| (w >> 48) as u16 & !STREAM_MARK != ENTRY_PAYLOAD;
        let (mut from, mut last) = (0, None);
        for (i, &(w, t)) in staged.iter().enumerate() {
            if !timed(w) {
                continue;
            }
            if let Some(l) = last.filter(|&l| t - l >= SILENCE_NS) {
                self.store_chunk(&staged[from..i], l);
                from = i;
            }
            last = Some(t);
        }
        let end = last.filter(|&l| stamp - l >= SILENCE_NS).unwrap_or(stamp);
        self.store_chunk(&staged[from..], end);
    }

    fn store_chunk(&mut self, staged: &[(u64, u64)], stamp: u64) {
        let n = staged.len();
        let head = self.slot + so::READ;
        while self.written - self.read >= self.chunks {
            self.read = self.memory.load_u32(head);
            if !self.paced || self.written - self.read < self.chunks {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        if self.written - self.read >= self.chunks {
            let ends = |&&(w, _): &&(u64, u64)| {
                let kind = (w >> 48) as u16 & !STREAM_MARK;
                (ENTRY_END..=ENTRY_INSTANT).contains(&kind)
            };
            self.lost += staged.iter().filter(ends).count() as u32;
            self.gaps += 1;
            self.gap = true;
            return;
        }
        let at = self.slot + SLOT_HEADER_SIZE + (self.written % self.chunks) as usize * CHUNK_SIZE;
        // The meta first: the host must not take the chunk before its entries.
        let info = STREAM_MARK
            | (self.index as u16 % 100) << CHUNK_SM_SHIFT
            | if self.gap { CHUNK_GAP } else { 0 }
            | n as u16;
        self.memory
            .store_u64(at + 248, (stamp & ((1 << 48) - 1)) | (info as u64) << 48);
        for (i, &(w, _)) in staged.iter().enumerate().rev() {
            self.memory.store_u64(at + 8 * i, w);
        }
        self.gap = false;
        self.written += 1;
        self.stored += n as u32;
    }

    pub(super) fn flush(&mut self, last_ts: u64) {
        if !self.staged.is_empty() {
            self.store(last_ts);
        }
        let m = &self.memory;
        let put32 = |off: usize, v: u32| {
            // Header words 0-35, as lane 0 writes them, two u32 per store.
            let word = off & !7;
            let old = m.load_u64(self.slot + word);
            let shift = (off - word) * 8;
            let new = (old & !(0xFFFF_FFFFu64 << shift)) | (v as u64) << shift;
            m.store_u64(self.slot + word, new);
        };
        put32(so::CHUNKS, self.written);
        m.store_u64(self.slot + so::LAST_TS, last_ts);
        put32(so::ENTRY_COUNT, self.stored);
        put32(so::EVENTS_LOST, self.lost);
        put32(so::SM, self.index % 100);
        put32(so::SLOT, self.index);
        put32(so::CLUSTER_RANK, u32::MAX);
        put32(so::MAGIC, SLOT_MAGIC_STREAM);
    }
}

/// A streamed launch of `blocks` blocks of 2 warps with rings of `chunks`
/// chunks, handed to `rig`'s collector with an event not yet fired. Returns
/// the warps to write with, and the event.
pub(super) fn stream_launch(rig: &Rig, blocks: u32, chunks: u32, paced: bool) -> (Vec<Warp>, u64) {
    let (warps, event, _) = launch_with(
        rig,
        blocks,
        chunks,
        paced,
        Sampling::default(),
        None,
        &mut |_| {},
    );
    (warps, event)
}

/// [`stream_launch`], unpaced, with `write` run on its warps before the collector
/// learns of the launch: what they write there, no drain has read yet (a host
/// entirely behind, whatever this machine's load).
pub(super) fn stream_launch_after(
    rig: &Rig,
    blocks: u32,
    chunks: u32,
    write: &mut dyn FnMut(&mut [Warp]),
) -> (Vec<Warp>, u64) {
    let (warps, event, _) =
        launch_with(rig, blocks, chunks, false, Sampling::default(), None, write);
    (warps, event)
}

/// [`stream_launch`] sampled: rings for the warps `sampling` names only, each
/// warp's `index` its slot.
pub(super) fn stream_sampled(
    rig: &Rig,
    blocks: u32,
    chunks: u32,
    paced: bool,
    sampling: Sampling,
) -> (Vec<Warp>, u64) {
    let (warps, event, _) = launch_with(rig, blocks, chunks, paced, sampling, None, &mut |_| {});
    (warps, event)
}

/// `stream_launch` with a watchdog; also returns the memory and the byte offset of
/// the launch's watch cells.
pub(super) fn watched_launch(
    rig: &Rig,
    blocks: u32,
    chunks: u32,
    paced: bool,
    watch: Option<Watchdog>,
) -> (Vec<Warp>, u64, (Arc<Memory>, usize)) {
    launch_with(
        rig,
        blocks,
        chunks,
        paced,
        Sampling::default(),
        watch,
        &mut |_| {},
    )
}

/// The launch of every helper above; `before` runs on the warps before the
/// collector is told of it.
fn launch_with(
    rig: &Rig,
    blocks: u32,
    chunks: u32,
    paced: bool,
    sampling: Sampling,
    watch: Option<Watchdog>,
    before: &mut dyn FnMut(&mut [Warp]),
) -> (Vec<Warp>, u64, (Arc<Memory>, usize)) {
    let capacity = chunks * CHUNK_RECORDS;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    let shape = Shape::sampled(&cfg, capacity, 1 << 30, &sampling).unwrap();
    // The rings and the watch cells, as the profiler sizes them.
    let bytes = shape.bytes + shape.slots as usize * crate::format::WATCH_CELL_SIZE;
    // Room for the region, rounded up to the arena's alignment.
    let len = bytes.next_multiple_of(ALIGN);
    let memory = rig.gpu.allocate(Kind::Mapped, len);
    let arena = Arc::new(Arena::new(len));
    let region = arena.alloc(bytes, None).unwrap();
    let cells = (memory.clone(), region.offset + shape.bytes);
    rig.shared.count_launch(false);
    let launch_id = crate::cuda::__private::next_launch_id();
    let header = crate::format::BufferHeader {
        version: crate::format::VERSION,
        slot_capacity: capacity,
        slot_count: shape.slots,
        warps_per_block: shape.warps_per_block,
        launch_id,
        grid: [blocks, 1, 1],
        block: [64, 1, 1],
        flags: 0,
        sampling,
    };
    let stride = crate::format::slot_stride(capacity);
    let mut warps: Vec<Warp> = (0..shape.slots)
        .map(|i| Warp {
            memory: memory.clone(),
            slot: region.offset + header.size() + i as usize * stride,
            index: i,
            chunks,
            written: 0,
            read: 0,
            gap: false,
            lost: 0,
            gaps: 0,
            stored: 0,
            staged: Vec::new(),
            paced,
        })
        .collect();
    before(&mut warps);
    let event = rig.gpu.event(false);
    let span = tracing::info_span!("persistent", gpu.launch_id = launch_id);
    rig.collector.send(Job {
        launch: LaunchInfo {
            launch_id,
            kernel: "persistent".into(),
            grid: header.grid,
            block: header.block,
            parent: span.id(),
            host_thread: "main".into(),
            host_launch_ns: HostClock::Boottime.now_ns(),
            ..Default::default()
        },
        dispatch: tracing::dispatcher::get_default(|d| d.clone()),
        span,
        mark: Mark {
            stream: 9,
            event: Some(event),
            by_collector: false,
        },
        stream: None,
        work: Work::Streamed {
            header,
            place: Place { memory, region },
            arena,
            drain: None,
            watch: watch.map(|w| (w, 0)),
        },
    });
    (warps, event, cells)
}

/// Each warp, on a thread of its own, writes 120 ranges from `t0` (pausing
/// `pause` every 30, so that parts are cut while they run) and flushes.
pub(super) fn write_ranges(warps: Vec<Warp>, t0: u64, pause: Duration) {
    let threads: Vec<_> = warps
        .into_iter()
        .map(|mut w| {
            std::thread::spawn(move || {
                let mut t = t0 + w.index as u64 * 7;
                for k in 0..120u64 {
                    w.entry(word(t, 1, ENTRY_BEGIN), t + 1);
                    w.entry(word(t + 30, 1, ENTRY_END), t + 31);
                    t += 40;
                    if k % 30 == 0 {
                        std::thread::sleep(pause);
                    }
                }
                w.flush(t + 10);
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

pub(super) fn sink_dispatch() -> (Batches, Dispatch) {
    let sink = Batches::default();
    let layer = SinkLayer::new(sink.clone()).unwrap();
    (
        sink,
        Dispatch::new(tracing_subscriber::registry().with(layer)),
    )
}

/// The events of `warp` in a batch, by (block, warp).
pub(super) fn events_of(batches: &[Arc<Batch>], block: u32, warp: u32) -> Vec<Event> {
    let mut out = Vec::new();
    for b in batches {
        for s in b.buffer.view().slots() {
            if s.header.block_linear == block && s.header.warp == warp {
                out.extend(s.events());
            }
        }
    }
    out
}

#[test]
fn a_paced_stream_arrives_whole_and_in_parts_while_it_runs() {
    const T0: u64 = 1 << 40;
    const PHASES: u64 = 200;
    // 80 warps: enough for a poll to read them on several threads.
    const BLOCKS: u32 = 33;
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    // Rings of 2 chunks: every warp wraps a dozen times or more.
    let (warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_launch(&rig, BLOCKS, 2, true));
    let deadline = Instant::now() + Duration::from_secs(20);
    let parts_at_least = |n: usize| {
        while sink.0.lock().len() < n {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} parts while it ran"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let threads: Vec<_> = warps
        .into_iter()
        .map(|mut w| {
            let sink = sink.clone();
            std::thread::spawn(move || {
                // Per phase: a begin of Load, a switch to Mma, an end with a payload
                // (so payloads fall at chunk boundaries too).
                let mut t = T0 + w.index as u64 * 7;
                w.entry(word(t, 1, ENTRY_BEGIN), t);
                for k in 0..PHASES {
                    w.entry(word(t + 10, 2, ENTRY_SWITCH), t + 11);
                    w.entry(word(t + 30, 2, ENTRY_END), t + 31);
                    w.entry(word(k, 0, ENTRY_PAYLOAD), t + 31);
                    w.entry(word(t + 40, 1, ENTRY_BEGIN), t + 41);
                    t += 40;
                    if k == PHASES / 2 {
                        // Halfway, until a part has reached the sink: the rest
                        // comes in later ones.
                        while sink.0.lock().is_empty() {
                            assert!(Instant::now() < deadline, "no part halfway");
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
                w.entry(word(t + 5, 1, ENTRY_END), t + 6);
                w.flush(t + 10);
                w
            })
        })
        .collect();
    let warps: Vec<Warp> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // The event has not fired: these parts came while the kernel ran.
    parts_at_least(2);
    assert!(sink
        .0
        .lock()
        .iter()
        .all(|b| b.launch.part.is_some_and(|p| !p.last)));
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let batches = sink.0.lock().clone();
    let parts: Vec<Part> = batches.iter().map(|b| b.launch.part.unwrap()).collect();
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p.index, i as u32);
        assert_eq!(p.last, i + 1 == parts.len());
    }
    assert!(batches
        .windows(2)
        .all(|w| w[0].launch.launch_id == w[1].launch.launch_id));
    for w in &warps {
        assert_eq!((w.gaps, w.written), (0, w.stored.div_ceil(31)));
        let got = events_of(&batches, w.index / 2, w.index % 2);
        let mut t = T0 + w.index as u64 * 7;
        let mut want = Vec::new();
        for k in 0..PHASES {
            let range = |id, s, e, payload| Event {
                id,
                kind: EventKind::Range,
                start_ns: s,
                end_ns: e,
                payload,
            };
            want.push(range(1, t, t + 10, 0));
            want.push(range(2, t + 10, t + 30, k as u32));
            t += 40;
        }
        want.push(Event {
            id: 1,
            kind: EventKind::Range,
            start_ns: t,
            end_ns: t + 5,
            payload: 0,
        });
        assert_eq!(got.len(), want.len(), "warp {}", w.index);
        assert_eq!(got, want, "warp {}", w.index);
    }
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed, st.events_lost), (1, 0, 0));
    assert_eq!(st.stream_stalls, 0);
    assert_eq!(st.parts, parts.len() as u64);
    assert_eq!(st.events, 2 * BLOCKS as u64 * (2 * PHASES + 1));
    assert_accounted(&st);
}

/// A warp silent for seconds (a hung warp's wait that gives up, issue #32):
/// its ranges of 3 s and 10 s, a silence of 10 s between two chunks and one of
/// 3 s before the flush arrive whole, each chunk stamped so that its entries
/// unwrap from it.
#[test]
fn a_warp_silent_for_seconds_arrives_whole() {
    const T0: u64 = (1 << 40) - 1;
    const S: u64 = 1_000_000_000;
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    let (mut warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_launch(&rig, 1, 4, true));
    let mut w = warps.remove(0);
    let ev = |kind, id, start_ns, end_ns, payload| Event {
        id,
        kind,
        start_ns,
        end_ns,
        payload,
    };
    let (mut t, mut want) = (T0, Vec::new());
    // Two waits in one group, each ended with a payload.
    for (k, long) in [3 * S, 10 * S].into_iter().enumerate() {
        w.entry(word(t, 1, ENTRY_BEGIN), t);
        w.entry(word(t + long, 1, ENTRY_END), t + long);
        w.entry(word(k as u64, 0, ENTRY_PAYLOAD), t + long);
        want.push(ev(EventKind::Range, 1, t, t + long, k as u32));
        t += long + 10;
    }
    // The group's other 25 entries, then 10 s silent, one more, and 3 s
    // silent before the flush.
    for _ in 0..CHUNK_ENTRIES - 6 {
        w.entry(word(t, 2, ENTRY_INSTANT), t);
        want.push(ev(EventKind::Instant, 2, t, t, 0));
        t += 5;
    }
    t += 10 * S;
    w.entry(word(t, 2, ENTRY_INSTANT), t);
    want.push(ev(EventKind::Instant, 2, t, t, 0));
    w.flush(t + 3 * S);
    // The group in three chunks (a silence before each wait's end), and the last.
    assert_eq!((w.written, w.stored, w.gaps), (4, 32, 0));
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let batches = sink.0.lock().clone();
    assert_eq!(events_of(&batches, 0, 0), want);
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed, st.events_lost), (1, 0, 0));
    assert_eq!(st.events, want.len() as u64);
    assert_accounted(&st);
    drop(warps);
}

#[test]
fn a_host_that_falls_behind_makes_the_warp_drop_its_newest_and_count_them() {
    const T0: u64 = 1 << 35;
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    // 100 chunks of instants written before any drain reads: the ring holds 2 of
    // them. (Written once the drain ran, how many it read meanwhile depended on
    // the machine's load: 56 on a busy CI machine.)
    let mut t = T0;
    let (mut warps, event) = tracing::dispatcher::with_default(&dispatch, || {
        stream_launch_after(&rig, 1, 2, &mut |warps| {
            for _ in 0..100 * CHUNK_ENTRIES {
                t += 3;
                warps[0].entry(word(t, 1, ENTRY_INSTANT), t + 1);
            }
        })
    });
    let mut w = warps.remove(0);
    let stored = w.written;
    assert_eq!(stored, 2, "{stored} chunks stored");
    assert_eq!(w.lost, (100 - stored) * CHUNK_ENTRIES as u32);
    // Once the collector has read them, the warp stores again, after a gap.
    let head = w.slot + so::READ;
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.memory.load_u32(head) < stored {
        assert!(
            Instant::now() < deadline,
            "the collector never read the ring"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    w.read = stored;
    for _ in 0..CHUNK_ENTRIES {
        t += 3;
        w.entry(word(t, 1, ENTRY_INSTANT), t + 1);
    }
    w.flush(t + 10);
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let batches = sink.0.lock().clone();
    let got = events_of(&batches, 0, 0);
    let kept = (stored as usize + 1) * CHUNK_ENTRIES;
    assert_eq!(got.len(), kept);
    let st = rig.shared.stats();
    assert_eq!(st.events, kept as u64);
    assert_eq!(st.events_lost, u64::from(w.lost));
    assert_eq!(st.events + st.events_lost, 101 * CHUNK_ENTRIES as u64);
    assert_eq!((st.delivered, st.failed), (1, 0));
    assert_accounted(&st);
    // Both warps' slots come back zero, their region free for the next launch.
    drop(warps);
}

/// A sink that holds the collector in its first `on_batch` until opened.
#[derive(Default)]
struct Gate {
    entered: AtomicU64,
    open: Mutex<bool>,
    opened: parking_lot::Condvar,
    batches: Batches,
}

impl Gate {
    fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }
}

/// Opens the gate when dropped: a failed assertion does not leave the collector held.
struct Opens<'a>(&'a Gate);

impl Drop for Opens<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl BatchSink for Arc<Gate> {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.entered.fetch_add(1, Ordering::AcqRel);
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        self.batches.on_batch(batch);
    }
    fn flush(&self) {}
}

#[test]
fn a_collector_held_back_stops_the_drain_so_the_warps_drop_instead_of_the_host_piling_parts() {
    const T0: u64 = 1 << 36;
    // The drain threads stop reading as soon as a part waits for the collector.
    let rig = Rig::backlogged(0);
    let gate = Arc::new(Gate::default());
    let dispatch =
        Dispatch::new(tracing_subscriber::registry().with(SinkLayer::new(gate.clone()).unwrap()));
    let (mut warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_launch(&rig, 1, 2, false));
    let mut w = warps.remove(0);
    let _opens = Opens(&gate);
    let head = w.slot + so::READ;
    let mut t = T0;
    let mut chunk = |w: &mut Warp| {
        for _ in 0..CHUNK_ENTRIES {
            t += 3;
            w.entry(word(t, 1, ENTRY_INSTANT), t + 1);
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // A first chunk: its part reaches the sink, which holds the collector.
    chunk(&mut w);
    wait("the first part never reached the sink", &|| {
        gate.entered.load(Ordering::Acquire) == 1
    });
    // Then a chunk a millisecond: the drain reads them (the collector takes no
    // part) until it has cut one, and from then on reads nothing: the ring
    // fills, and the warp drops. The warp may drop before the drain has cut
    // that part (a drain slowed by a busy machine read 2 chunks more), so the
    // drain has stopped once the warp drops and the ring's `read` has not moved
    // for 200 chunks.
    let (mut stopped_at, mut still) = (w.memory.load_u32(head), 0);
    while w.gaps == 0 || still < 200 {
        assert!(Instant::now() < deadline, "the drain never stopped");
        chunk(&mut w);
        std::thread::sleep(Duration::from_millis(1));
        let read = w.memory.load_u32(head);
        still = if read == stopped_at { still + 1 } else { 0 };
        stopped_at = read;
    }
    for _ in 0..100 {
        chunk(&mut w);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(w.memory.load_u32(head), stopped_at, "the drain read on");
    assert_eq!(gate.entered.load(Ordering::Acquire), 1);
    // The sink lets go: the collector takes the waiting part, the drain reads
    // the ring again, and after the gap the warp stores again.
    gate.open();
    wait("the drain never read again", &|| {
        w.memory.load_u32(head) == w.written
    });
    w.read = w.written;
    let gaps = w.gaps;
    chunk(&mut w);
    assert_eq!(w.gaps, gaps);
    w.flush(t + 10);
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let st = rig.shared.stats();
    let written = t.saturating_sub(T0) / 3;
    assert!(st.events_lost >= 100 * CHUNK_ENTRIES as u64 - 2 * CHUNK_ENTRIES as u64);
    assert_eq!(st.events + st.events_lost, written);
    assert_eq!(st.events, u64::from(w.stored));
    assert!(st.stream_stalls >= 1, "{} stalls", st.stream_stalls);
    // Held back, the drain read nothing while the warp stored 300 chunks at
    // least a millisecond apart.
    assert!(
        st.stream_longest_gap >= Duration::from_millis(300),
        "{:?}",
        st.stream_longest_gap
    );
    assert_eq!((st.delivered, st.failed), (1, 0));
    assert_eq!(
        events_of(&gate.batches.0.lock(), 0, 0).len() as u64,
        st.events
    );
    assert_accounted(&st);
    drop(warps);
}

/// The parts the drain delivers (packed buffers, `Part`s in order) are what
/// everything downstream takes as one launch: one kernel slice in a trace,
/// one launch in a report, and a capture that replays the same parts.
#[test]
fn a_drained_stream_is_one_launch_downstream() {
    const T0: u64 = 1 << 40;
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    let (warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_launch(&rig, 4, 2, true));
    write_ranges(warps, T0, Duration::from_millis(2));
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let parts = sink.0.lock().clone();
    assert!(parts.len() >= 2, "{} parts", parts.len());
    let events: u64 = parts.iter().map(|b| b.buffer.event_count()).sum();
    assert_eq!(events, 8 * 120);

    let mut trace = crate::perfetto::TraceWriter::new(Vec::new()).unwrap();
    for b in &parts {
        trace.write_batch(b).unwrap();
    }
    let (_, stats) = trace.finish().unwrap();
    assert_eq!((stats.kernels, stats.device_events), (1, events));

    let mut timeline = crate::report::Timeline::new();
    for b in &parts {
        let last = b.launch.part.unwrap().last;
        timeline.add_part(b.launch.launch_id, &b.buffer.view(), last);
    }
    let report = timeline.report();
    assert_eq!((report.launches, report.events), (1, events));
    let warps: u64 = report.sms.iter().map(|s| s.warps).sum();
    assert_eq!(warps, 8, "a warp in every part is one warp");

    let capture = crate::capture::Capture {
        devices: vec![crate::capture::CaptureDevice {
            info: (*parts[0].device).clone(),
            calibrations: Vec::new(),
        }],
        launches: parts
            .iter()
            .map(|b| crate::capture::CaptureLaunch::new(0, &b.launch, b.buffer.clone()))
            .collect(),
        ..Default::default()
    };
    let mut bytes = Vec::new();
    capture.to_writer(&mut bytes).unwrap();
    let back = crate::capture::Capture::from_reader(&bytes[..]).unwrap();
    assert_eq!(back, capture);
    let replayed: Vec<_> = back.launches.iter().map(|l| l.part).collect();
    let delivered: Vec<_> = parts.iter().map(|b| b.launch.part).collect();
    assert_eq!(replayed, delivered);
}

/// A recalibration that fails beside a running stream, as on the H200 (where no
/// kernel starts beside a persistent one), and succeeds otherwise, with a
/// checkpoint past the tests' events. It keeps what it was asked.
struct NoKernelBesideStream(Arc<Mutex<Vec<bool>>>);

impl Recalibrate for NoKernelBesideStream {
    fn round(&mut self, beside_stream: bool) -> Result<Round, ProfilerError> {
        self.0.lock().push(beside_stream);
        if beside_stream {
            return Err(crate::cuda::CalibrateError::Timeout {
                round: 0,
                timeout: crate::cuda::calibrate::Calibrator::TIMEOUT_BESIDE_STREAM,
            }
            .into());
        }
        Ok(Round {
            samples: Vec::new(),
            checkpoint: crate::clock::Checkpoint {
                map: ClockMap::exact(1 << 41, (1 << 41) + 5_000, 0.0),
                host_offsets: HostOffsets::default(),
            },
        })
    }
}

#[test]
fn beside_a_running_stream_a_recalibration_is_tried_once_as_such_then_again_after_it() {
    const T0: u64 = 1 << 40;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let recal = NoKernelBesideStream(asked.clone());
    // Due 1 ms after a part is held: every part asks for a checkpoint.
    let rig = Rig::new(0, Some((Box::new(recal), Duration::from_millis(1))));
    let (sink, dispatch) = sink_dispatch();
    let (warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_launch(&rig, 2, 2, true));
    write_ranges(warps, T0, Duration::from_millis(3));
    let deadline = Instant::now() + Duration::from_secs(20);
    while asked.lock().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no recalibration while the stream ran"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Held parts keep coming due: none is tried again while the stream runs.
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(*asked.lock(), [true]);
    assert!(!sink.0.lock().is_empty(), "parts wait for no checkpoint");
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let asked = asked.lock().clone();
    assert!(
        asked.len() >= 2 && asked[1..].iter().all(|b| !b),
        "{asked:?}"
    );
    let st = rig.shared.stats();
    assert_eq!((st.calibrations_missed, st.delivered, st.failed), (1, 1, 0));
    assert_eq!(rig.shared.calibration().latest().map.anchor().0, 1 << 41);
    let events: u64 = sink.0.lock().iter().map(|b| b.buffer.event_count()).sum();
    assert_eq!(events, 4 * 120);
    assert_accounted(&st);
}
