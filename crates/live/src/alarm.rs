//! A timer for a stream that wakes far more often for data than for its timer.
//!
//! A live stream waits on two things at once: its data (a run's pages) and a timer (a
//! keep-alive, a key re-check) that fires every few seconds. Polling a tokio `Sleep`
//! each time the data is pending re-registers the task's waker with the timer wheel
//! and spends the task's cooperative budget: the two timers of an SSE stream cost
//! ~500 of the ~7,800 instructions one more subscriber of a page costs
//! (`CALLGRIND_SUBSCRIBERS`, docs/benchmarks-log.md, 2026-12-02 16:20), and a run's
//! page is delivered once per subscriber. An [`Alarm`] polls its `Sleep` only when that can change
//! something: the first time after a (re)set, when the task's waker changed, or when
//! the timer wheel has fired it. Otherwise the waker it registered last is still the
//! one to wake, which is all `Future::poll` asks of a pending future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::{Instant, Sleep};

/// A `Sleep` that is polled again only when the poll could answer differently.
pub struct Alarm {
    sleep: Pin<Box<Sleep>>,
    /// The waker the pending `sleep` was last polled with.
    armed: Option<Waker>,
}

impl Alarm {
    /// Fires at `deadline`.
    pub fn at(deadline: Instant) -> Alarm {
        Alarm { sleep: Box::pin(tokio::time::sleep_until(deadline)), armed: None }
    }

    /// Fires at `deadline` instead (again, if it fired).
    pub fn reset(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.armed = None;
    }

    /// Ready once the deadline passed; otherwise the task of `cx` is woken when it does.
    pub fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(w) = &self.armed {
            // Still in the wheel (not fired) and registered with this task's waker.
            if w.will_wake(cx.waker()) && !self.sleep.is_elapsed() {
                return Poll::Pending;
            }
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Pending => {
                self.armed = Some(cx.waker().clone());
                Poll::Pending
            }
            Poll::Ready(()) => {
                self.armed = None;
                Poll::Ready(())
            }
        }
    }

    /// [`Alarm::poll_fired`] as a future.
    pub fn fired(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_fired(cx))
    }
}

/// A keep-alive's timer: due once `every` has passed without a write.
///
/// Its [`Alarm`] is set for the earliest moment a keep-alive could be due and is
/// checked against the last write when it fires, so a write touches only a clock
/// reading, never the timer wheel (resetting a timer per write put an entry into the
/// wheel and took it out again per subscriber and page). SSE's keep-alive comments
/// and the WebSocket profile's pings both wait on one.
pub struct Idle {
    every: Duration,
    alarm: Alarm,
    last: Instant,
}

impl Idle {
    /// Due `every` from now, unless something is written before.
    pub fn new(every: Duration) -> Idle {
        let now = Instant::now();
        Idle { every, alarm: Alarm::at(now + every), last: now }
    }

    /// Something went out just now: the silence starts again.
    pub fn wrote(&mut self) {
        self.last = Instant::now();
    }

    /// Ready once `every` has passed since the last write, and counted as a write (the
    /// caller sends its keep-alive); otherwise the task of `cx` is woken when it is due.
    pub fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.alarm.poll_fired(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last + self.every;
            let now = Instant::now();
            if now >= due {
                self.last = now;
                self.alarm.reset(now + self.every);
                return Poll::Ready(());
            }
            // Something was written since the alarm was set: wait out the rest.
            self.alarm.reset(due);
        }
    }

    /// [`Idle::poll_due`] as a future.
    pub fn due(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_due(cx))
    }
}

/// `f`'s output, or `Elapsed` if it waits `stall`. The timer is made only when `f`
/// has to wait: a write into a socket's buffer seldom does, and a `timeout` per
/// message read the clock and looked up the runtime's timer once per subscriber and
/// event.
pub async fn within<F: Future>(stall: Duration, f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().now_or_never() {
        Some(out) => Ok(out),
        None => tokio::time::timeout(stall, f).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    /// Counts its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    /// Polled between its deadlines as a stream's timer is (each time the data is
    /// pending), it fires at each deadline, wakes the task that polled it, follows a
    /// change of waker, and fires again after a reset.
    #[tokio::test(start_paused = true)]
    async fn fires_at_its_deadline_and_wakes_the_waker_it_was_last_polled_with() {
        let start = Instant::now();
        let mut alarm = Alarm::at(start + Duration::from_secs(2));
        let (first, w1) = waker();
        let mut cx = Context::from_waker(&w1);
        for _ in 0..3 {
            assert!(alarm.poll_fired(&mut cx).is_pending(), "before its deadline");
        }
        // A task's waker may change (a stream moved to another task): the new one is
        // the one woken.
        let (second, w2) = waker();
        let mut cx2 = Context::from_waker(&w2);
        assert!(alarm.poll_fired(&mut cx2).is_pending());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(first.0.load(Ordering::SeqCst), 0, "the waker it was polled with before is not woken");
        assert_eq!(second.0.load(Ordering::SeqCst), 1, "woken at the deadline");
        assert!(alarm.poll_fired(&mut cx2).is_ready(), "fired");
        alarm.reset(Instant::now() + Duration::from_secs(2));
        assert!(alarm.poll_fired(&mut cx2).is_pending(), "reset: pending again");
        assert!(alarm.poll_fired(&mut cx2).is_pending());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(alarm.poll_fired(&mut cx2).is_pending(), "one second short");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(second.0.load(Ordering::SeqCst), 2, "woken at the new deadline");
        assert!(alarm.poll_fired(&mut cx2).is_ready());
    }

    /// Writes more often than `every` keep it from being due; after the last write it
    /// is due `every` later, and every `every` after that while nothing is written.
    #[tokio::test(start_paused = true)]
    async fn an_idle_timer_is_due_only_after_a_whole_interval_without_a_write() {
        let every = Duration::from_secs(15);
        let start = Instant::now();
        let mut idle = Idle::new(every);
        let (woken, w) = waker();
        let mut cx = Context::from_waker(&w);
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            assert!(idle.poll_due(&mut cx).is_pending(), "written to 10 s ago at most");
            idle.wrote();
        }
        let last = Instant::now();
        assert_eq!(last - start, Duration::from_secs(60));
        for k in 1..=3u32 {
            idle.due().await;
            assert_eq!(
                Instant::now() - last,
                every * k,
                "due a whole interval after the last write or keep-alive"
            );
        }
        assert!(woken.0.load(Ordering::SeqCst) >= 1, "the task that polled it was woken when it fired");
    }
}
