//! Any bytes through the whole command pipeline, in process: the capture
//! reader, every launch into the report's statistics and SVG, and into a
//! Perfetto trace in memory, host spans included (what `tracing-gpu report`,
//! `report --svg` and `convert -o` do). Never a panic, and the outputs stay
//! within bounds set by what was read, not by values in the file: the SVG by
//! its options, the trace by the events decoded. The OTLP conversion is not
//! here: it needs an exporter and a runtime (`tests/otlp_bounds.rs` bounds it).
//! Seed corpus: `captures/` (`cargo fuzz run pipeline captures/`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracing_gpu::capture::Capture;
use tracing_gpu::perfetto::TraceWriter;
use tracing_gpu::report::{SvgOptions, Timeline};

fuzz_target!(|data: &[u8]| {
    let Ok(capture) = Capture::from_reader(data) else {
        return;
    };
    let options = SvgOptions::default();
    let max_rects = options.max_rects;
    let mut timeline = Timeline::with_svg(options);
    timeline.set_names(&capture.registry);
    for launch in &capture.launches {
        timeline.add_buffer(&launch.buffer.view());
    }
    let report = timeline.report();
    let _ = report.to_string();
    if let Some(svg) = timeline.to_svg() {
        // A rectangle is under 200 bytes, tooltips included, plus the frame.
        assert!(svg.len() < 200 * max_rects + (1 << 20), "{} bytes", svg.len());
    }
    let Ok(batches) = capture.batches() else {
        return;
    };
    let mut w = TraceWriter::new(Vec::new()).expect("a writer in memory");
    w.write_host_spans(capture.process_name(), &capture.host_spans)
        .expect("memory does not fail");
    let events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
    for b in &batches {
        w.write_batch(b).expect("memory does not fail");
    }
    let (bytes, stats) = w.finish().expect("memory does not fail");
    assert_eq!(stats.device_events, events);
    let _ = bytes;
});
