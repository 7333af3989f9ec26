//! Every loss counted in events, per warp: simulated warps make nested ranges,
//! `switch_to` chains and instants, with and without payloads, into fixed slots
//! that overflow and into rings that the host cannot keep up with; per warp, the
//! events delivered plus the events lost are the events the warp made, whatever
//! was dropped where.
use super::drains::{sink_dispatch, stream_launch, word, Warp};
use super::*;
use crate::format::{ENTRY_BEGIN, ENTRY_END, ENTRY_INSTANT, ENTRY_PAYLOAD, ENTRY_SWITCH};

/// One call of a warp's recorder: its entry (kind, event id) and the payload
/// entry after it, if the call passes one.
#[derive(Debug, Clone, Copy)]
struct Call {
    kind: u16,
    id: u16,
    payload: Option<u32>,
}

/// What a warp does.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// One range, then `switch_to` after `switch_to` (one entry an event), as a
    /// k-loop of load → mma phases writes.
    Chain,
    /// Every event with a payload: two entries an event.
    Payloads,
    /// Ranges nested (the rig's registry has two types: 2 deep), switches,
    /// instants, payloads now and then.
    Mixed,
}

/// `n` calls of a warp doing `work`, well nested, drawn from `seed`, and the
/// events they make (an end, a switch or an instant ends one; ranges left open
/// at the end are none).
fn calls(work: Work, seed: u64, n: usize) -> (Vec<Call>, u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut draw = |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let (mut out, mut open, mut made) = (Vec::with_capacity(n), Vec::<u16>::new(), 0);
    // An id not open below the innermost range (a switch may reopen that one).
    let fresh = |open: &[u16], r: u64| {
        (1..=2u16)
            .cycle()
            .skip(r as usize)
            .find(|id| !open.contains(id))
            .unwrap()
    };
    while out.len() < n {
        let k = out.len() as u32;
        let (kind, id, payload) = match work {
            Work::Chain if open.is_empty() => (ENTRY_BEGIN, 1, None),
            Work::Chain => (ENTRY_SWITCH, 1 + (k % 2) as u16, None),
            Work::Payloads if open.is_empty() => (ENTRY_BEGIN, 1, None),
            Work::Payloads => match draw(3) {
                0 => (ENTRY_SWITCH, 1 + (k % 2) as u16, Some(k)),
                1 => (ENTRY_INSTANT, 2, Some(k)),
                _ => (ENTRY_END, open[0], Some(k)),
            },
            Work::Mixed => {
                let payload = (draw(3) == 0).then_some(k);
                match draw(5) {
                    0 | 1 if open.len() < 2 => (ENTRY_BEGIN, fresh(&open, draw(2)), None),
                    2 if !open.is_empty() => (ENTRY_END, *open.last().unwrap(), payload),
                    3 if !open.is_empty() => (
                        ENTRY_SWITCH,
                        fresh(&open[..open.len() - 1], draw(2)),
                        payload,
                    ),
                    _ => (ENTRY_INSTANT, 1, payload),
                }
            }
        };
        match kind {
            ENTRY_BEGIN => open.push(id),
            ENTRY_END => {
                open.pop();
            }
            ENTRY_SWITCH => *open.last_mut().unwrap() = id,
            _ => {}
        }
        made += u64::from(kind != ENTRY_BEGIN);
        out.push(Call { kind, id, payload });
    }
    (out, made)
}

fn work_of(warp: u32) -> Work {
    [Work::Chain, Work::Payloads, Work::Mixed][warp as usize % 3]
}

/// Per (block, warp): the events delivered and the events counted lost, over
/// every batch (a streamed launch's warp is in many parts).
fn tally(batches: &[Arc<Batch>]) -> HashMap<(u32, u32), (u64, u64)> {
    let mut by_warp: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
    for b in batches {
        for s in b.buffer.view().slots() {
            let t = by_warp
                .entry((s.header.block_linear, s.header.warp))
                .or_default();
            t.0 += s.events().count() as u64;
            t.1 += u64::from(s.events_lost());
        }
    }
    by_warp
}

/// A stream whose warps write far faster than the drain reads 2-chunk rings:
/// chunks are dropped mid-range, mid-chain and between an event and its
/// payload, and the drain forgets the ranges open at each gap; a range lost at
/// a gap is counted once (the warp counts the dropped end, or the drain the
/// end it reads with nothing open), never twice.
#[test]
fn a_stream_that_outruns_the_drain_counts_every_event_lost_once_per_warp() {
    const T0: u64 = 1 << 40;
    const CALLS: usize = 12_000;
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    let (warps, event) =
        tracing::dispatcher::with_default(&dispatch, || stream_launch(&rig, 3, 2, false));
    let threads: Vec<_> = warps
        .into_iter()
        .map(|mut w: Warp| {
            std::thread::spawn(move || {
                let (calls, made) = calls(work_of(w.index), u64::from(w.index) + 1, CALLS);
                let mut t = T0 + u64::from(w.index) * 7;
                for (k, c) in calls.iter().enumerate() {
                    t += 3;
                    w.entry(word(t, c.id, c.kind), t + 1);
                    if let Some(p) = c.payload {
                        w.entry(word(u64::from(p), 0, ENTRY_PAYLOAD), t + 1);
                    }
                    if k % 3_000 == 2_999 {
                        // The drain reads some between the bursts.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                w.flush(t + 10);
                (w, made)
            })
        })
        .collect();
    let warps: Vec<(Warp, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let by_warp = tally(&sink.0.lock());
    let (mut gaps, mut all) = (0, 0);
    for (w, made) in &warps {
        let (delivered, lost) = by_warp
            .get(&(w.index / 2, w.index % 2))
            .copied()
            .unwrap_or_default();
        assert_eq!(
            (delivered + lost, lost >= u64::from(w.lost)),
            (*made, true),
            "warp {} ({:?}): {delivered} delivered + {lost} lost, {made} made; \
             {} chunks dropped, their ends {}",
            w.index,
            work_of(w.index),
            w.gaps,
            w.lost
        );
        gaps += w.gaps;
        all += made;
    }
    assert!(gaps > 0, "no chunk was dropped: the test tests nothing");
    let st = rig.shared.stats();
    assert_eq!((st.delivered, st.failed), (1, 0));
    assert_eq!(st.events + st.events_lost, all, "{st:?}");
    assert_accounted(&st);
}

/// Fixed slots (direct launches and graph nodes alike) keep a prefix of each
/// warp's entries; every event whose closing entry did not fit is counted lost,
/// in v2 slots as in v1, where a record is an event.
#[test]
fn fixed_slots_that_overflow_count_every_event_lost_per_warp() {
    const T0: u64 = 1 << 33;
    let rig = Rig::new(0, None);
    let (sink, dispatch) = sink_dispatch();
    // The simulated kernel's shape: 2 blocks × 2 warps, 8 records (16 entries) a slot.
    let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 8);
    let mut made = HashMap::new();
    for (slot, n) in [(0u32, 40usize), (1, 16), (2, 9)] {
        let w = b.warp_v2(slot / 2, slot % 2).unwrap();
        let (calls, m) = calls(work_of(slot), u64::from(slot) + 7, n);
        let mut t = T0;
        for c in calls {
            t += 5;
            match c.kind {
                ENTRY_BEGIN => w.begin(c.id, t),
                ENTRY_END => w.end(c.id, t),
                ENTRY_SWITCH => w.switch(c.id, t),
                _ => w.instant(c.id, t),
            };
            if let Some(p) = c.payload {
                w.payload(p);
            }
        }
        made.insert((slot / 2, slot % 2), m);
    }
    let v1 = b.warp(1, 1).unwrap();
    for k in 0..13 {
        v1.range(1, T0 + 10 * k, T0 + 10 * k + 5, 0);
    }
    made.insert((1, 1), 13);
    let bytes = b.finish();
    tracing::dispatcher::with_default(&dispatch, || rig.launch(1, T0, Some(bytes), true)).unwrap();
    rig.collector.flush().unwrap();
    let by_warp = tally(&sink.0.lock());
    let mut lost_somewhere = 0;
    for (warp, made) in &made {
        let (delivered, lost) = by_warp[warp];
        assert_eq!(
            delivered + lost,
            *made,
            "warp {warp:?}: {delivered} + {lost}"
        );
        lost_somewhere += lost;
    }
    assert!(lost_somewhere > 0);
    let st = rig.shared.stats();
    assert_eq!(st.events + st.events_lost, made.values().sum::<u64>());
    assert_accounted(&st);
}
