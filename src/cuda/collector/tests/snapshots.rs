//! The watchdog's snapshots beside the trace, through the simulated device: warps
//! that write their rings and their watch cells as the recorder does in watch mode.
//! A persistent kernel's snapshots agree with the trace streamed afterwards; in
//! Perfetto, each snapshot is an instant, and a launch still running when the trace
//! ends leaves its kernel and each warp's open ranges as slices that never end.
use std::path::{Path, PathBuf};

use super::drains::{events_of, watched_launch, word, Batches, Warp};
use super::*;
use crate::cuda::__private::WatchdogSnapshot;
use crate::cuda::job::Watchdog;
use crate::deliver::watched::{self, Watched};
use crate::deliver::SinkLayer;
use crate::format::{ENTRY_BEGIN, ENTRY_END, ENTRY_PAYLOAD};
use crate::perfetto::PerfettoLayer;
use crate::watch::tests::WarpSim;

const LOAD: u16 = 1;
const MMA: u16 = 2;

/// One warp in watch mode: each entry into its ring and its watch cell.
struct Watching {
    ring: Warp,
    cell: WarpSim,
    memory: Arc<Memory>,
}

impl Watching {
    fn start(ring: Warp, (memory, cells): (&Arc<Memory>, usize), t: u64) -> Watching {
        let memory = memory.clone();
        let m = memory.clone();
        // The SM the ring's chunks name (`Warp::store`).
        let sm = ring.index % 100;
        let cell = WarpSim::start(cells, ring.index, sm, t, &mut |at, v| m.store_u64(at, v));
        Watching { ring, cell, memory }
    }

    fn begin(&mut self, id: u16, t: u64) {
        self.ring.entry(word(t, id, ENTRY_BEGIN), t);
        let m = &self.memory;
        self.cell.begin(id, t, &mut |at, v| m.store_u64(at, v));
    }

    fn end(&mut self, id: u16, payload: u32, t: u64) {
        self.ring.entry(word(t, id, ENTRY_END), t);
        self.ring
            .entry(word(u64::from(payload), 0, ENTRY_PAYLOAD), t);
        let m = &self.memory;
        self.cell
            .end(id, Some(payload), t, &mut |at, v| m.store_u64(at, v));
    }
}

/// The watchdog's snapshots, whole, as a sink takes them beside their events (and as
/// the device tests take them, `cuda::__private::WatchdogSnapshot`).
#[derive(Default, Clone)]
struct Snapshots(
    Arc<Mutex<Vec<Arc<Watched>>>>,
    Arc<Mutex<Vec<WatchdogSnapshot>>>,
);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Snapshots {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(w) = watched::current(event) {
            self.1.lock().push(WatchdogSnapshot::of(event).unwrap());
            self.0.lock().push(w);
        }
    }
}

impl Snapshots {
    /// Waits until there are more than `n`.
    fn wait_past(&self, n: usize) {
        let until = Instant::now() + Duration::from_secs(20);
        while self.0.lock().len() <= n {
            assert!(Instant::now() < until, "no snapshot past {n}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

const T0: u64 = 1 << 40;

/// Step `k` of warp `w`'s persistent loop (from `T0 + k·1000`): the wait of the step
/// before ends, a load of k-tile `k` (plus the warp's index) comes and goes, a wait
/// begins. Step 0 begins the mma loop around all of it.
fn step(w: &mut Watching, k: u64) {
    let t = T0 + k * 1_000 + u64::from(w.ring.index);
    if k == 0 {
        w.begin(MMA, t);
    } else {
        w.end(LOAD, 0, t);
    }
    w.begin(LOAD, t + 100);
    w.end(LOAD, (k + u64::from(w.ring.index)) as u32, t + 200);
    // The wait is a load without payload on the trace (ids are what the rig's registry has).
    w.begin(LOAD, t + 300);
}

#[test]
fn a_persistent_kernels_snapshots_agree_with_its_streamed_trace() {
    const STEPS: u64 = 6;
    let rig = Rig::new(0, None);
    let batches = Batches::default();
    let snapshots = Snapshots::default();
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(SinkLayer::new(batches.clone()).unwrap())
            .with(snapshots.clone()),
    );
    let dog = Watchdog {
        deadline: Duration::from_millis(100),
        every: Some(Duration::from_millis(60)),
    };
    // 2 blocks of 2 warps, rings of 8 chunks: each warp's steps fill chunks as they go.
    let (warps, event, (memory, cells)) = tracing::dispatcher::with_default(&dispatch, || {
        watched_launch(&rig, 2, 8, true, Some(dog))
    });
    let mut warps: Vec<Watching> = warps
        .into_iter()
        .map(|r| Watching::start(r, (&memory, cells), T0))
        .collect();
    // The warps take a step, then hold still until a snapshot was read while they
    // did: that one must agree with the trace exactly. (One taken while they move
    // may catch a warp between two records.)
    let (mut still, mut held) = (Vec::new(), Vec::new());
    for k in 0..STEPS {
        for w in &mut warps {
            step(w, k);
        }
        let moved = snapshots.0.lock().len();
        // The first may have been read before the step ended; the second was not.
        snapshots.wait_past(moved + 1);
        still.push(snapshots.0.lock()[moved + 1].clone());
        held.push(snapshots.1.lock()[moved + 1].clone());
    }
    for w in &mut warps {
        let t = T0 + STEPS * 1_000 + u64::from(w.ring.index);
        w.end(LOAD, 0, t);
        w.end(MMA, 0, t + 10);
        w.ring.flush(t + 20);
    }
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let batches = batches.0.lock().clone();
    assert!(batches.last().unwrap().launch.part.unwrap().last);
    for (k, w) in still.iter().enumerate() {
        let s = &w.snapshot;
        let bad = crate::watch::disagreements(s, |block, warp| events_of(&batches, block, warp));
        assert!(bad.is_empty(), "step {k}: {bad:#?}");
        // The same, as a device test checks it.
        let h = &held[k];
        assert_eq!((h.launch_id(), h.index()), (s.launch_id, s.index));
        assert_eq!(h.text(), w.text);
        assert!(h.disagreements(&batches).is_empty(), "step {k}");
        // They are the warps' steps: each in mma > wait since its step, after k-tile k.
        for warp in &s.warps {
            let crate::watch::State::Running { open, last, .. } = &warp.state else {
                panic!("step {k}: {warp:?}")
            };
            let since = T0 + k as u64 * 1_000 + u64::from(warp.slot) + 300;
            assert_eq!(
                open.iter().map(|o| (o.id, o.since_ns)).collect::<Vec<_>>(),
                [(MMA, T0 + u64::from(warp.slot)), (LOAD, since)],
                "step {k}"
            );
            assert_eq!(
                last.map(|l| (l.id, l.payload)),
                Some((LOAD, Some(k as u32 + warp.slot))),
                "step {k}"
            );
        }
    }
    // The check can fail: an open range begun at another time, a payload not the trace's.
    let mut moved = still[1].snapshot.clone();
    if let crate::watch::State::Running { open, .. } = &mut moved.warps[0].state {
        open[1].since_ns += 1;
    }
    let bad = crate::watch::disagreements(&moved, |block, warp| events_of(&batches, block, warp));
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(
        bad[0].contains("block 0 warp 0: event 1 open since"),
        "{bad:#?}"
    );
    let mut wrong = still[2].snapshot.clone();
    if let crate::watch::State::Running { last, .. } = &mut wrong.warps[3].state {
        last.as_mut().unwrap().payload = Some(99);
    }
    let bad = crate::watch::disagreements(&wrong, |block, warp| events_of(&batches, block, warp));
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(bad[0].contains("block 1 warp 1: closed last"), "{bad:#?}");
}

/// A watched launch of 2 blocks of 2 warps, traced by a Perfetto layer with
/// `encoders` encoder threads: the warps take `steps` steps, stop, and a snapshot
/// is read; then, if `finish`, the launch ends (every range closed) before the
/// trace does. Returns the trace's path (in `dir`) and the snapshot the trace saw last.
fn traced(dir: &Path, encoders: usize, steps: u64, finish: bool) -> (PathBuf, Arc<Watched>) {
    let path = dir.join(format!("watched-{encoders}-{finish}.perfetto-trace"));
    let rig = Rig::new(0, None);
    let (layer, guard) = PerfettoLayer::builder()
        .file(&path)
        .encoder_threads(encoders)
        .build()
        .unwrap();
    let snapshots = Snapshots::default();
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(layer)
            .with(snapshots.clone()),
    );
    let dog = Watchdog {
        deadline: Duration::from_millis(50),
        every: Some(Duration::from_millis(50)),
    };
    let (warps, event, (memory, cells)) = tracing::dispatcher::with_default(&dispatch, || {
        watched_launch(&rig, 2, 8, true, Some(dog))
    });
    let mut warps: Vec<Watching> = warps
        .into_iter()
        .map(|r| Watching::start(r, (&memory, cells), T0))
        .collect();
    for k in 0..steps {
        for w in &mut warps {
            step(w, k);
        }
    }
    // A part holds what the warps stored: wait for one, and for a snapshot after it.
    let until = Instant::now() + Duration::from_secs(20);
    while rig.shared.stats().parts == 0 {
        assert!(Instant::now() < until, "no part");
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen = snapshots.0.lock().len();
    snapshots.wait_past(seen + 1);
    if finish {
        for w in &mut warps {
            let t = T0 + steps * 1_000 + u64::from(w.ring.index);
            w.end(LOAD, 0, t);
            w.end(MMA, 0, t + 10);
            w.ring.flush(t + 20);
        }
        rig.gpu.fire(event);
        rig.collector.flush().unwrap();
    }
    // Every snapshot from this one on says the same: the warps stand still.
    let last = snapshots.0.lock()[seen + 1].clone();
    let stats = guard.finish().unwrap();
    assert!(stats.kernels >= 1, "{stats:?}");
    if !finish {
        rig.gpu.fire(event);
        rig.collector.flush().unwrap();
    }
    (path, last)
}

/// The checker's slices (`--slices-out`): (track path, name, start, end or `None`).
fn slices(out: &Path) -> Vec<(String, String, u64, Option<u64>)> {
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v[0].as_str().unwrap().to_owned(),
                v[1].as_str().unwrap_or_default().to_owned(),
                v[2].as_u64().unwrap(),
                v[3].as_u64(),
            )
        })
        .collect()
}

#[test]
fn a_launch_still_running_at_the_end_leaves_each_warps_open_ranges_open() {
    let dir = tempfile::tempdir().unwrap();
    for encoders in [1, 3] {
        let (path, last) = traced(dir.path(), encoders, 12, false);
        let out = dir.path().join(format!("slices-{encoders}.json"));
        let Some(s) = crate::test_support::perfetto_check::check(
            &path,
            &["--allow-open-slices", "--slices-out", out.to_str().unwrap()],
        ) else {
            return;
        };
        // Two ranges open per warp, and the kernel.
        assert_eq!(s["open_device_slices"], 8, "{s:?}");
        assert_eq!(s["open_kernel_slices"], 1, "{s:?}");
        assert_eq!(s["open_slices"], 9, "{s:?}");
        let all = slices(&out);
        // Device time + 5 µs = trace time (the rig's calibration).
        let host = |t: u64| t + 5_000;
        for slot in 0..4u64 {
            let warp = format!("block {} warp {}", slot / 2, slot % 2);
            let mut open: Vec<(u64, &str, &str)> = all
                .iter()
                .filter(|(p, _, _, end)| end.is_none() && p.contains(&warp))
                .map(|(p, n, start, _)| (*start, n.as_str(), p.as_str()))
                .collect();
            open.sort();
            // Both on one lane: the warp's second, as the first has loads after the mma's start.
            assert!(
                open.iter()
                    .all(|(_, _, p)| p.ends_with(&format!("{warp} #2"))),
                "{open:?}"
            );
            let open: Vec<(&str, u64)> = open.iter().map(|&(t, n, _)| (n, t)).collect();
            // The warps stopped at their last step (k = 11), which the snapshot holds.
            let k = 11;
            let crate::watch::State::Running { open: held, .. } =
                &last.snapshot.warps[slot as usize].state
            else {
                panic!("{warp} not running");
            };
            assert_eq!(
                held.last().map(|o| o.since_ns),
                Some(T0 + k * 1_000 + slot + 300)
            );
            assert_eq!(
                open,
                [
                    ("mma", host(T0 + slot)),
                    ("load", host(T0 + k * 1_000 + slot + 300))
                ],
                "{encoders} encoders, {warp}"
            );
            // The ranges closed on the warp's tracks nest with the open ones: none
            // crosses the open wait's start.
            let wait = host(T0 + k * 1_000 + slot + 300);
            for (p, n, start, end) in all.iter().filter(|(p, ..)| p.contains(&warp)) {
                if let Some(end) = end {
                    assert!(
                        *end <= wait || *start >= wait,
                        "{p}: {n} [{start}, {end}] crosses the open wait at {wait}"
                    );
                }
            }
        }
        let marks: Vec<_> = all
            .iter()
            .filter(|(p, n, ..)| p.ends_with("/watchdog") && n.starts_with("watchdog snapshot "))
            .collect();
        assert!(!marks.is_empty(), "{encoders}: no snapshot instant");
        assert!(
            marks
                .iter()
                .all(|(_, n, start, end)| n.ends_with(" of persistent") && *end == Some(*start)),
            "{marks:?}"
        );
    }
}

#[test]
fn a_launch_that_finishes_after_its_snapshot_leaves_nothing_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = traced(dir.path(), 1, 12, true);
    // Without --allow-open-slices: a slice that never ends fails the check.
    let Some(s) = crate::test_support::perfetto_check::check(&path, &["--expect-kernels", "1"])
    else {
        return;
    };
    assert_eq!(s["open_slices"], 0, "{s:?}");
    // Every range, whole: per warp 12 loads with k-tiles, 12 waits, the mma loop.
    assert_eq!(s["device_slices"], 4 * (12 + 12 + 1), "{s:?}");
    assert!(s["other_slices"] >= 1, "the snapshot's instant: {s:?}");
}
