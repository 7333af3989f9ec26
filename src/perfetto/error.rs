//! Why a trace could not be written: the one error type of the Perfetto output.

use std::path::PathBuf;

/// Why a trace could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PerfettoError {
    /// The output path has no file name.
    #[error("not a file path: {0}")]
    BadPath(PathBuf),
    /// The output file could not be created (in its folder, as a temporary
    /// file), or it exists and is not a regular file.
    #[error("cannot create {path}: {source}")]
    Create {
        /// The output's path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Writing, syncing or renaming failed.
    #[error("writing the trace failed: {0}")]
    Io(#[from] std::io::Error),
    /// The writer thread could not be started.
    #[error("cannot start the trace writer thread: {0}")]
    Thread(std::io::Error),
    /// The writer thread panicked (a bug): the trace is lost.
    #[error("the trace writer thread panicked")]
    WriterPanicked,
    /// The process has too many batch sinks alive.
    #[error(transparent)]
    Sink(#[from] crate::deliver::TooManySinks),
    /// The builder was given no output file.
    #[error("no output file: call PerfettoLayerBuilder::file")]
    NoFile,
}
