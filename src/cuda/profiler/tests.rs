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
