//! v2 entry streams into the strict decoder: a one-warp buffer whose v2 slot holds the
//! input's bytes as its entries (the headers written around them), so that the fuzzer
//! explores nesting, payloads and times rather than header fields. It must answer Ok or
//! Err, never panic; what it accepts rebuilds into as many events as it says, inside the
//! slot's time, in the order they end, with no range ending before it begins.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::wire::{
    slot_v2_offsets as so, BUFFER_HEADER_SIZE, ENTRY_SIZE, SLOT_HEADER_SIZE, SLOT_MAGIC_V2,
};
use tracing_gpu::format::{BufferBuilder, EventKind};

fuzz_target!(|data: &[u8]| {
    // 1 byte of spare capacity, last_ts and anchor_ts, then the entries.
    let Some((head, entries)) = data.split_first_chunk::<17>() else {
        return;
    };
    let count = entries.len() / ENTRY_SIZE;
    let capacity = (count as u32).div_ceil(2) + u32::from(head[0] % 3);
    let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], capacity).finish();
    let s = BUFFER_HEADER_SIZE;
    let mut put = |at: usize, v: &[u8]| b[s + at..s + at + v.len()].copy_from_slice(v);
    put(so::MAGIC, &SLOT_MAGIC_V2.to_le_bytes());
    put(so::ENTRY_COUNT, &(count as u32).to_le_bytes());
    put(so::LAST_TS, &head[1..9]);
    put(so::ANCHOR_TS, &head[9..17]);
    put(SLOT_HEADER_SIZE, &entries[..count * ENTRY_SIZE]);
    let Ok(cap) = Buffer::decode(&b, None) else {
        return;
    };
    let mut events = 0u64;
    for slot in cap.slots() {
        let h = slot.header;
        assert!(h.first_ts <= h.last_ts);
        assert_eq!(slot.records().len(), 0);
        let mut prev = h.first_ts;
        for e in slot.events() {
            assert!(h.first_ts <= e.start_ns && e.start_ns <= e.end_ns);
            assert!(prev <= e.end_ns && e.end_ns <= h.last_ts);
            assert!(e.kind == EventKind::Range || e.start_ns == e.end_ns);
            prev = e.end_ns;
            events += 1;
        }
        assert_eq!(slot.events().len() as u32, h.record_count);
    }
    assert_eq!(events, cap.event_count());
});
