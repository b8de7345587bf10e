//! Exact resume: drops, from a re-encoded stream, the items a client already has.
//!
//! A stream resumed from a [`Cursor`] is re-encoded from the view at the cursor's last
//! complete event. Two things may then repeat: the first items of a partly sent event
//! (`S.K`), and the deltas of lanes a merged frame delivered ahead of the base
//! (`:R1,R2`). Encoders are deterministic functions of the view, so the re-encoded items
//! are the ones the client saw, lane for lane; this drops exactly those.
//!
//! A lane mark names its lane by an event (`Ri`), so items are held until that event has
//! been encoded and its lane is known. Marks only reach a few events past the cursor (one
//! window's deltas), so little is ever held.
//!
//! A resync dialect's opening replaces what the client had, so nothing is dropped,
//! except the lanes of the classes its client keeps through that opening
//! ([`super::Encoder::kept_through_resync`]): their deltas are dropped as here.

use super::{Class, Cursor, Lane, Out, Resume};

/// The filter a resumed stream's items go through.
pub struct Resumer {
    /// Skip the first `.1` items of event `.0`.
    partial: Option<(i64, u32)>,
    /// Lane marks: (event, its lane once encoded).
    marks: Vec<(i64, Option<Lane>)>,
    /// Items waiting for the marks' lanes.
    held: Vec<Out>,
    /// The classes whose seen deltas are dropped (all of them when `None`).
    classes: Option<&'static [Class]>,
}

impl Resumer {
    /// The filter for a stream resumed at `cursor` in a dialect that resumes `mode`,
    /// whose client keeps the deltas of `kept` through a resync.
    pub fn new(cursor: &Cursor, mode: Resume, kept: &'static [Class]) -> Resumer {
        let marks = || cursor.lanes.iter().map(|r| (*r, None)).collect();
        match mode {
            // A resync dialect rebuilds the client's state from the view at the base:
            // items after it go out again, replacing what the client had.
            Resume::Resync if kept.is_empty() => {
                Resumer { partial: None, marks: vec![], held: vec![], classes: None }
            }
            // Items of a partly sent event are not deltas: the opening replaced them.
            Resume::Resync => Resumer { partial: None, marks: marks(), held: vec![], classes: Some(kept) },
            Resume::Exact => Resumer {
                partial: (cursor.part > 0).then_some((cursor.seq, cursor.part)),
                marks: marks(),
                held: vec![],
                classes: None,
            },
        }
    }

    /// True once nothing more can be dropped (the filter is a pass-through).
    pub fn is_done(&self) -> bool {
        self.partial.is_none() && self.marks.is_empty() && self.held.is_empty()
    }

    /// Takes the next items in stream order; appends those the client has not seen.
    pub fn push(&mut self, items: impl IntoIterator<Item = Out>, out: &mut Vec<Out>) {
        for o in items {
            if let Some((seq, part)) = self.partial {
                if o.seq == seq && o.part < part {
                    continue;
                }
                if o.seq > seq {
                    self.partial = None;
                }
            }
            if self.marks.is_empty() {
                out.push(o);
                continue;
            }
            for m in self.marks.iter_mut().filter(|m| m.0 == o.seq && m.1.is_none()) {
                m.1 = o.lane;
            }
            let past = self.marks.last().is_some_and(|m| o.seq > m.0);
            self.held.push(o);
            if past || self.marks.iter().all(|m| m.1.is_some()) {
                self.release(out);
            }
        }
    }

    /// The stream ended: sends what is held (what could be matched is matched).
    pub fn finish(&mut self, out: &mut Vec<Out>) {
        self.release(out);
    }

    fn release(&mut self, out: &mut Vec<Out>) {
        let marks = std::mem::take(&mut self.marks);
        for o in self.held.drain(..) {
            let seen = o.lane.is_some()
                && self.classes.is_none_or(|c| c.contains(&o.class))
                && marks.iter().any(|(r, lane)| lane.is_some() && *lane == o.lane && o.seq <= *r);
            if !seen {
                out.push(o);
            }
        }
    }
}
