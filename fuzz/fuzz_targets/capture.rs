//! Any bytes into the capture-file reader: Ok or Err, never a panic, and what
//! it accepts passes its own consistency checks and writes back identically.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracing_gpu::capture::Capture;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Capture::from_reader(data) {
        d.validate().expect("a dump that reads validates");
        let mut again = Vec::new();
        d.to_writer(&mut again).expect("writes to memory");
        assert_eq!(Capture::from_reader(&again[..]).expect("reads back"), d);
    }
});
