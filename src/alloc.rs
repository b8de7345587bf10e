//! The allocator the service binary and its benchmarks install, and its settings.
//!
//! The reducer and the live path make many small, short-lived allocations. With glibc's
//! malloc, a third of the fold's time went to malloc, free and heap consolidation, and
//! mimalloc doubled the fold's rate (BENCHMARKS.md, `bench fold`).

/// The global allocator: `#[global_allocator] static A: Allocator = Allocator;`.
pub use mimalloc::MiMalloc as Allocator;

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
