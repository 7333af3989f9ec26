//! The profiler's own arithmetic: slots per launch shape, launch ids.
use super::*;

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

#[test]
fn shape_counts_one_slot_per_warp() {
    let s = Shape::of(&cfg((4, 2, 1), (96, 1, 1)), 8, 1 << 30).unwrap();
    assert_eq!(s.warps_per_block, 3);
    assert_eq!(s.slots, 24);
    assert_eq!(s.bytes, format::buffer_size(24, 8).unwrap());
    // A partial warp still gets a slot.
    assert_eq!(
        Shape::of(&cfg((1, 1, 1), (33, 1, 1)), 8, 1 << 30)
            .unwrap()
            .slots,
        2
    );
}

#[test]
fn bad_shapes_are_errors() {
    assert!(matches!(
        Shape::of(&cfg((0, 1, 1), (32, 1, 1)), 8, 1 << 30),
        Err(ProfilerError::EmptyLaunch { .. })
    ));
    let e = Shape::of(&cfg((65535, 65535, 64), (1024, 1, 1)), 1 << 20, usize::MAX).unwrap_err();
    assert!(matches!(e, ProfilerError::BufferTooLarge { .. }), "{e}");
    let e = Shape::of(&cfg((1000, 1, 1), (256, 1, 1)), 256, 1 << 20).unwrap_err();
    assert!(e.to_string().contains("8000 warps × 256 records"), "{e}");
}

#[test]
fn launch_ids_are_unique_across_threads() {
    let ids: Vec<u64> = (0..4)
        .map(|_| std::thread::spawn(|| (0..1000).map(|_| next_launch_id()).collect::<Vec<_>>()))
        .flat_map(|t| t.join().unwrap())
        .collect();
    let set: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(set.len(), ids.len());
}

#[test]
fn the_watchdog_takes_from_the_environment_what_the_builder_left_unset() {
    use crate::cuda::job::Watchdog;
    use std::time::Duration;
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let s = Duration::from_secs;
    let none = env(&[]);
    assert_eq!(Profiler::builder().watchdog_setting(none).unwrap(), None);
    let set = Profiler::builder().watchdog(s(3));
    assert_eq!(
        set.clone().watchdog_setting(none).unwrap(),
        Some(Watchdog {
            deadline: s(3),
            every: None
        })
    );
    // The builder's deadline wins; the period comes from the environment.
    let both = env(&[(Watchdog::ENV, "9"), (Watchdog::ENV_EVERY, "1")]);
    assert_eq!(
        set.clone().watchdog_setting(both).unwrap(),
        Some(Watchdog {
            deadline: s(3),
            every: Some(s(1))
        })
    );
    // Either order of the two calls.
    let every_first = Profiler::builder().watchdog_every(s(2)).watchdog(s(5));
    assert_eq!(
        every_first.watchdog_setting(none).unwrap(),
        Some(Watchdog {
            deadline: s(5),
            every: Some(s(2))
        })
    );
    // A period alone, with no deadline anywhere, is refused.
    let e = Profiler::builder()
        .watchdog_every(s(1))
        .watchdog_setting(none)
        .unwrap_err();
    assert!(e.to_string().contains("needs a watchdog deadline"), "{e}");
    assert_eq!(
        Profiler::builder()
            .watchdog_every(s(1))
            .watchdog_setting(env(&[(Watchdog::ENV, "2")]))
            .unwrap(),
        Some(Watchdog {
            deadline: s(2),
            every: Some(s(1))
        })
    );
}
