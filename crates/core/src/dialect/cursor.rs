//! Stream positions: what an SSE `id:` names and what `Last-Event-ID` resumes from.
//!
//! Most items are the whole rendering of one event, and their id is its seq. Two things
//! need more than a seq to resume exactly, without repeating or skipping an item:
//!
//! - an event rendered as several items (an AG-UI tool call is START, ARGS and END; a
//!   run's end closes every open message): an item before the last one of its event is
//!   `S.K`, "every event before S, and the first K items of event S";
//! - deltas merged per lane (R1): a window's deltas of several messages go out as one
//!   frame per message, each covering seqs interleaved with the others'. A frame sent
//!   before the window's last one is `B:R1,R2,...`: everything up to the base `B`, plus,
//!   for each `Ri`, the deltas of the lane (message, reasoning stream, child...) of event
//!   `Ri` up to `Ri`. The window's last frame leaves nothing undelivered before it, so
//!   its id is a plain seq again.
//!
//! Grammar: `S` | `S.K`, optionally followed by `:R1,R2,...` (each `Ri` > the base's seq,
//! increasing). Clients treat ids as opaque strings and send the last one back.

use std::fmt;

use crate::error::{ErrorCode, Rejection, Result};

/// A position in a stream's items.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cursor {
    /// With `part == 0`: every event up to and including `seq`. Otherwise the events
    /// before `seq` and the first `part` items of event `seq`.
    pub seq: i64,
    /// Items of event `seq` delivered (0: all of them).
    pub part: u32,
    /// Lanes delivered beyond the base: the deltas in the lane of event `r`, up to `r`.
    pub lanes: Vec<i64>,
}

impl Cursor {
    /// Everything up to and including event `seq`.
    pub fn at(seq: i64) -> Cursor {
        Cursor { seq, part: 0, lanes: vec![] }
    }

    /// Every event before `seq`, and the first `part` items of it (`part` > 0).
    pub fn within(seq: i64, part: u32) -> Cursor {
        Cursor { seq, part, lanes: vec![] }
    }

    /// The last event every item of which was delivered (the base a resume folds to).
    /// A lane mark on the partly sent event itself means its delta went out too: a
    /// delta is the last item of its event, so the event is complete.
    pub fn complete_seq(&self) -> i64 {
        if self.part == 0 || self.lanes.first() == Some(&self.seq) {
            self.seq
        } else {
            self.seq - 1
        }
    }

    /// True for a plain seq.
    pub fn is_plain(&self) -> bool {
        self.part == 0 && self.lanes.is_empty()
    }

    /// The furthest event this cursor says anything about.
    pub fn max_seq(&self) -> i64 {
        self.lanes.last().copied().unwrap_or(self.seq).max(self.seq)
    }

    /// Orders positions by their base (lanes do not move the base).
    pub fn base_key(&self) -> (i64, u32) {
        (self.seq, if self.part == 0 { u32::MAX } else { self.part })
    }

    /// Parses an id as a client sends it back (`Last-Event-ID`, `after_seq`).
    pub fn parse(s: &str) -> Result<Cursor> {
        let bad = || {
            Rejection::new(
                ErrorCode::InvalidParameter,
                format!(
                    "`{}` is not a stream position: send back an `id` this service sent (a seq such as `42`, \
                     or `42.1`, `42:45,47`)",
                    clip(s)
                ),
            )
        };
        let s = s.trim();
        let (base, lanes) = match s.split_once(':') {
            Some((b, l)) => (b, Some(l)),
            None => (s, None),
        };
        let (seq, part) = match base.split_once('.') {
            Some((q, k)) => (number(q).ok_or_else(bad)?, number(k).ok_or_else(bad)?),
            None => (number(base).ok_or_else(bad)?, 0),
        };
        if seq < 0 || (base.contains('.') && part == 0) {
            return Err(bad());
        }
        let part = u32::try_from(part).map_err(|_| bad())?;
        let mut cursor = Cursor { seq, part, lanes: vec![] };
        if let Some(l) = lanes {
            for r in l.split(',') {
                let r = number(r).ok_or_else(bad)?;
                let floor = cursor.lanes.last().copied().unwrap_or(cursor.complete_seq());
                if r <= floor {
                    return Err(bad());
                }
                cursor.lanes.push(r);
            }
            if cursor.lanes.is_empty() {
                return Err(bad());
            }
        }
        Ok(cursor)
    }
}

/// A non-negative decimal without sign or spaces (so an id has one spelling).
fn number(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(40).collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    out
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.seq)?;
        if self.part > 0 {
            write!(f, ".{}", self.part)?;
        }
        for (i, r) in self.lanes.iter().enumerate() {
            f.write_str(if i == 0 { ":" } else { "," })?;
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_have_one_spelling() {
        for s in ["0", "42", "42.1", "42.13", "40:43", "40:43,47", "40.2:40,43"] {
            let c = Cursor::parse(s).expect(s);
            assert_eq!(c.to_string(), s);
        }
        let c = Cursor::parse("40.2:43,47").expect("parses");
        assert_eq!(
            (c.seq, c.part, c.lanes.clone(), c.complete_seq(), c.max_seq()),
            (40, 2, vec![43, 47], 39, 47)
        );
        assert!(Cursor::parse("7").expect("plain").is_plain());
    }

    #[test]
    fn anything_else_is_refused_with_a_code() {
        for s in [
            "",
            "-1",
            "+3",
            "1e3",
            "3.0",
            "3.",
            ".3",
            "3:",
            "3:2",
            "3:5,4",
            "3:5,5",
            "x",
            "3 4",
            "1234567890123456789",
        ] {
            let e = Cursor::parse(s).expect_err(s);
            assert_eq!(e.code, ErrorCode::InvalidParameter, "{s}");
        }
    }

    #[test]
    fn positions_order_by_their_base() {
        let k = |s: &str| Cursor::parse(s).expect(s).base_key();
        assert!(k("4.1") < k("4.2") && k("4.2") < k("4") && k("4") < k("5.1"));
        assert_eq!(k("4:7"), k("4"));
    }
}
