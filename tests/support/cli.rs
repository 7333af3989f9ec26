//! The one way the integration tests run the CLI: as a child process, with a
//! wall-clock limit and optionally a memory limit, its exit, output, wall time,
//! CPU time and peak resident memory returned; started and waited for at once
//! ([`run_cli`]), or started and acted on first ([`spawn_cli`]).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::thread::{self, JoinHandle};
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
    /// The signal that ended it, if one did (the time limit's is SIGKILL).
    pub signal: Option<i32>,
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
    spawn_cli(args, limits).wait()
}

/// Starts the CLI with `args` under `limits` and returns at once, for a test
/// that acts while it runs (a signal, a second run at the same time); standard
/// input is empty. [`Running::wait`] ends it as [`run_cli`] does.
pub fn spawn_cli<S: AsRef<OsStr>>(args: &[S], limits: Limits) -> Running {
    spawn_program(CLI, args, &[], limits)
}

/// [`run_cli`] with environment variables set (`Some`) or removed (`None`).
pub fn run_cli_with_env<S: AsRef<OsStr>>(
    args: &[S],
    env: &[(&str, Option<&str>)],
    limits: Limits,
) -> Run {
    spawn_program(CLI, args, env, limits).wait()
}

/// [`spawn_cli`] with another build of the CLI (a release build, for a measurement),
/// and environment variables set (`Some`) or removed (`None`).
pub fn spawn_program<P: AsRef<OsStr>, S: AsRef<OsStr>>(
    program: P,
    args: &[S],
    env: &[(&str, Option<&str>)],
    limits: Limits,
) -> Running {
    let mut cmd = Command::new(program);
    for (key, value) in env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
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
    // Reaped by its pid with wait4 (Running::ended), for its own rusage.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().expect("the CLI starts");
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
    Running {
        pid: child.id() as libc::pid_t,
        started,
        wall: limits.wall,
        stdout,
        stderr,
        ended: None,
    }
}

/// A run of the CLI under way ([`spawn_cli`]).
pub struct Running {
    pid: libc::pid_t,
    started: Instant,
    wall: Duration,
    stdout: JoinHandle<(Vec<u8>, usize)>,
    stderr: JoinHandle<Vec<u8>>,
    /// Its wait status, resource usage and wall time once reaped.
    ended: Option<(libc::c_int, libc::rusage, Duration)>,
}

impl Running {
    /// Whether it has ended (then reaped, its status kept for [`Running::wait`]).
    pub fn ended(&mut self) -> bool {
        if self.ended.is_none() {
            let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
            // wait4 reaps the child and gives its own rusage (std's wait does not).
            let r = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut usage) };
            if r == self.pid {
                self.ended = Some((status, usage, self.started.elapsed()));
            } else {
                assert_eq!(r, 0, "wait4: {}", std::io::Error::last_os_error());
            }
        }
        self.ended.is_some()
    }

    /// Sends it `signal`.
    pub fn signal(&mut self, signal: libc::c_int) {
        // Not reaped yet, so its pid cannot have been reused.
        assert!(!self.ended(), "signal {signal} to a run that has ended");
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.pid, signal) }, 0, "kill");
    }

    /// Waits for it to end, killing it (SIGKILL) past its wall-clock limit.
    pub fn wait(mut self) -> Run {
        let mut timed_out = false;
        while !self.ended() {
            if self.started.elapsed() > self.wall {
                timed_out = true;
                let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                unsafe { libc::wait4(self.pid, &mut status, 0, &mut usage) };
                self.ended = Some((status, usage, self.started.elapsed()));
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        let (status, usage, wall) = self.ended.unwrap();
        let (stdout, stdout_bytes) = self.stdout.join().unwrap();
        let stderr = self.stderr.join().unwrap();
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        Run {
            code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            timed_out,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stdout_bytes,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            wall,
            cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
            peak_rss_kb: usage.ru_maxrss,
        }
    }
}
