//! The watchdog through the simulated device: a streamed launch that does not
//! finish gets a snapshot of its warps' watch cells at its deadline, told as one
//! ERROR event, and again every period while it runs; none after it completes.
use super::drains::watched_launch;
use super::*;
use crate::cuda::job::Watchdog;
use crate::watch::tests::WarpSim;
use crate::watch::TARGET;

/// The watchdog's events: their message and `gpu.snapshot`, and when they came.
#[derive(Default, Clone)]
struct Alarms(Arc<Mutex<Vec<(String, u64, Instant)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Alarms {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String, u64);
        impl tracing::field::Visit for Fields {
            fn record_u64(&mut self, f: &tracing::field::Field, v: u64) {
                if f.name() == "gpu.snapshot" {
                    self.1 = v;
                }
            }
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let m = event.metadata();
        if m.target() == TARGET {
            assert_eq!(*m.level(), tracing::Level::ERROR);
            let mut f = Fields(String::new(), u64::MAX);
            event.record(&mut f);
            self.0.lock().push((f.0, f.1, Instant::now()));
        }
    }
}

const LOAD: u16 = 1;
const MMA: u16 = 2;

#[test]
fn a_launch_past_its_deadline_shows_where_every_warp_is() {
    let rig = Rig::new(0, None);
    let alarms = Alarms::default();
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(alarms.clone()));
    let dog = Watchdog {
        deadline: Duration::from_millis(300),
        every: Some(Duration::from_millis(400)),
    };
    let launched = Instant::now();
    // 3 blocks of 2 warps: block 2 never starts.
    let (_warps, event, (memory, cells)) = tracing::dispatcher::with_default(&dispatch, || {
        watched_launch(&rig, 3, 2, false, Some(dog))
    });
    // Device time = host time - 5 µs (Rig::new's calibration).
    let t = HostClock::Boottime.now_ns() - 5_000;
    let mut store = |at: usize, v: u64| memory.store_u64(at, v);
    for slot in 0..4 {
        let mut w = WarpSim::start(cells, slot, 7 + slot / 2, t, &mut store);
        w.begin(MMA, t + 10, &mut store);
        w.begin(LOAD, t + 20, &mut store);
        if slot == 2 {
            // The producer of block 1: loaded k-tile 17, then began 18 and hangs.
            w.end(LOAD, Some(17), t + 30, &mut store);
            w.begin(LOAD, t + 40, &mut store);
        } else {
            w.end(LOAD, Some(17), t + 30, &mut store);
        }
    }
    let until = Instant::now() + Duration::from_secs(10);
    while alarms.0.lock().len() < 2 {
        assert!(
            Instant::now() < until,
            "no snapshots: {:?}",
            alarms.0.lock()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = alarms.0.lock().clone();
    let (first, n, at) = &got[0];
    assert_eq!(*n, 0);
    let after = at.duration_since(launched);
    assert!(
        after >= dog.deadline && after < dog.deadline + Duration::from_secs(1),
        "{after:?}"
    );
    let lines: Vec<&str> = first.lines().collect();
    assert_eq!(lines.len(), 4, "{first}");
    assert!(lines[0].contains("(persistent, grid 3x1x1, 2 warps per block) still running after"));
    assert!(
        lines[1].trim_start().starts_with("3 warps in mma for ")
            && lines[1].ends_with(", after load (payload 17)"),
        "{first}"
    );
    assert!(
        lines[2]
            .trim_start()
            .starts_with("1 warp in mma > load for ")
            && lines[2].ends_with(", after load (payload 17)"),
        "{first}"
    );
    assert_eq!(lines[3], "  1 block never started", "{first}");
    // The second comes a period later, and says which it is.
    let (second, n, at2) = &got[1];
    assert_eq!(*n, 1);
    assert!(second.contains("(snapshot 2)"), "{second}");
    // Due a period after the first was due, whenever the first came (on a loaded
    // machine it may come late, and the gap between the two be shorter than a period).
    let after2 = at2.duration_since(launched);
    let due = dog.deadline + dog.every.unwrap() - Duration::from_millis(1);
    assert!(after2 >= due, "{after2:?} {at:?}");
    // Done: no more.
    rig.gpu.fire(event);
    rig.collector.flush().unwrap();
    let taken = alarms.0.lock().len();
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(alarms.0.lock().len(), taken);
    assert_eq!(rig.shared.stats().snapshots, taken as u64);
}

#[test]
fn watchdog_settings_come_from_the_environment_when_unset() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(Watchdog::from_env(env(&[])).unwrap(), None);
    assert_eq!(
        Watchdog::from_env(env(&[(Watchdog::ENV, "2.5"), (Watchdog::ENV_EVERY, "1")])).unwrap(),
        Some(Watchdog {
            deadline: Duration::from_millis(2500),
            every: Some(Duration::from_secs(1)),
        })
    );
    for bad in ["0", "-1", "soon", "nan"] {
        let e = Watchdog::from_env(move |n: &str| (n == Watchdog::ENV).then(|| bad.to_string()))
            .unwrap_err();
        assert!(e.to_string().contains("TGPU_WATCHDOG"), "{bad}: {e}");
    }
    let dog = Watchdog {
        deadline: Duration::from_secs(3),
        every: Some(Duration::from_secs(1)),
    };
    assert_eq!(dog.due_ns(10, 0), Some(3_000_000_010));
    assert_eq!(dog.due_ns(10, 2), Some(5_000_000_010));
    let once = Watchdog { every: None, ..dog };
    assert_eq!(once.due_ns(10, 1), None);
}
