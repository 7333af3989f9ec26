//! The names a launch call hands on (`LaunchInfo::kernel`, `host_thread`), shared
//! rather than allocated: the launch path allocates nothing in steady state.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

/// `crate::capture::MAX_NAME_LEN`, named here (a test checks it) so that this file stays
/// pure Rust that `benches/launch_path.rs` includes as it is.
const MAX_NAME_LEN: usize = 4 << 10;

/// `name`, cut to [`MAX_NAME_LEN`] bytes at a character's boundary: a capture refuses
/// longer names (docs/capture.md), so a live run's names are bounded where they are made,
/// and its capture reads back.
fn bounded(name: &str) -> &str {
    if name.len() <= MAX_NAME_LEN {
        return name;
    }
    let mut end = MAX_NAME_LEN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// The launching thread's name (its `ThreadId` if it has none).
pub(crate) fn thread_name() -> Arc<str> {
    thread_local! {
        // Named once per thread: `format!` of a `ThreadId` is not free.
        static NAME: Arc<str> = {
            let t = std::thread::current();
            match t.name() {
                Some(n) => bounded(n).into(),
                None => format!("{:?}", t.id()).into(),
            }
        };
    }
    NAME.with(Arc::clone)
}

/// The most kernel names a thread keeps (`kernel_name`); a program that names
/// more (say, one name per launch) allocates the rest at each launch.
const NAMES_PER_THREAD: usize = 4096;

/// `kernel`, shared: each launching thread keeps the names it has launched, so
/// that a launch call in steady state allocates nothing (a hash lookup costs
/// about what a small allocation does; the allocation would be freed on the
/// collector thread, which is dearer).
pub(crate) fn kernel_name(kernel: &str) -> Arc<str> {
    let kernel = bounded(kernel);
    thread_local! {
        static NAMES: RefCell<HashSet<Arc<str>>> = RefCell::new(HashSet::new());
    }
    NAMES.with_borrow_mut(|names| {
        if let Some(n) = names.get(kernel) {
            return Arc::clone(n);
        }
        let n: Arc<str> = kernel.into();
        if names.len() < NAMES_PER_THREAD {
            names.insert(Arc::clone(&n));
        }
        n
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_name_is_kept_once_per_thread_up_to_the_bound() {
        std::thread::spawn(|| {
            let a = kernel_name("gemm");
            assert!(Arc::ptr_eq(&a, &kernel_name("gemm")));
            assert_eq!(&*kernel_name("scale"), "scale");
            // Past the bound, names are still right, only no longer shared.
            for i in 0..NAMES_PER_THREAD {
                kernel_name(&format!("k{i}"));
            }
            let late = kernel_name("late");
            assert_eq!(&*late, "late");
            assert!(!Arc::ptr_eq(&late, &kernel_name("late")));
            assert!(Arc::ptr_eq(&a, &kernel_name("gemm")));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn names_are_cut_to_what_a_capture_holds() {
        assert_eq!(MAX_NAME_LEN, crate::capture::MAX_NAME_LEN);
        let long = format!("{}é", "k".repeat(MAX_NAME_LEN - 1));
        let cut = kernel_name(&long);
        assert_eq!(
            cut.len(),
            MAX_NAME_LEN - 1,
            "cut before the two-byte character"
        );
        assert!(long.starts_with(&*cut));
        let exact = "k".repeat(MAX_NAME_LEN);
        assert_eq!(&*kernel_name(&exact), exact);
    }

    #[test]
    fn a_thread_is_named_once() {
        let t = std::thread::Builder::new()
            .name("launcher".into())
            .spawn(|| (thread_name(), thread_name()))
            .unwrap();
        let (a, b) = t.join().unwrap();
        assert_eq!(&*a, "launcher");
        assert!(Arc::ptr_eq(&a, &b));
    }
}
