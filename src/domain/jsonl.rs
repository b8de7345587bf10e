//! Reading exported JSONL: each line is a stored event's envelope
//! (`{id, ts, type, run_id, child_id, seq, payload}`). The envelope fields the server
//! assigns are taken apart here; what remains is checked by the append path's own
//! parser, so an imported event obeys exactly the rules of an appended one.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::input::{parse_event, Limits, NewEvent};
use crate::error::{ErrorCode, Rejection};

/// One parsed line: the original time and seq, and the event.
#[derive(Debug, Clone)]
pub struct Line {
    /// Original server time.
    pub ts: DateTime<Utc>,
    /// Original seq.
    pub seq: i64,
    /// The event.
    pub event: NewEvent,
}

fn bad(line: usize, code: ErrorCode, msg: impl std::fmt::Display) -> Rejection {
    Rejection::new(code, format!("line {line}: {msg}")).at(line - 1)
}

/// Parses line `line` (1-based) of an export.
pub fn parse_line(line: usize, raw: &[u8], limits: Limits) -> Result<Line, Rejection> {
    let mut v: Value = serde_json::from_slice(raw)
        .map_err(|e| bad(line, ErrorCode::EventMalformed, format!("not valid JSON: {e}")))?;
    let Some(map) = v.as_object_mut() else {
        return Err(bad(
            line,
            ErrorCode::EventMalformed,
            "each line must be one exported event (a JSON object)",
        ));
    };
    let ts = match map.remove("ts") {
        Some(Value::String(s)) => {
            DateTime::parse_from_rfc3339(&s).map(|t| t.with_timezone(&Utc)).map_err(|e| {
                bad(line, ErrorCode::EventMalformed, format!("`ts` is not an RFC 3339 time: {e}"))
            })?
        }
        _ => {
            return Err(bad(line, ErrorCode::EventMalformed, "`ts` (the event's time, RFC 3339) is missing"))
        }
    };
    let seq = match map.remove("seq") {
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|s| *s > 0)
            .ok_or_else(|| bad(line, ErrorCode::EventMalformed, "`seq` must be 1 or more"))?,
        _ => return Err(bad(line, ErrorCode::EventMalformed, "`seq` (a positive integer) is missing")),
    };
    // Assigned anew on import (or meaningless outside the original run).
    for k in ["id", "run_id", "first_seq"] {
        map.remove(k);
    }
    if map.get("child_id").is_some_and(Value::is_null) {
        map.remove("child_id");
    }
    let rest = serde_json::to_vec(&v).map_err(|e| bad(line, ErrorCode::EventMalformed, e))?;
    let event = parse_event(&rest, limits).map_err(|r| Rejection {
        message: format!("line {line}: {}", r.message),
        index: Some(line - 1),
        ..r
    })?;
    Ok(Line { ts, seq, event })
}

/// Checks an export line by line as it is read, so a file of any size is checked in
/// constant memory: every non-blank line parses, and seqs run 1, 2, 3, … in order.
#[derive(Debug)]
pub struct ExportLines {
    limits: Limits,
    events: i64,
}

impl ExportLines {
    /// A reader of one export under `limits`.
    pub fn new(limits: Limits) -> ExportLines {
        ExportLines { limits, events: 0 }
    }

    /// Line `line` (1-based) of the export, without its newline: `None` when blank.
    pub fn line(&mut self, line: usize, raw: &[u8]) -> Result<Option<Line>, Rejection> {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let l = parse_line(line, raw, self.limits)?;
        let want = self.events + 1;
        if l.seq != want {
            return Err(bad(
                line,
                ErrorCode::SeqConflict,
                format!(
                    "seq {} where {want} was expected (an export holds seqs 1, 2, 3, … with no gaps)",
                    l.seq
                ),
            ));
        }
        self.events = want;
        Ok(Some(l))
    }

    /// After the last line: an export holds at least one event.
    pub fn finish(&self) -> Result<(), Rejection> {
        if self.events == 0 {
            return Err(Rejection::new(ErrorCode::BatchEmpty, "the file holds no events"));
        }
        Ok(())
    }
}

/// Parses a whole export held in memory (see [`ExportLines`]).
pub fn parse_export(body: &[u8], limits: Limits) -> Result<Vec<(usize, Line)>, Rejection> {
    let mut lines = ExportLines::new(limits);
    let mut out = Vec::new();
    for (i, raw) in body.split(|b| *b == b'\n').enumerate() {
        if let Some(l) = lines.line(i + 1, raw)? {
            out.push((i + 1, l));
        }
    }
    lines.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked_like_appends_and_blamed_by_number() {
        let ok = br#"{"id":"01J","ts":"2026-01-01T00:00:00.000Z","type":"text.delta","run_id":"x","child_id":null,"seq":1,"payload":{"text":"a"}}"#;
        let parsed = parse_export(&[&ok[..], b"\n\n"].concat(), Limits::default()).expect("valid");
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].1.seq, 1);

        let unknown = br#"{"ts":"2026-01-01T00:00:00Z","type":"nope","seq":2,"payload":{}}"#;
        let err = parse_export(&[&ok[..], b"\n", &unknown[..]].concat(), Limits::default()).unwrap_err();
        assert_eq!((err.code, err.index), (ErrorCode::UnknownType, Some(1)));
        assert!(err.message.starts_with("line 2:"), "{}", err.message);

        let gap = br#"{"ts":"2026-01-01T00:00:00Z","type":"text.delta","seq":3,"payload":{"text":"b"}}"#;
        let err = parse_export(&[&ok[..], b"\n", &gap[..]].concat(), Limits::default()).unwrap_err();
        assert_eq!((err.code, err.index), (ErrorCode::SeqConflict, Some(1)));

        let no_ts = br#"{"type":"text.delta","seq":1,"payload":{"text":"b"}}"#;
        assert_eq!(parse_export(no_ts, Limits::default()).unwrap_err().code, ErrorCode::EventMalformed);
        assert_eq!(parse_export(b"\n \n", Limits::default()).unwrap_err().code, ErrorCode::BatchEmpty);
    }
}
