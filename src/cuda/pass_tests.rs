//! How a pass finds finished launches: the finished prefix of each stream,
//! found with a few event queries rather than one per launch.
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
