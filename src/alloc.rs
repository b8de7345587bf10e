//! The allocator the service binary and its benchmarks install, and its settings.
//!
//! The reducer and the live path make many small, short-lived allocations. With glibc's
//! malloc, a third of the fold's time went to malloc, free and heap consolidation, and
//! mimalloc doubled the fold's rate (docs/benchmarks-log.md, `bench fold`).

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
