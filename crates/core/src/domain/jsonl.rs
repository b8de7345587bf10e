//! Reading exported JSONL: each line is a stored event's envelope
//! (`{id, ts, type, run_id, child_id, seq, payload}`). The envelope fields the server
//! assigns are taken apart here; what remains is checked by the append path's own
//! parser, so an imported event obeys exactly the rules of an appended one.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::input::{parse_event, Limits, NewEvent};
use crate::error::{ErrorCode, Rejection};

/// The last line of a complete native export: `{"export_end": {...}}`. Written only
/// once the whole range was read, so an export without it is partial.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndLine {
    /// Event lines before this one.
    pub lines: u64,
    /// Seq of the last event line (a run export; absent when it holds none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<i64>,
    /// Runs the lines belong to (a tenant-wide export).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u64>,
}

/// The key of the end line's object: an event envelope never has it.
pub const END_KEY: &str = "export_end";

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
    parse_value(line, json_line(line, raw)?, limits)
}

fn json_line(line: usize, raw: &[u8]) -> Result<Value, Rejection> {
    serde_json::from_slice(raw)
        .map_err(|e| bad(line, ErrorCode::EventMalformed, format!("not valid JSON: {e}")))
}

/// An exported event's line, parsed as JSON.
fn parse_value(line: usize, mut v: Value, limits: Limits) -> Result<Line, Rejection> {
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
    // Exports carry no idempotency keys, and import would not store one: a line with
    // a key was not written by an export.
    if map.contains_key("key") {
        return Err(bad(
            line,
            ErrorCode::EventMalformed,
            "`key` is not part of an exported event (exports carry no idempotency keys); remove it",
        ));
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
    /// The line that held the export's end line, once read.
    ended: Option<usize>,
}

impl ExportLines {
    /// A reader of one export under `limits`.
    pub fn new(limits: Limits) -> ExportLines {
        ExportLines { limits, events: 0, ended: None }
    }

    /// Line `line` (1-based) of the export, without its newline: `None` when blank.
    pub fn line(&mut self, line: usize, raw: &[u8]) -> Result<Option<Line>, Rejection> {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if let Some(at) = self.ended {
            return Err(bad(
                line,
                ErrorCode::BodyMalformed,
                format!("the export ended at line {at} (`{END_KEY}`); nothing may follow it"),
            ));
        }
        let v = json_line(line, raw)?;
        if let Some(end) = v.get(END_KEY) {
            self.end(line, end)?;
            return Ok(None);
        }
        let l = parse_value(line, v, self.limits)?;
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

    /// Checks the end line against what came before it: a file that lost lines (or
    /// gained some) is refused.
    fn end(&mut self, line: usize, end: &Value) -> Result<(), Rejection> {
        let end: EndLine = serde_json::from_value(end.clone())
            .map_err(|e| bad(line, ErrorCode::BodyMalformed, format!("invalid `{END_KEY}` line: {e}")))?;
        if end.runs.is_some() {
            return Err(bad(
                line,
                ErrorCode::BodyMalformed,
                "this is a tenant-wide export; import takes the export of one run",
            ));
        }
        let last = (self.events > 0).then_some(self.events);
        if end.lines != self.events as u64 || end.last_seq != last {
            return Err(bad(
                line,
                ErrorCode::BodyMalformed,
                format!(
                    "the end line counts {} event lines up to seq {}, but the file holds {} up to seq {}: \
                     it is not the whole export",
                    end.lines,
                    end.last_seq.map_or("none".to_owned(), |s| s.to_string()),
                    self.events,
                    last.map_or("none".to_owned(), |s| s.to_string()),
                ),
            ));
        }
        self.ended = Some(line);
        Ok(())
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

        let with_key =
            br#"{"ts":"2026-01-01T00:00:00Z","type":"text.delta","seq":1,"payload":{"text":"a"},"key":"k"}"#;
        assert_eq!(parse_export(with_key, Limits::default()).unwrap_err().code, ErrorCode::EventMalformed);

        let no_ts = br#"{"type":"text.delta","seq":1,"payload":{"text":"b"}}"#;
        assert_eq!(parse_export(no_ts, Limits::default()).unwrap_err().code, ErrorCode::EventMalformed);
        assert_eq!(parse_export(b"\n \n", Limits::default()).unwrap_err().code, ErrorCode::BatchEmpty);
    }

    #[test]
    fn the_end_line_must_count_the_lines_before_it_and_come_last() {
        let ok = br#"{"ts":"2026-01-01T00:00:00.000Z","type":"text.delta","seq":1,"payload":{"text":"a"}}"#;
        let two = br#"{"ts":"2026-01-01T00:00:00.000Z","type":"text.delta","seq":2,"payload":{"text":"b"}}"#;
        let file = |end: &str| [&ok[..], b"\n", &two[..], b"\n", end.as_bytes(), b"\n"].concat();
        let whole = file(r#"{"export_end":{"lines":2,"last_seq":2}}"#);
        assert_eq!(parse_export(&whole, Limits::default()).expect("whole").len(), 2);
        for (end, why) in [
            (r#"{"export_end":{"lines":3,"last_seq":3}}"#, "counts more lines"),
            (r#"{"export_end":{"lines":2,"last_seq":5}}"#, "another last seq"),
            (r#"{"export_end":{"lines":2,"runs":1}}"#, "a tenant export"),
            (r#"{"export_end":{"lines":2,"last_seq":2,"more":1}}"#, "unknown field"),
        ] {
            let err = parse_export(&file(end), Limits::default()).unwrap_err();
            assert_eq!((err.code, err.index), (ErrorCode::BodyMalformed, Some(2)), "{why}: {}", err.message);
        }
        let trailing = [&whole[..], &ok[..]].concat();
        let err = parse_export(&trailing, Limits::default()).unwrap_err();
        assert!(err.message.contains("nothing may follow"), "{}", err.message);
        // Without an end line (hand-written, or older), the lines are still taken.
        assert_eq!(parse_export(&[&ok[..], b"\n", &two[..]].concat(), Limits::default()).unwrap().len(), 2);
    }
}
