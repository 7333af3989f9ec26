//! The host a benchmark runs on, where it changes a launch call's time: what a clock
//! read costs (a clock the vDSO cannot read is a system call, and the profiled
//! launch reads one several times), and which threads share a core (the profiler's
//! threads on the launching thread's core, or its hyperthread sibling, slow its
//! calls down without appearing in any of their parts), and what the profiler's own
//! threads cost it in CPU time.

use std::collections::HashMap;
use std::hint::black_box;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use tracing_gpu::clock::HostClock;

/// What reading the clocks costs here, and the kernel's clock source.
#[derive(Debug, Clone)]
pub struct ClockCosts {
    /// ns per `HostClock::Boottime.now_ns()` (the trace's clock).
    pub boottime_ns: f64,
    /// ns per `Instant::now()` (`CLOCK_MONOTONIC`).
    pub instant_ns: f64,
    /// `/sys/devices/system/clocksource/clocksource0/current_clocksource`, or `unknown`.
    pub source: String,
}

impl ClockCosts {
    /// Times `reads` reads of each clock, back to back.
    pub fn measure(reads: u32) -> ClockCosts {
        let per = |f: &dyn Fn()| {
            let start = Instant::now();
            for _ in 0..reads {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(reads)
        };
        let boottime_ns = per(&|| {
            black_box(HostClock::Boottime.now_ns());
        });
        let instant_ns = per(&|| {
            black_box(Instant::now());
        });
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
        ClockCosts {
            boottime_ns,
            instant_ns,
            source,
        }
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        format!(
            r#"{{"boottime_ns":{:.1},"instant_ns":{:.1},"source":"{}"}}"#,
            self.boottime_ns, self.instant_ns, self.source
        )
    }
}

/// CPU seconds of the profiler's own threads (names starting "tracing-gpu"), by
/// role, indexed by [`ProfilerCpu::COLLECTOR`], [`ProfilerCpu::DRAIN`] and
/// [`ProfilerCpu::OTHER`], and of the process's other threads
/// ([`ProfilerCpu::APP`]); [`profiler_cpu`] measures them.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProfilerCpu {
    /// All the role's threads together.
    pub by_role: [f64; 4],
    /// The role's busiest thread: one near the run's wall time is what sets the
    /// pace of its role.
    pub busiest: [f64; 4],
    /// Seconds the role's threads were runnable and waited for a core
    /// (`/proc/.../schedstat`; 0 where the kernel keeps none): a drain thread
    /// that waits as long as its rings hold loses events, however little CPU it takes.
    pub waited: [f64; 4],
    /// The most one of the role's threads waited.
    pub most_waited: [f64; 4],
    /// Minor page faults of the role's threads (first touches of fresh memory).
    pub faults: [f64; 4],
}

impl ProfilerCpu {
    /// The collector.
    pub const COLLECTOR: usize = 0;
    /// The drain threads of streamed launches.
    pub const DRAIN: usize = 1;
    /// The rest (the Perfetto writer and encoders, the calibrator).
    pub const OTHER: usize = 2;
    /// Not the profiler's: the launching thread, the driver's threads, this
    /// measurement's own. A launching thread that spins while it waits for the
    /// kernel shows here as one core's worth.
    pub const APP: usize = 3;

    /// The profiler's threads, all of them.
    pub fn total(self) -> f64 {
        self.by_role[..Self::APP].iter().sum()
    }
}

/// Runs `f`, and the CPU time the profiler's threads took meanwhile: each read from
/// `/proc/self/task` every 50 ms while `f` runs, so that threads that end before it
/// (a streamed launch's drain threads) are counted too.
pub fn profiler_cpu<T>(f: impl FnOnce() -> T) -> (T, ProfilerCpu) {
    let stop = Arc::new(AtomicBool::new(false));
    // Thread id → (role, CPU seconds before `f`, when last seen): what each took
    // meanwhile, not since it started (the launching thread's earlier runs); a
    // thread started since took all of its time meanwhile.
    let before = threads_cpu().map(|(tid, role, s)| (tid, (role, s, s)));
    let seen = Arc::new(Mutex::new(
        before.collect::<HashMap<u64, (usize, Times, Times)>>(),
    ));
    let sample = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || loop {
            let last = stop.load(Ordering::Acquire);
            for (tid, role, now) in threads_cpu() {
                // The role by the latest name: a thread names itself once it runs, so
                // a look just after its start may still find its parent's name.
                let mut seen = seen.lock();
                let t = seen.entry(tid).or_insert((role, Times::default(), now));
                (t.0, t.2) = (role, now);
            }
            if last {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        })
    };
    let out = f();
    stop.store(true, Ordering::Release);
    let _ = sample.join();
    let mut cpu = ProfilerCpu::default();
    for &(role, first, last) in seen.lock().values() {
        let s = last.cpu - first.cpu;
        cpu.by_role[role] += s;
        cpu.busiest[role] = cpu.busiest[role].max(s);
        let w = last.waited - first.waited;
        cpu.waited[role] += w;
        cpu.most_waited[role] = cpu.most_waited[role].max(w);
        cpu.faults[role] += last.faults - first.faults;
    }
    (out, cpu)
}

/// One thread's times so far: CPU seconds, seconds waited for a core, minor faults.
#[derive(Debug, Default, Clone, Copy)]
struct Times {
    cpu: f64,
    waited: f64,
    faults: f64,
}

/// This process's threads: id, [`ProfilerCpu`] role and [`Times`] so far.
fn threads_cpu() -> impl Iterator<Item = (u64, usize, Times)> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten();
    tasks.filter_map(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        // Thread names are cut to 15 bytes: "tracing-gpu col", "tracing-gpu dra".
        let role = match stat[open + 1..close].strip_prefix("tracing-gpu") {
            None => ProfilerCpu::APP,
            Some(r) if r.starts_with(" col") => ProfilerCpu::COLLECTOR,
            Some(r) if r.starts_with(" dra") => ProfilerCpu::DRAIN,
            Some(_) => ProfilerCpu::OTHER,
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // minflt, utime and stime: fields 10, 14 and 15 of the line, 8, 12 and 13
        // after the name.
        let field = |i: usize| fields.get(i).and_then(|x| x.parse::<f64>().ok());
        let tid = task.file_name().to_string_lossy().parse().ok()?;
        // schedstat: ns on a core, ns waiting for one, time slices.
        let waited = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or(0.0, |ns| ns / 1e9);
        let cpu = (field(11)? + field(12)?) / 100.0;
        let faults = field(7)?;
        Some((
            tid,
            role,
            Times {
                cpu,
                waited,
                faults,
            },
        ))
    })
}

/// The cores split between launching threads, each on a physical core of its own
/// (no other thread of the process on it or on its hyperthread siblings), and the
/// rest of the process.
#[derive(Debug)]
pub struct Cores {
    /// One CPU per launching thread.
    pub launchers: Vec<usize>,
    /// Every allowed CPU that is neither a launcher nor a sibling of one.
    rest: CpuSet,
    /// How many CPUs `rest` holds.
    pub rest_count: usize,
}

impl Cores {
    /// Splits the CPUs this process may run on: `launchers` physical cores for the
    /// launching threads, the others' CPUs for everything else. An error if fewer
    /// than one CPU would be left over.
    pub fn split(launchers: usize) -> io::Result<Cores> {
        let allowed = sched_getaffinity(None)?;
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .collect();
        let mut taken = Vec::new();
        let mut chosen = Vec::new();
        for &c in &cpus {
            if chosen.len() == launchers {
                break;
            }
            if taken.contains(&c) {
                continue;
            }
            chosen.push(c);
            taken.extend(siblings(c));
            taken.push(c);
        }
        let mut rest = CpuSet::new();
        let mut rest_count = 0;
        for &c in cpus.iter().filter(|c| !taken.contains(c)) {
            rest.set(c);
            rest_count += 1;
        }
        if chosen.len() < launchers || rest_count == 0 {
            return Err(io::Error::other(format!(
                "{launchers} launching thread(s) on cores of their own need more than the {} CPUs allowed",
                cpus.len()
            )));
        }
        Ok(Cores {
            launchers: chosen,
            rest,
            rest_count,
        })
    }

    /// Keeps the calling thread, and every thread it starts from now on (the
    /// profiler's collector, the Perfetto writer, the driver's), off the
    /// launchers' cores.
    pub fn pin_rest(&self) -> io::Result<()> {
        Ok(sched_setaffinity(None, &self.rest)?)
    }

    /// Pins the calling thread to launcher `t`'s CPU.
    pub fn pin_launcher(&self, t: usize) -> io::Result<()> {
        let mut one = CpuSet::new();
        one.set(self.launchers[t]);
        Ok(sched_setaffinity(None, &one)?)
    }
}

/// CPU `c`'s hyperthread siblings, from sysfs (`0,64` or `0-1`); none if unreadable.
fn siblings(c: usize) -> Vec<usize> {
    let path = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
    let Ok(list) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    parse_list(list.trim())
}

/// A sysfs CPU list (`0,64`, `0-1`, `0-1,8-9`).
fn parse_list(list: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => out.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b => out.extend(a..=b),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_sysfs_writes_them() {
        assert_eq!(parse_list("0,64"), vec![0, 64]);
        assert_eq!(parse_list("0-1"), vec![0, 1]);
        assert_eq!(parse_list("0-1,8-9"), vec![0, 1, 8, 9]);
        assert_eq!(parse_list("3"), vec![3]);
        assert!(parse_list("x,2-1").is_empty());
    }

    /// Spins until this thread has taken `secs` more of CPU time (not wall time:
    /// the machine may be busy).
    fn spin(secs: f64) {
        let cpu = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
            t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
        };
        let end = cpu() + secs;
        while cpu() < end {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn profiler_cpu_counts_each_role_and_only_the_time_taken_meanwhile() {
        // A collector that took 0.3 s before, and 0.2 s meanwhile; a drain thread
        // started meanwhile, 0.4 s; the launching thread 0.2 s.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (spun, done) = std::sync::mpsc::channel::<()>();
        let collector = std::thread::Builder::new()
            .name("tracing-gpu collector".into())
            .spawn(move || {
                spin(0.3);
                spun.send(()).unwrap();
                wait.recv().unwrap();
                spin(0.2);
            })
            .unwrap();
        done.recv().unwrap();
        let ((), cpu) = profiler_cpu(|| {
            go.send(()).unwrap();
            let drain = std::thread::Builder::new()
                .name("tracing-gpu drain 0".into())
                .spawn(|| spin(0.4))
                .unwrap();
            spin(0.2);
            drain.join().unwrap();
            collector.join().unwrap();
        });
        // /proc counts in ticks of 10 ms, and a thread that ends meanwhile may take
        // its last ticks after the last look at it (50 ms apart, later on a busy
        // machine): so up to 0.15 s below.
        let near = |got: f64, want: f64| got > want - 0.15 && got < want + 0.02;
        let role = |r| (cpu.by_role[r], cpu.busiest[r]);
        let (collector, drain) = (role(ProfilerCpu::COLLECTOR), role(ProfilerCpu::DRAIN));
        assert!(
            near(collector.0, 0.2) && collector.1 == collector.0,
            "{cpu:?}"
        );
        assert!(near(drain.0, 0.4) && drain.1 == drain.0, "{cpu:?}");
        assert_eq!(cpu.total(), collector.0 + drain.0, "{cpu:?}");
        // Other tests' threads may run beside: at least this thread's.
        assert!(cpu.by_role[ProfilerCpu::APP] > 0.12, "{cpu:?}");
    }

    #[test]
    fn launchers_get_cores_the_rest_never_shares() {
        let allowed = sched_getaffinity(None).unwrap();
        let n = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c)).count();
        match Cores::split(1) {
            Ok(cores) => {
                let c = cores.launchers[0];
                assert!(!cores.rest.is_set(c));
                for s in siblings(c) {
                    assert!(!cores.rest.is_set(s), "sibling {s} of {c} left to the rest");
                }
                assert!(cores.rest_count >= 1 && cores.rest_count < n);
            }
            Err(e) => assert!(n <= 2, "{n} CPUs, yet: {e}"),
        }
        assert!(Cores::split(n + 1).is_err());
    }
}
