//! Throughput shaping (seed 004 §4, R1–R3) and the ids a resume needs.
//!
//! Deltas gather per lane (the message, reasoning stream or child they extend) and go
//! out as one merged frame per lane when the run's window closes; everything else goes
//! out at once, in seq order: a control item first sends what is pending before it, so
//! a client never sees a tool start before the text that preceded it.
//!
//! R1 holds per run, whatever interleaves: at most [`PER_SECOND`] delta frames go out in
//! any second. A window's frames go out together; when more lanes are pending than the
//! second has room for, the lanes that waited longest go first and the others keep
//! gathering. So `k` lanes streaming at once share 10 frames a second (each gets a frame
//! every `k/10` seconds) instead of getting 10 each. Control items still flush
//! everything pending, so a run with many control events sends more delta frames, never
//! a delayed control item.
//!
//! Ids: frames go out in seq order of their last delta. When nothing is left pending
//! before the last one, its id is a plain seq; any other frame's id is the cursor before
//! the window plus the lanes delivered since ([`Cursor`]). Pure: the caller owns the
//! clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::{Class, Cursor, Encoding, Lane, Out};

/// How long deltas gather before they go out as one frame.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Delta frames a run's stream sends in any second (seed 004 R1), control items aside.
pub const PER_SECOND: usize = 10;

/// One stream's shaping: pending frames, the window, and where the client is.
pub struct Shaper {
    /// `detail=full`: every item as it is, at once.
    raw: bool,
    /// One merged frame per lane, in the order the lanes got their first pending delta.
    pending: Vec<Out>,
    /// Where a client that got everything sent so far stands: the base before the
    /// pending frames, plus the lanes delivered beyond it (lane, last seq delivered).
    base: Cursor,
    delivered: Vec<(Lane, i64)>,
    /// When the pending frames go out.
    due: Option<Instant>,
    /// When the last delta frames went out (at most [`PER_SECOND`] kept).
    recent: VecDeque<Instant>,
    /// The lowest id a frame may carry.
    floor: Option<Cursor>,
}

impl Shaper {
    /// Shapes a stream whose client stands at `start`.
    pub fn new(raw: bool, start: Cursor, _now: Instant) -> Shaper {
        // Lanes delivered beyond the start are named by their events only; they are
        // carried on, unnamed lanes, until the next plain id.
        let delivered = start.lanes.iter().map(|r| (u64::MAX - *r as u64, *r)).collect();
        let base = Cursor { lanes: vec![], ..start };
        Shaper { raw, pending: vec![], base, delivered, due: None, recent: VecDeque::new(), floor: None }
    }

    /// When [`Shaper::tick`] has frames to send, if any are pending.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// True for `detail=full`: every item as it is, at once.
    pub fn is_raw(&self) -> bool {
        self.raw
    }

    /// Records that the items up to `at` went out as they are, not through
    /// [`Shaper::push`] (a raw stream with nothing pending sending a page's shared
    /// frames): the client then stands exactly at `at`, as after pushing them.
    pub fn passed(&mut self, at: Cursor) {
        debug_assert!(self.raw && self.pending.is_empty());
        self.base = at;
        self.delivered.clear();
    }

    /// True while merged deltas wait for their window.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Where a client that got every item sent so far stands.
    pub fn sent(&self) -> Cursor {
        let mut lanes: Vec<i64> = self.delivered.iter().map(|d| d.1).collect();
        lanes.sort_unstable();
        let mut base = self.base.clone();
        if base.part > 0 && lanes.first() == Some(&base.seq) {
            // The partly sent event's delta (its last item) went out: the event is whole.
            base = Cursor::at(base.seq);
            lanes.remove(0);
        }
        self.floor(Cursor { lanes, ..base })
    }

    /// Ids never go back before where the client resumed from (see [`Shaper::resumed`]).
    fn floor(&self, id: Cursor) -> Cursor {
        match &self.floor {
            Some(f) if id.base_key() < f.base_key() => f.clone(),
            _ => id,
        }
    }

    /// For a stream that re-synchronises a client that stood at `cursor`: items it sends
    /// again (the snapshot, the rest of a partly sent event) carry `cursor` as their id,
    /// so ids never go back; a client cut off among them resumes the same way again.
    pub fn resumed(mut self, cursor: &Cursor) -> Shaper {
        self.floor = Some(cursor.clone());
        self
    }

    /// Takes one item (in stream order); appends what goes out now to `out`.
    pub fn push(&mut self, enc: &Encoding, mut o: Out, now: Instant, out: &mut Vec<Out>) {
        if self.raw || o.class == Class::Control || o.lane.is_none() {
            if o.class == Class::Control {
                // Everything before a control item goes before it.
                self.flush(now, out);
            }
            let id = o.id.take().unwrap_or_else(|| o.position());
            self.base = id.clone();
            self.delivered.clear();
            o.id = Some(self.floor(id));
            out.push(o);
            return;
        }
        if let Some(p) = self.pending.iter_mut().find(|p| p.lane == o.lane) {
            if enc.merge(p, &o) {
                return;
            }
            // Not mergeable after all (it should be): keep the order by flushing first.
            self.flush(now, out);
        }
        if self.pending.is_empty() {
            self.due = Some((now + WINDOW).max(self.next_slot(now)));
        }
        self.pending.push(o);
    }

    /// Sends pending frames if their window has closed and the second has room.
    pub fn tick(&mut self, now: Instant, out: &mut Vec<Out>) {
        if self.due.is_none_or(|d| d > now) {
            return;
        }
        let room = self.room(now);
        if room == 0 {
            self.due = Some(self.next_slot(now));
            return;
        }
        self.send(now, room, out);
    }

    /// Sends every pending frame now (a control item follows, or the stream ends).
    pub fn flush(&mut self, now: Instant, out: &mut Vec<Out>) {
        self.send(now, usize::MAX, out);
    }

    /// Frames the current second still has room for.
    fn room(&mut self, now: Instant) -> usize {
        while self.recent.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
            self.recent.pop_front();
        }
        PER_SECOND.saturating_sub(self.recent.len())
    }

    /// The first moment a frame may go out.
    fn next_slot(&self, now: Instant) -> Instant {
        match self.recent.len().checked_sub(PER_SECOND) {
            Some(i) => self.recent[i] + Duration::from_secs(1),
            None => now,
        }
    }

    fn send(&mut self, now: Instant, limit: usize, out: &mut Vec<Out>) {
        self.due = None;
        if self.pending.is_empty() {
            return;
        }
        let mut frames = std::mem::take(&mut self.pending);
        if frames.len() > limit {
            // The lanes that waited longest go now; the others keep gathering.
            frames.sort_by_key(|f| f.first_seq);
            self.pending = frames.split_off(limit);
        }
        frames.sort_by_key(|f| (f.seq, f.part));
        let n = frames.len();
        for (i, mut f) in frames.into_iter().enumerate() {
            self.recent.push_back(now);
            if self.recent.len() > PER_SECOND {
                self.recent.pop_front();
            }
            let id = if i + 1 == n && self.pending.is_empty() {
                // Every item up to this one has now been sent.
                self.base = f.position();
                self.delivered.clear();
                self.floor(f.position())
            } else {
                let lane = f.lane.unwrap_or_default();
                match self.delivered.iter_mut().find(|d| d.0 == lane) {
                    Some(d) => d.1 = f.seq,
                    None => self.delivered.push((lane, f.seq)),
                }
                self.sent()
            };
            f.id = Some(id);
            out.push(f);
        }
        if !self.pending.is_empty() {
            self.due = Some((now + WINDOW).max(self.next_slot(now)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{Format, RunCtx};
    use crate::projection::RunView;
    use crate::testkit::stored;
    use serde_json::{json, Value};

    fn shaped(inputs: &[Value], window_every: usize) -> Vec<Out> {
        let mut enc = Encoding::new(Format::Native, RunCtx::default(), RunView::new());
        let mut now = Instant::now();
        let mut s = Shaper::new(false, Cursor::at(0), now);
        let mut out = vec![];
        for (i, e) in stored(inputs).iter().enumerate() {
            for o in enc.push(e) {
                s.push(&enc, o, now, &mut out);
            }
            if (i + 1) % window_every == 0 {
                now += WINDOW * 20;
                s.tick(now, &mut out);
            }
        }
        s.flush(now, &mut out);
        out
    }

    fn text(o: &Out) -> String {
        o.json().and_then(|v| v["payload"]["text"].as_str()).unwrap_or("-").to_owned()
    }

    #[test]
    fn deltas_merge_per_lane_and_control_events_flush_first() {
        let out = shaped(
            &[
                json!({"type": "text.delta", "payload": {"text": "a"}}),
                json!({"type": "text.delta", "payload": {"text": "b"}}),
                json!({"type": "reasoning.delta", "payload": {"text": "r"}}),
                json!({"type": "text.delta", "payload": {"text": "c"}}),
                json!({"type": "tool.start", "payload": {"call_id": "x", "tool": "t"}}),
                json!({"type": "text.delta", "payload": {"text": "d"}}),
                json!({"type": "text.delta", "payload": {"text": "e"}}),
            ],
            usize::MAX,
        );
        let shape: Vec<(i64, i64, String, String)> =
            out.iter().map(|f| (f.first_seq, f.seq, text(f), f.cursor().to_string())).collect();
        assert_eq!(
            shape,
            vec![
                // The reasoning lane's last delta (3) comes before the text lane's (4):
                // its frame goes first and names the lane it delivered ahead of the base.
                (3, 3, "r".into(), "0:3".into()),
                (1, 4, "abc".into(), "4".into()),
                (5, 5, "-".into(), "5".into()),
                (6, 7, "de".into(), "7".into()),
            ]
        );
        assert_eq!(out[1].json().map(|v| v["first_seq"].clone()), Some(json!(1)));
    }

    #[test]
    fn deltas_of_different_messages_or_children_do_not_merge() {
        let out = shaped(
            &[
                json!({"type": "child.spawn", "payload": {"child_id": "k"}}),
                json!({"type": "text.delta", "payload": {"text": "a", "message_id": "m1"}}),
                json!({"type": "text.delta", "payload": {"text": "b", "message_id": "m2"}}),
                json!({"type": "text.delta", "child_id": "k", "payload": {"text": "c", "message_id": "m2"}}),
                json!({"type": "text.delta", "payload": {"text": "d", "message_id": "m1"}}),
            ],
            usize::MAX,
        );
        let texts: Vec<String> = out.iter().map(text).collect();
        assert_eq!(texts, ["-", "b", "c", "ad"]);
        let ids: Vec<String> = out.iter().map(|o| o.cursor().to_string()).collect();
        assert_eq!(ids, ["1", "1:3", "1:3,4", "5"]);
    }

    /// k lanes streaming at once share the run's 10 frames per second: in no second
    /// more than ten, and every lane still gets its frames.
    #[test]
    fn interleaved_lanes_share_one_budget() {
        let mut enc = Encoding::new(Format::Native, RunCtx::default(), RunView::new());
        let start = Instant::now();
        let mut s = Shaper::new(false, Cursor::at(0), start);
        let mut inputs = vec![];
        for i in 0..3000 {
            let m = ["m1", "m2", "m3", "m4", "m5", "m6"][i % 6];
            let kind = if i % 5 == 0 { "reasoning.delta" } else { "text.delta" };
            inputs.push(json!({"type": kind, "payload": {"text": "x", "message_id": m}}));
        }
        let mut out = vec![];
        let mut sent_at = vec![];
        // One delta per millisecond for three seconds, from 12 lanes.
        for (i, e) in stored(&inputs).iter().enumerate() {
            let now = start + Duration::from_millis(i as u64);
            s.tick(now, &mut out);
            for o in enc.push(e) {
                s.push(&enc, o, now, &mut out);
            }
            sent_at.resize(out.len(), now);
        }
        for (i, t) in sent_at.iter().enumerate() {
            let in_second =
                sent_at[i..].iter().take_while(|u| u.duration_since(*t) < Duration::from_secs(1)).count();
            assert!(in_second <= PER_SECOND, "{in_second} frames in the second from frame {i}");
        }
        assert!(out.len() >= 25, "{} frames in 3 s", out.len());
        let lanes: std::collections::BTreeSet<_> = out.iter().map(|o| o.lane).collect();
        assert_eq!(lanes.len(), 12, "every lane got frames");
        // Whatever went out, the text adds up: no delta lost or repeated.
        s.flush(start + Duration::from_secs(10), &mut out);
        let total: usize = out.iter().map(|o| text(o).len()).sum();
        assert_eq!(total, 3000);
    }
}
