//! Any bytes into the strict decoder: it must answer Ok or Err, never panic,
//! and whatever it accepts must keep every promise the format makes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::EventKind;
use tracing_gpu::registry::EventRegistry;

fuzz_target!(|data: &[u8]| {
    let reg = EventRegistry::from_pairs([(0, "a"), (1, "b"), (2, "c")]).unwrap();
    for r in [None, Some(&reg)] {
        let Ok(cap) = Buffer::decode(data, r) else {
            continue;
        };
        let mut events = 0u64;
        for s in cap.slots() {
            let h = s.header;
            assert!(h.first_ts <= h.last_ts);
            let mut prev = h.first_ts;
            for e in s.events() {
                assert!(h.first_ts <= e.start_ns && e.start_ns <= e.end_ns);
                assert!(prev <= e.end_ns && e.end_ns <= h.last_ts);
                assert!(e.kind == EventKind::Range || e.start_ns == e.end_ns);
                if r.is_some() {
                    assert!(reg.contains(e.id));
                }
                prev = e.end_ns;
                events += 1;
            }
        }
        assert_eq!(events, cap.event_count());
    }
});
