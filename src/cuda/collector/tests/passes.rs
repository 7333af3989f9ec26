//! How a pass finds finished launches (the finished prefix of each stream,
//! found with a few queries rather than one per launch), and when it brings
//! them back (in bulk, not at every pass).
use super::*;

#[test]
fn a_pass_asks_about_a_few_launches_per_stream_and_finds_the_finished_prefix() {
    let (_rec, dispatch) = recorder_dispatch();
    let rig = Rig::new(0, None);
    let mut held = Vec::new();
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..150u64 {
            // From launch 100 on, stream 7's launches have not finished (a stream's
            // launches finish in order).
            let fired = i < 100;
            let e = rig.launch(7, 1_000_000 + i * 10_000, None, fired).unwrap();
            if !fired {
                held.push(e);
            }
            // Launches on another stream finish on their own.
            rig.launch(8, 1_000_000 + i * 10_000, None, true).unwrap();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.shared.stats().delivered < 250 {
        assert!(Instant::now() < deadline, "{:?}", rig.shared.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        rig.shared.stats().delivered,
        250,
        "100 + 150 on the two streams"
    );
    for e in held {
        rig.gpu.fire(e);
    }
    rig.collector.flush().unwrap();
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed, st.skipped), (300, 0, 0));
    assert_accounted(&st);
    // One by one, every launch would have been asked about at least once (300),
    // and the unfinished one at every pass.
    let queries = rig.gpu.queries.load(Ordering::Relaxed);
    assert!(queries < 300, "{queries} event queries");
}

/// Waits (up to 10 s) until `rig` has delivered `n` launches.
fn wait_delivered(rig: &Rig, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.shared.stats().delivered < n {
        assert!(Instant::now() < deadline, "{:?}", rig.shared.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_collector_asks_only_when_due_or_when_the_arena_fills_or_a_flush_waits() {
    let (_rec, dispatch) = recorder_dispatch();
    // Never by the clock: only the arena's filling or a flush makes it ask.
    let arena = 64 << 10;
    let rig = Rig::paced(
        0,
        None,
        Calibration::exact(0, 5_000, 0.0),
        arena,
        Duration::from_secs(3600),
    );
    let launch = |i: u64| {
        tracing::dispatcher::with_default(&dispatch, || {
            rig.launch(7, 1_000_000 + i * 10_000, None, true).unwrap()
        })
    };
    // A few finished launches, far under an eighth of the arena: not asked about,
    // not brought back.
    for i in 0..3 {
        launch(i);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rig.gpu.queries.load(Ordering::Relaxed), 0);
    assert_eq!(rig.gpu.fetches.load(Ordering::Relaxed), 0);
    assert_eq!(rig.shared.stats().delivered, 0);
    // Pending regions reaching an eighth of the arena (`n` launches) are asked
    // about and brought back at once, in one fetch (two, if the collector looked
    // mid-way); those launched after that wait again.
    let per_launch = rig.arena.used() / 3;
    let n = (arena / 8).div_ceil(per_launch) as u64;
    for i in 3..n + 3 {
        launch(i);
    }
    wait_delivered(&rig, n);
    assert!(rig.gpu.fetches.load(Ordering::Relaxed) <= 2);
    // A flush does not wait.
    rig.collector.flush().unwrap();
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed, st.skipped), (n + 3, 0, 0));
    assert_accounted(&st);
    assert_eq!(rig.arena.used(), 0);
}

#[test]
fn launches_are_marked_by_the_collector_one_event_per_stream_which_they_hold_till_then() {
    let (_rec, dispatch) = recorder_dispatch();
    // Never by the clock: only a flush makes the collector look.
    let rig = Rig::paced(
        0,
        None,
        Calibration::exact(0, 5_000, 0.0),
        1 << 20,
        Duration::from_secs(3600),
    );
    // The legacy stream (0) and a stream of the application's own (7) still run.
    rig.gpu.busy.lock().extend([0, 7]);
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..5 {
            // No event from the launching thread: the collector marks them.
            for stream in [0, 7] {
                rig.launch_marked(stream, 1_000_000 + i * 10_000, None, None, true)
                    .unwrap();
            }
            // A per-thread default stream's launches come with their event.
            rig.launch(PER_THREAD, 1_000_000 + i * 10_000, None, true)
                .unwrap();
        }
    });
    // Not looked at: no mark and no query, nothing back; the jobs hold stream 7.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.gpu.marks_asked.load(Ordering::Relaxed), 0);
    assert_eq!(rig.gpu.queries.load(Ordering::Relaxed), 0);
    assert_eq!(rig.holding(7), 5);
    // Stream 7 captures a graph: it may not be marked; the legacy stream is,
    // once for its five.
    rig.gpu.capturing.lock().insert(7);
    std::thread::scope(|s| {
        let flush = s.spawn(|| rig.collector.flush());
        // Should an assertion fail, the streams end, so that the flush returns
        // and the test fails instead of waiting for it forever.
        let end = Finish(&rig.gpu, &[0, 7]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rig.gpu.marks_asked.load(Ordering::Relaxed) < 4 {
            assert!(Instant::now() < deadline, "the flush did not look");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*rig.gpu.marked.lock(), [0]);
        assert_eq!(rig.holding(7), 5);
        // Only the per-thread stream's five are back: the legacy stream's mark
        // is not reached, stream 7's are unmarked (never asked: no event would
        // mean finished).
        assert_eq!(rig.shared.stats().delivered, 5);
        rig.gpu.capturing.lock().remove(&7);
        // Then one mark for stream 7's five, after which they let it go; not
        // yet reached by the stream, so none is brought back.
        while rig.gpu.marked.lock().len() < 2 {
            assert!(Instant::now() < deadline, "stream 7 was not marked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*rig.gpu.marked.lock(), [0, 7]);
        assert_eq!(rig.holding(7), 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(rig.shared.stats().delivered, 5);
        drop(end);
        flush.join().unwrap().unwrap();
    });
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed, st.skipped), (15, 0, 0));
    assert_accounted(&st);
    // Each shared event went back to the pool once, after the last of its five;
    // the per-thread stream's five with their launches.
    assert_eq!(rig.gpu.released.load(Ordering::Relaxed), 2 + 5);
    assert_eq!(rig.gpu.marked.lock().len(), 2);
    assert_eq!(rig.arena.used(), 0);
}

/// Ends the simulated streams when dropped.
struct Finish<'a>(&'a Gpu, &'a [u64]);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        for &s in self.1 {
            self.0.capturing.lock().remove(&s);
            self.0.finish_stream(s);
        }
    }
}
