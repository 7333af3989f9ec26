//! Any bytes into the capture-file readers: Ok or Err, never a panic; what the
//! whole reader accepts passes its own consistency checks and writes back
//! identically, and the streaming reader accepts the same, with the same launches.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use tracing_gpu::capture::{Capture, CaptureError, CaptureReader};

/// What the streaming reader reads, gathered into one capture.
fn streamed(data: &[u8]) -> Result<Capture, CaptureError> {
    let mut reader = CaptureReader::new(Cursor::new(data))?;
    let mut c = reader.head().clone();
    c.launches = reader.launches()?.collect::<Result<_, _>>()?;
    Ok(c)
}

fuzz_target!(|data: &[u8]| {
    let whole = Capture::from_reader(data);
    match (&whole, streamed(data)) {
        (Ok(a), Ok(b)) => assert_eq!(a, &b, "both readers read the same"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole: {:?}, streamed: {:?}", a.as_ref().err(), b.err()),
    }
    if let Ok(d) = whole {
        d.validate().expect("a dump that reads validates");
        let mut again = Vec::new();
        d.to_writer(&mut again).expect("writes to memory");
        assert_eq!(Capture::from_reader(&again[..]).expect("reads back"), d);
    }
});
