//! The reducer: folding a 1,000,000-event generated run, on one thread.
//!
//! Reports events/s (criterion's throughput) and, with a counting allocator, the heap
//! the finished view holds next to the heap the log itself takes, to show that the view
//! grows with what it shows (text, calls, transitions), not with the number of events.
//! Baseline in the same run: a loop that only touches every event (match on the type),
//! the floor any fold pays.
//!
//!     cargo bench --bench fold
//!
//! `cargo run --release -- bench fold` times the same fold without criterion, as one
//! table of the load tool.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use agent_stream::projection::RunView;
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use agent_stream_load::support;

/// Counts live heap bytes, allocating with the service's allocator.
struct Counting;

use agent_stream::Allocator as Inner;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the service's allocator; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { Inner.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { Inner.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { Inner.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const EVENTS: usize = 1_000_000;

fn bench(c: &mut Criterion) {
    for (name, delta_pct) in support::FOLD_MIXES {
        bench_mix(c, name, delta_pct);
    }
}

fn bench_mix(c: &mut Criterion, name: &str, delta_pct: u32) {
    let before = LIVE.load(Ordering::Relaxed);
    let events = support::fold_log(EVENTS, delta_pct);
    let log_bytes = LIVE.load(Ordering::Relaxed) - before;
    let before = LIVE.load(Ordering::Relaxed);
    let view = RunView::fold(&events);
    let view_bytes = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(view.anomalies, 0);
    eprintln!(
        "fold/{name}: {} events -> {} messages, {} tool calls, {} transitions; view holds {:.1} MiB, the log {:.1} MiB",
        events.len(),
        view.messages.len(),
        view.tools.len(),
        view.lifecycle.transitions.len(),
        view_bytes as f64 / (1 << 20) as f64,
        log_bytes as f64 / (1 << 20) as f64
    );
    drop(view);

    let mut g = c.benchmark_group(format!("fold/{name}"));
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(events.len() as u64));
    g.bench_with_input(BenchmarkId::new("baseline_touch", events.len()), &events, |b, ev| {
        b.iter(|| black_box(support::touch(black_box(ev))))
    });
    g.bench_with_input(BenchmarkId::new("reducer", events.len()), &events, |b, ev| {
        // Dropping the view is not part of folding it.
        b.iter_with_large_drop(|| RunView::fold(black_box(ev)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
