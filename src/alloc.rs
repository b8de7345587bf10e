//! The allocator the service binary and its benchmarks install, and its settings.
//!
//! The reducer and the live path make many small, short-lived allocations. With glibc's
//! malloc, a third of the fold's time went to malloc, free and heap consolidation, and
//! mimalloc doubled the fold's rate (docs/benchmarks-log.md, `bench fold`).

use std::alloc::{GlobalAlloc, Layout};

/// The global allocator: `#[global_allocator] static A: Allocator = Allocator;`.
///
/// mimalloc, as the `mimalloc` crate's `MiMalloc` gives it, except that an allocation
/// whose alignment mimalloc's plain calls already give takes them: `MiMalloc` calls
/// `mi_malloc_aligned` for every allocation, a longer path for the same block (a single
/// append makes ~88 allocations; docs/benchmarks-log.md, 2026-12-07 16:58).
#[derive(Clone, Copy, Debug, Default)]
pub struct Allocator;

/// Whether mimalloc's plain calls return a block of `size` bytes aligned to `align`:
/// blocks are aligned to their size up to 16 bytes (`MI_MAX_ALIGN_SIZE`), the test
/// mimalloc's own aligned path makes first (`mi_malloc_is_naturally_aligned`,
/// alloc-aligned.c).
#[inline]
fn plain(size: usize, align: usize) -> bool {
    align <= 16 && align <= size
}

// SAFETY: every call forwards to mimalloc, whose blocks satisfy the layouts they are
// asked for (`plain` is mimalloc's own condition for its unaligned calls); a block is
// freed or resized only by mimalloc, which takes any block it gave, aligned or not.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(layout.size(), layout.align()) {
            // SAFETY: as the impl's.
            unsafe { libmimalloc_sys::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: as the impl's.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(layout.size(), layout.align()) {
            // SAFETY: as the impl's.
            unsafe { libmimalloc_sys::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: as the impl's.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from mimalloc; the block keeps `layout`'s alignment.
        unsafe {
            if plain(new_size, layout.align()) {
                libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mimalloc::MiMalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[cfg(target_os = "linux")]
extern "C" {
    /// mimalloc's option setter (the crate exposes it only with its `extended` API).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

#[cfg(target_os = "linux")]
/// `mi_option_arena_eager_commit` in the mimalloc v3 that `libmimalloc-sys` 0.1 builds
/// by default (`mimalloc.h`, `enum mi_option_e`: the fifth entry).
const ARENA_EAGER_COMMIT: std::ffi::c_int = 4;

/// Settings for a long-running server, applied before the first allocation (see
/// `TUNE`). Eager commit makes mimalloc commit its first arena up front and keep what
/// it frees resident: with 10,000 idle SSE connections that raised resident memory from
/// about 48 to about 61 KiB per subscriber (`bench fanout`), for no gain in speed.
#[cfg(target_os = "linux")]
extern "C" fn tune() {
    // SAFETY: mi_option_set only stores an integer in mimalloc's option table; any
    // value is valid for this option (0 = commit on demand). mimalloc initialises its
    // options in a constructor of priority 101, which has run by now.
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) }
}

/// Runs `tune` at load time, after mimalloc's own constructor (priority 101) and
/// before anything allocates: the option is read when an arena is reserved, and the
/// first arena is reserved by the first allocation, which comes before `main`.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array.00102"]
pub static TUNE: extern "C" fn() = tune;

#[cfg(target_os = "linux")]
extern "C" {
    /// mimalloc: frees what the calling thread's heap holds unused and runs the
    /// arenas' due purges (returns memory to the OS).
    fn mi_collect(force: bool);
}

/// Least time between two collections on one thread.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Hands memory the calling thread no longer uses back to the OS, at most once a
/// second per thread; meant for a runtime's `on_thread_park` (a worker about to idle).
///
/// mimalloc returns freed memory lazily, during later allocations, and frees made on
/// another thread wait for the owner's next allocation: an idle server kept what a
/// burst had needed (20 GraphQL WebSockets that had carried 40,000 events of 2 KB left
/// the server 70 to 100 MB larger after they closed).
pub fn collect_when_idle() {
    thread_local! {
        static LAST: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    let due = LAST.with(|l| {
        let now = std::time::Instant::now();
        let due = l.get().is_none_or(|t| now.duration_since(t) >= COLLECT_EVERY);
        if due {
            l.set(Some(now));
        }
        due
    });
    #[cfg(target_os = "linux")]
    if due {
        // SAFETY: mi_collect takes no pointers; it only walks the calling thread's own
        // heap and the arenas under mimalloc's locks. Not forced: a forced collection
        // visits every page of the heap, which at 10,000 sockets is a few hundred MB,
        // and the gentle one was enough to give the memory back (tests/it/attack.rs).
        unsafe { mi_collect(false) }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = due;
}

#[cfg(test)]
mod tests {
    use super::Allocator;
    use std::alloc::{GlobalAlloc, Layout};

    /// A block of `layout` from [`Allocator`], checked for its alignment and filled with
    /// a pattern.
    ///
    /// # Safety
    /// `layout` has a non-zero size; the caller frees the block.
    unsafe fn filled(layout: Layout) -> *mut u8 {
        // SAFETY: as the function's.
        unsafe {
            let p = Allocator.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % layout.align(), 0, "alloc({layout:?})");
            for i in 0..layout.size() {
                *p.add(i) = i as u8;
            }
            p
        }
    }

    /// Every size and alignment a program can ask for in the small sizes (where the
    /// plain calls are taken) and some beyond: each block is aligned as asked, keeps its
    /// bytes through a growing and a shrinking `realloc`, and `alloc_zeroed` is zero. A
    /// plain call taken for an alignment it does not give fails here.
    #[test]
    fn every_block_is_aligned_as_asked_and_keeps_its_bytes_through_realloc() {
        let sizes = (1..=80).chain([96, 100, 127, 128, 200, 1000, 4096, 70_000]);
        for size in sizes {
            for align in [1usize, 2, 4, 8, 16, 32, 64, 4096] {
                let layout = Layout::from_size_align(size, align).expect("a layout");
                // SAFETY: non-zero sizes; each block is used within its layout and freed
                // once, with the layout it has then.
                unsafe {
                    let zeroed = Allocator.alloc_zeroed(layout);
                    assert!(!zeroed.is_null());
                    assert_eq!(zeroed as usize % align, 0, "alloc_zeroed({layout:?})");
                    assert!(std::slice::from_raw_parts(zeroed, size).iter().all(|b| *b == 0));
                    Allocator.dealloc(zeroed, layout);
                    for new_size in [size * 3, size.div_ceil(2)] {
                        let q = Allocator.realloc(filled(layout), layout, new_size);
                        assert!(!q.is_null());
                        assert_eq!(q as usize % align, 0, "realloc({layout:?} -> {new_size})");
                        for i in 0..size.min(new_size) {
                            assert_eq!(
                                *q.add(i),
                                i as u8,
                                "byte {i} after realloc({layout:?} -> {new_size})"
                            );
                        }
                        Allocator.dealloc(q, Layout::from_size_align(new_size, align).expect("a layout"));
                    }
                }
            }
        }
    }
}
