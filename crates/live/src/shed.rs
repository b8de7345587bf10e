//! Backpressure (seed 004 R4): which deltas a reader that cannot keep up loses.
//!
//! A reader is measured by how far its stream is behind the run's newest committed
//! event, at the moment it asks for more, once per step of a few dozen events (so a
//! reader catching up in one long read still passes through both limits) (the socket
//! only asks when the client has read:
//! the service keeps at most `TCP_NOTSENT_LOWAT` of unsent bytes (see the service's `server` module)
//! and a few frames in hyper, so the distance is the client's, not the kernel's).
//!
//! A reader that has been near the head (within `reasoning_behind` events) and then
//! falls `reasoning_behind` behind cannot keep up: it loses reasoning deltas, and beyond
//! `text_behind` text deltas too — never anything else, whether its stream then reads
//! live pages or catches up on its own. When it is back within `reasoning_behind` it
//! gets everything again. A reader that starts far behind (a resume into a long run) is
//! reading history, not falling behind: it is shed only if it does not close at least a
//! tenth of the distance each second. A stream opened on a run that had already ended is
//! never shed: there is no live head to keep up with.
//!
//! The bound this gives, for a run whose events are mostly deltas: a slow reader stays
//! within `text_behind` events plus one second of the run's events of the head, plus
//! what the socket and hyper hold (16 KiB unsent, 16 frames). Control events are never
//! dropped, so a reader slower than the control events alone falls further behind; the
//! server still holds no more for it (one page and a few frames).

use std::time::Duration;

use tokio::time::Instant;

use agent_stream_core::dialect::Class;

/// When a slow reader starts losing deltas (seed 004 R4).
#[derive(Debug, Clone, Copy)]
pub struct Shedding {
    /// Events behind at which reasoning deltas are dropped.
    pub reasoning_behind: i64,
    /// Events behind at which text deltas are dropped as well.
    pub text_behind: i64,
}

impl Default for Shedding {
    fn default() -> Self {
        Shedding { reasoning_behind: 500, text_behind: 2_000 }
    }
}

/// How long a reader has to show it is closing the distance.
const GRACE: Duration = Duration::from_secs(1);

/// One reader's shedding state.
#[derive(Debug)]
pub struct Shedder {
    limits: Shedding,
    /// False for a run that had ended when the stream opened.
    enabled: bool,
    /// Distance when the current second of observation began.
    sample: Option<(Instant, i64)>,
    /// Has been within `reasoning_behind` of the head (so falling behind is slowness).
    was_near: bool,
    slow: bool,
}

impl Shedder {
    /// A reader of a run that is live (`enabled`) or had ended when the stream opened.
    pub fn new(limits: Shedding, enabled: bool) -> Shedder {
        Shedder { limits, enabled, sample: None, was_near: false, slow: false }
    }

    /// The delta classes to drop now for a reader `behind` events behind the head:
    /// `None`, `Some(Class::Reasoning)` (reasoning only) or `Some(Class::Text)` (both).
    pub fn level(&mut self, behind: i64, now: Instant) -> Option<Class> {
        if !self.enabled {
            return None;
        }
        if behind < self.limits.reasoning_behind {
            self.sample = None;
            self.slow = false;
            self.was_near = true;
            return None;
        }
        match self.sample {
            _ if self.was_near => self.slow = true,
            None => self.sample = Some((now, behind)),
            Some((t0, b0)) if now.duration_since(t0) >= GRACE => {
                // Closing less than a tenth of the distance a second is not catching up.
                self.slow = behind > b0 - b0 / 10;
                self.sample = Some((now, behind));
            }
            Some(_) => {}
        }
        if !self.slow {
            None
        } else if behind >= self.limits.text_behind {
            Some(Class::Text)
        } else {
            Some(Class::Reasoning)
        }
    }
}

/// True when `level` says to drop an item of `class`.
pub fn drops(level: Option<Class>, class: Class) -> bool {
    match (level, class) {
        (_, Class::Control) | (None, _) => false,
        (Some(Class::Text), _) => true,
        (Some(_), c) => c == Class::Reasoning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Shedding = Shedding { reasoning_behind: 100, text_behind: 400 };

    #[test]
    fn a_reader_that_falls_behind_is_shed_reasoning_first() {
        let t = Instant::now();
        let mut s = Shedder::new(LIMITS, true);
        assert_eq!(s.level(50, t), None, "close to the head");
        assert_eq!(s.level(120, t), Some(Class::Reasoning), "fell behind");
        assert_eq!(s.level(500, t), Some(Class::Text));
        assert_eq!(s.level(90, t + GRACE), None, "back near the head: everything again");
        assert_eq!(s.level(150, t + GRACE), Some(Class::Reasoning));
        // A reader that starts behind gets a second to show it is closing the distance.
        let mut s = Shedder::new(LIMITS, true);
        assert_eq!(s.level(120, t), None, "behind, but it may be catching up");
        assert_eq!(s.level(200, t + GRACE), Some(Class::Reasoning), "a second later, further behind");
        assert_eq!(s.level(500, t + GRACE * 2), Some(Class::Text));
        assert!(drops(Some(Class::Text), Class::Reasoning) && drops(Some(Class::Text), Class::Text));
        assert!(
            drops(Some(Class::Reasoning), Class::Reasoning) && !drops(Some(Class::Reasoning), Class::Text)
        );
        assert!(!drops(Some(Class::Text), Class::Control));
    }

    #[test]
    fn a_reader_catching_up_and_a_finished_run_are_not_shed() {
        let t = Instant::now();
        let mut s = Shedder::new(LIMITS, true);
        assert_eq!(s.level(10_000, t), None);
        assert_eq!(s.level(8_000, t + GRACE), None, "closed a fifth of the distance");
        assert_eq!(s.level(7_500, t + GRACE * 2), Some(Class::Text), "closed a sixteenth");
        let mut ended = Shedder::new(LIMITS, false);
        assert_eq!(ended.level(10_000, t), None);
        assert_eq!(ended.level(20_000, t + GRACE * 5), None);
    }
}
