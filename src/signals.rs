//! The CLI's signals: on SIGINT, SIGTERM or SIGHUP, the files being written are
//! removed ([`tracing_gpu::output::remove_temporary_files`]) and the process
//! exits with 128 + the signal's number (130, 143, 129), as a shell reports a
//! process killed by it. SIGKILL cannot be caught: it leaves the temporary file
//! (`.NAME.XXXXXX.tmp`), and the destination as it was.
//!
//! signal-hook's handler only writes to a pipe (async-signal-safe); the cleanup,
//! which takes a lock and unlinks files, runs on a thread of its own that reads
//! that pipe.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Set once a signal is being handled: the process is on its way out.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Starts the thread that waits for the signals; returns once they are caught.
/// On an error nothing is caught and the signals keep their default action.
pub(crate) fn install() -> io::Result<()> {
    let (ready, installed) = mpsc::sync_channel(1);
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            // Registered on this thread, so that a failure to start it leaves no
            // handler that would swallow the signals.
            let mut signals = match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            let _ = ready.send(Ok(()));
            if let Some(signal) = signals.forever().next() {
                EXITING.store(true, Ordering::SeqCst);
                tracing_gpu::output::remove_temporary_files();
                let name = signal_hook::low_level::signal_name(signal).unwrap_or("a signal");
                let mut stderr = io::stderr();
                // Off the progress bar's line, on a terminal.
                let newline = if stderr.is_terminal() { "\n" } else { "" };
                // Not eprintln!, which panics when stderr is gone: this thread must exit.
                let _ = writeln!(
                    stderr,
                    "{newline}error: interrupted by {name}; the files being written were removed"
                );
                std::process::exit(128 + signal);
            }
        })?;
    installed.recv().map_err(io::Error::other)?
}

/// Whether a signal is ending the process. The main thread then leaves the exit
/// (and its code) to the signal thread: whatever it was doing may have failed
/// only because its files were removed.
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// Waits for the signal thread to end the process.
pub(crate) fn wait_for_exit() -> ! {
    loop {
        thread::park();
    }
}
