//! Where the layer's trace goes: a file that appears whole when the guard
//! finishes, or any stream.

use std::io::Write;

use super::error::PerfettoError;
use crate::output::AtomicFile;

/// Where the writer thread writes.
pub(super) enum Output {
    File(AtomicFile),
    Stream(Box<dyn Write + Send>),
}

impl Output {
    /// Makes the output final: renames the file into place.
    pub(super) fn commit(self) -> Result<(), PerfettoError> {
        match self {
            Output::File(f) => Ok(f.commit().map(drop)?),
            Output::Stream(mut w) => Ok(w.flush()?),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::File(f) => f.write(buf),
            Output::Stream(w) => w.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Output::File(f) => f.write_all(buf),
            Output::Stream(w) => w.write_all(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::File(f) => f.flush(),
            Output::Stream(w) => w.flush(),
        }
    }
}
