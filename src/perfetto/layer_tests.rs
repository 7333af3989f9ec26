//! The layer's thread buffers: the chunks the writer has written come back
//! for the thread's next ones, and no more of them are kept than the queue held.
use super::*;
use tracing_subscriber::layer::SubscriberExt;

#[test]
fn a_thread_fills_the_chunks_the_writer_gave_back_and_keeps_few() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard) = PerfettoLayer::builder()
        .file(dir.path().join("t.perfetto-trace"))
        .chunk_bytes(4096)
        .queued_chunks(4)
        .build()
        .unwrap();
    let shared = layer.shared.clone();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let spans = |n: u64| {
        tracing::dispatcher::with_default(&dispatch, || {
            for i in 0..n {
                let s = tracing::info_span!("step", i);
                let _e = s.enter();
            }
        })
    };
    // Many chunks: the writer takes them and gives (at most four) back.
    spans(20_000);
    guard.flush();
    let slot = shared.threads.lock()[0].clone();
    let spare: Vec<*const u8> = slot.buf.lock().spare.iter().map(|c| c.as_ptr()).collect();
    assert!(
        (1..=4).contains(&spare.len()),
        "{} spare chunks",
        spare.len()
    );
    assert!(slot.buf.lock().spare.iter().all(|c| c.is_empty()));
    // The flush took the thread's partial chunk; when the next one is full, the
    // thread goes on in a spare one (its bytes start again from nothing).
    let len = || slot.buf.lock().host.enc.buf.len();
    let mut last = len();
    for made in 0.. {
        assert!(made < 10_000, "no chunk filled");
        spans(1);
        if len() < last {
            let now = slot.buf.lock().host.enc.buf.as_ptr();
            assert!(
                spare.contains(&now),
                "a new allocation, not a chunk given back"
            );
            break;
        }
        last = len();
    }
    guard.finish().unwrap();
}
