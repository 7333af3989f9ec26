//! The one way the integration tests run the CLI: as a child process, with a
//! wall-clock limit and optionally a memory limit, its exit, output, wall time,
//! CPU time and peak resident memory returned.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The CLI binary, built for the integration tests.
pub const CLI: &str = env!("CARGO_BIN_EXE_tracing-gpu");

/// What a run may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Killed (SIGKILL) past this wall time; the run says `timed_out`.
    pub wall: Duration,
    /// The child's address space (RLIMIT_AS): an allocation past it fails, and
    /// Rust aborts. A cap rather than a measure: the peak RSS `wait4` reports
    /// can include the test process's own, recorded when the child calls exec.
    pub memory: Option<u64>,
    /// Standard output kept for the checks; the rest is counted, not kept.
    pub stdout_kept: usize,
}

impl Limits {
    /// `wall` alone: no memory cap, 16 MiB of standard output kept.
    pub fn wall(wall: Duration) -> Self {
        Limits {
            wall,
            memory: None,
            stdout_kept: 16 << 20,
        }
    }

    /// The address space capped at `bytes` as well.
    pub fn memory(self, bytes: u64) -> Self {
        Limits {
            memory: Some(bytes),
            ..self
        }
    }
}

/// How a run ended, and what it cost.
#[derive(Debug)]
pub struct Run {
    /// The exit code; `None` if a signal ended it (an abort, out of memory, the
    /// time limit).
    pub code: Option<i32>,
    /// Killed at the wall-clock limit.
    pub timed_out: bool,
    /// Standard output, up to [`Limits::stdout_kept`] bytes.
    pub stdout: String,
    /// The bytes written to standard output, kept or not.
    pub stdout_bytes: usize,
    /// Standard error.
    pub stderr: String,
    /// Wall time, from spawn to exit.
    pub wall: Duration,
    /// The child's own CPU time (user and system), in seconds.
    pub cpu_s: f64,
    /// The child's peak resident memory, in KiB (Linux's `ru_maxrss`).
    pub peak_rss_kb: libc::c_long,
}

/// Runs the CLI with `args` under `limits`; standard input is empty.
pub fn run_cli<S: AsRef<OsStr>>(args: &[S], limits: Limits) -> Run {
    let mut cmd = Command::new(CLI);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(memory) = limits.memory {
        // SAFETY: between fork and exec the closure makes one system call and
        // allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                let cap = libc::rlimit {
                    rlim_cur: memory,
                    rlim_max: memory,
                };
                match libc::setrlimit(libc::RLIMIT_AS, &cap) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
    }
    let started = Instant::now();
    let mut child = cmd.spawn().expect("the CLI starts");
    let pid = child.id() as libc::pid_t;
    // Both pipes read on the side, so a chatty child never blocks on a full one.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let kept_max = limits.stdout_kept;
    let stdout = thread::spawn(move || {
        let (mut kept, mut total, mut buf) = (Vec::new(), 0usize, vec![0u8; 1 << 16]);
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            let room = kept_max.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        (kept, total)
    });
    let stderr = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    // wait4 reaps the child and gives its own rusage (std's wait does not).
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    let mut timed_out = false;
    loop {
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert_eq!(r, 0, "wait4: {}", std::io::Error::last_os_error());
        if started.elapsed() > limits.wall {
            timed_out = true;
            unsafe { libc::kill(pid, libc::SIGKILL) };
            unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let wall = started.elapsed();
    drop(child);
    let (stdout, stdout_bytes) = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        timed_out,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stdout_bytes,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        wall,
        cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
        peak_rss_kb: usage.ru_maxrss,
    }
}
