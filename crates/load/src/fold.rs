//! `fold`: the reducer, `RunView::fold`, over the criterion bench's two generated
//! 1,000,000-event runs (`support::FOLD_MIXES`), on one thread; baseline in the same run:
//! a loop that only touches every event, the floor any fold pays. Rounds of the two are
//! interleaved so that noise from other work on the machine falls on both; the table
//! gives the median and the best round. Target: 2,000,000 events/s.

use std::hint::black_box;
use std::time::{Duration, Instant};

use agent_stream::projection::RunView;

use super::support;

const EVENTS: usize = 1_000_000;
const ROUNDS: usize = 9;
const TARGET: f64 = 2_000_000.0;

/// Runs the scenario and prints its table.
pub fn run() {
    println!("| mix | touch loop (baseline) median / best, M events/s | fold median / best, M events/s | fold / touch | target 2 M/s |");
    println!("|---|---|---|---|---|");
    for (name, delta_pct) in support::FOLD_MIXES {
        let events = support::fold_log(EVENTS, delta_pct);
        // One untimed fold to warm caches and the allocator.
        drop(black_box(RunView::fold(&events)));
        let (mut touch, mut fold) = (vec![], vec![]);
        for _ in 0..ROUNDS {
            touch.push(rate(&events, || {
                black_box(support::touch(black_box(&events)));
            }));
            let mut view = None;
            fold.push(rate(&events, || view = Some(RunView::fold(black_box(&events)))));
            // Dropping the view is not part of folding it.
            drop(view);
        }
        let (tm, tb) = (support::pct(&mut touch, 0.5), best(&touch));
        let (fm, fb) = (support::pct(&mut fold, 0.5), best(&fold));
        println!(
            "| {name} | {:.1} / {:.1} | {:.2} / {:.2} | {:.3} | {} ({:.2}x) |",
            tm / 1e6,
            tb / 1e6,
            fm / 1e6,
            fb / 1e6,
            fm / tm,
            if fm >= TARGET { "met" } else { "not met" },
            fm / TARGET
        );
    }
}

/// Events per second of one timed call of `f`.
fn rate(events: &[agent_stream::domain::Event], f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    events.len() as f64 / t.elapsed().max(Duration::from_nanos(1)).as_secs_f64()
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}
