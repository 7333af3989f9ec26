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
fn launches_on_the_legacy_stream_are_marked_by_the_collector_one_event_for_all() {
    let (_rec, dispatch) = recorder_dispatch();
    // Never by the clock: only a flush makes the collector look.
    let rig = Rig::paced(
        0,
        None,
        Calibration::exact(0, 5_000, 0.0),
        1 << 20,
        Duration::from_secs(3600),
    );
    rig.gpu.legacy_busy.store(true, Ordering::Relaxed);
    tracing::dispatcher::with_default(&dispatch, || {
        for i in 0..5 {
            // No event from the launching thread: the collector marks them.
            rig.launch_marked(0, 1_000_000 + i * 10_000, None, None, true)
                .unwrap();
        }
    });
    // Not looked at: no mark and no query, nothing back.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.gpu.legacy_asked.load(Ordering::Relaxed), 0);
    assert_eq!(rig.gpu.queries.load(Ordering::Relaxed), 0);
    // A blocking stream captures a graph: the legacy stream may not be marked.
    rig.gpu.legacy_capturing.store(true, Ordering::Relaxed);
    std::thread::scope(|s| {
        let flush = s.spawn(|| rig.collector.flush());
        let deadline = Instant::now() + Duration::from_secs(10);
        while rig.gpu.legacy_asked.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "the flush did not look");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Unmarked: never asked about (no event would mean finished).
        assert_eq!(rig.gpu.legacy_marks.load(Ordering::Relaxed), 0);
        assert_eq!(rig.gpu.queries.load(Ordering::Relaxed), 0);
        assert_eq!(rig.shared.stats().delivered, 0);
        rig.gpu.legacy_capturing.store(false, Ordering::Relaxed);
        // Then one mark for the five, not yet reached by the stream, so none is
        // brought back however often the flush's passes ask.
        while rig.gpu.queries.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "the flush did not ask");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(rig.gpu.legacy_marks.load(Ordering::Relaxed), 1);
        assert_eq!(rig.shared.stats().delivered, 0);
        rig.gpu.finish_legacy();
        flush.join().unwrap().unwrap();
    });
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed, st.skipped), (5, 0, 0));
    assert_accounted(&st);
    // The shared event went back to the pool once, after the last of its five.
    assert_eq!(rig.gpu.released.load(Ordering::Relaxed), 1);
    assert_eq!(rig.gpu.legacy_marks.load(Ordering::Relaxed), 1);
    assert_eq!(rig.arena.used(), 0);
}
