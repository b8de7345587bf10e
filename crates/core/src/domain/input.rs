//! What producers send: parsing a batch body (JSON array, JSON object or NDJSON) into
//! typed [`NewEvent`]s, with every structural rule checked before anything is stored.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::event::{BodyError, EventBody};
use crate::error::{ErrorCode, Rejection};

/// Longest accepted producer-chosen id (`message_id`, `call_id`, `child_id`, keys, ...).
pub const MAX_ID_LEN: usize = 256;

/// Size and count limits applied to every batch.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest single event, in bytes of its JSON text.
    pub max_event_bytes: usize,
    /// Most events in one batch.
    pub max_batch_events: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_event_bytes: 1 << 20, max_batch_events: 10_000 }
    }
}

/// An event as a producer appends it; the server adds id, ts and seq.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Set when the event comes from a spawned child.
    pub child_id: Option<String>,
    /// Idempotency key: a retry with the same key returns the original seq.
    pub key: Option<String>,
    /// Type and payload.
    pub body: EventBody,
}

/// A parsed batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The events in order.
    pub events: Vec<NewEvent>,
    /// Optimistic-concurrency check: the run's last seq must equal this.
    pub expected_last_seq: Option<i64>,
}

/// How the body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `application/json`: an array of events, or `{"events": [...], "expected_last_seq": n}`.
    Json,
    /// `application/x-ndjson` (or jsonl): one event per line.
    Ndjson,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(borrow)]
    events: Vec<&'a RawValue>,
    #[serde(default)]
    expected_last_seq: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Incoming {
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    child_id: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

/// Fields the server assigns; a producer sending them gets a pointed message.
const SERVER_FIELDS: &[&str] = &["id", "seq", "ts", "run_id"];

/// Parses a whole append body. Nothing here touches the database.
pub fn parse_batch(body: &[u8], framing: Framing, limits: Limits) -> Result<Batch, Rejection> {
    let (raws, expected_last_seq): (Vec<&[u8]>, Option<i64>) = match framing {
        Framing::Json => {
            let first = body.iter().find(|b| !b.is_ascii_whitespace());
            match first {
                Some(b'[') => {
                    let list: Vec<&RawValue> = serde_json::from_slice(body).map_err(malformed)?;
                    (list.into_iter().map(|r| r.get().as_bytes()).collect(), None)
                }
                Some(b'{') => {
                    let env: Envelope = serde_json::from_slice(body).map_err(malformed)?;
                    (env.events.into_iter().map(|r| r.get().as_bytes()).collect(), env.expected_last_seq)
                }
                None => return Err(empty()),
                Some(_) => {
                    return Err(Rejection::new(
                        ErrorCode::BodyMalformed,
                        "expected a JSON array of events or an object {\"events\": [...]}",
                    ))
                }
            }
        }
        Framing::Ndjson => (
            body.split(|b| *b == b'\n')
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .filter(|l| l.iter().any(|b| !b.is_ascii_whitespace()))
                .collect(),
            None,
        ),
    };
    check_batch_size(raws.len(), limits)?;
    let mut events = Vec::with_capacity(raws.len());
    for (i, raw) in raws.into_iter().enumerate() {
        events.push(parse_event(raw, limits).map_err(|r| r.at(i))?);
    }
    check_keys(&events)?;
    Ok(Batch { events, expected_last_seq })
}

/// Refuses an empty batch or one with more events than the limit.
pub fn check_batch_size(n: usize, limits: Limits) -> Result<(), Rejection> {
    if n == 0 {
        return Err(empty());
    }
    if n > limits.max_batch_events {
        return Err(Rejection::new(
            ErrorCode::BatchTooLarge,
            format!("a batch holds at most {} events; this one has {n}; split it", limits.max_batch_events),
        ));
    }
    Ok(())
}

/// Refuses a batch that uses one idempotency key twice.
pub fn check_keys(events: &[NewEvent]) -> Result<(), Rejection> {
    let mut seen = std::collections::HashSet::new();
    for (i, e) in events.iter().enumerate() {
        if let Some(k) = &e.key {
            if !seen.insert(k.as_str()) {
                return Err(Rejection::new(
                    ErrorCode::KeyRepeated,
                    format!("idempotency key `{k}` appears more than once in this batch"),
                )
                .at(i));
            }
        }
    }
    Ok(())
}

/// Parses one event's JSON text.
pub fn parse_event(raw: &[u8], limits: Limits) -> Result<NewEvent, Rejection> {
    if raw.len() > limits.max_event_bytes {
        return Err(too_large(raw.len(), limits));
    }
    match parse_valid(raw) {
        Some(event) => Ok(event),
        None => parse_any(raw),
    }
}

/// An event's fields, read straight from its text: `type` borrowed (a type written
/// with escapes takes the full path), the payload left as text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields<'a> {
    #[serde(rename = "type")]
    type_name: &'a str,
    /// `null` or absent is no payload, as in the full path.
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
    #[serde(default)]
    child_id: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

/// A valid event read without the detour of [`parse_any`], or `None` at the least
/// doubt, for [`parse_any`] to read again and refuse with its message.
///
/// The full path reads the whole event into a `Value`, walks it, and reads that `Value`
/// again into the envelope and then into the payload's type: for a single text delta,
/// about two thirds of its parsing (docs/benchmarks-log.md, 2026-11-30 20:55). Here the
/// envelope is read once with its payload kept as text; a delta's payload (two strings,
/// no number to canonicalise) goes straight into its type, any other through a `Value`
/// as before. Every check of the full path is made, and a failed one gives up rather
/// than answer, so each rejection keeps the one message the full path gives it: a
/// repeated or unknown field, a server field, a NUL, an id too long, a bad payload.
fn parse_valid(raw: &[u8]) -> Option<NewEvent> {
    // serde reads a struct from an array too; an event is an object.
    if raw.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let f: Fields = serde_json::from_slice(raw).ok()?;
    let envelope = [Some(f.type_name), f.child_id.as_deref(), f.key.as_deref()];
    if envelope.into_iter().flatten().any(|s| s.contains('\0')) {
        return None;
    }
    check_id("child_id", f.child_id.as_deref()).ok()?;
    check_id("key", f.key.as_deref()).ok()?;
    let body = match f.type_name {
        "text.delta" | "reasoning.delta" => {
            let d: super::event::Delta = serde_json::from_str(f.payload?.get()).ok()?;
            if d.text.contains('\0') || d.message_id.as_ref().is_some_and(|m| m.contains('\0')) {
                return None;
            }
            match f.type_name {
                "text.delta" => EventBody::TextDelta(d),
                _ => EventBody::ReasoningDelta(d),
            }
        }
        _ => {
            let mut payload = match f.payload {
                Some(p) => serde_json::from_str(p.get()).ok()?,
                None => Value::Object(Default::default()),
            };
            super::text::check_json("event.payload", &mut payload).ok()?;
            EventBody::parse(f.type_name, payload).ok()?
        }
    };
    check_body_ids(&body).ok()?;
    Some(NewEvent { child_id: f.child_id, key: f.key, body })
}

/// Parses any event through a `Value`: every rule, every rejection's message.
fn parse_any(raw: &[u8]) -> Result<NewEvent, Rejection> {
    let mut value: Value = serde_json::from_slice(raw)
        .map_err(|e| Rejection::new(ErrorCode::EventMalformed, format!("event is not valid JSON: {e}")))?;
    super::text::check_json("event", &mut value)?;
    let Value::Object(map) = &value else {
        return Err(Rejection::new(
            ErrorCode::EventMalformed,
            "event must be a JSON object with `type` and `payload`",
        ));
    };
    if let Some(f) = SERVER_FIELDS.iter().find(|f| map.contains_key(**f)) {
        return Err(Rejection::new(
            ErrorCode::EventMalformed,
            format!("`{f}` is assigned by the server and must not be sent"),
        ));
    }
    if !map.contains_key("type") {
        return Err(Rejection::new(ErrorCode::EventMalformed, "event has no `type`"));
    }
    let inc: Incoming = serde_json::from_value(value)
        .map_err(|e| Rejection::new(ErrorCode::EventMalformed, format!("invalid event: {e}")))?;
    check_id("child_id", inc.child_id.as_deref())?;
    check_id("key", inc.key.as_deref())?;
    let payload = inc.payload.unwrap_or_else(|| Value::Object(Default::default()));
    let body = EventBody::parse(&inc.type_name, payload).map_err(|e| match e {
        BodyError::UnknownType(_) => Rejection::new(ErrorCode::UnknownType, e.to_string()),
        BodyError::InvalidPayload(m) => Rejection::new(ErrorCode::InvalidPayload, m),
    })?;
    check_body_ids(&body)?;
    Ok(NewEvent { child_id: inc.child_id, key: inc.key, body })
}

fn too_large(len: usize, limits: Limits) -> Rejection {
    Rejection::new(
        ErrorCode::EventTooLarge,
        format!(
            "event is {len} bytes; the limit is {} bytes (store large outputs elsewhere and send a blob_ref)",
            limits.max_event_bytes
        ),
    )
}

fn check_id(field: &str, v: Option<&str>) -> Result<(), Rejection> {
    match v {
        Some(s) if s.is_empty() || s.len() > MAX_ID_LEN => Err(Rejection::new(
            ErrorCode::InvalidPayload,
            format!("`{field}` must be 1 to {MAX_ID_LEN} bytes long"),
        )),
        _ => Ok(()),
    }
}

/// Ids inside payloads follow the same length rule as envelope ids.
fn check_body_ids(body: &EventBody) -> Result<(), Rejection> {
    use EventBody::*;
    match body {
        MessageStart(p) => check_id("message_id", Some(&p.message_id)),
        MessageEnd(p) => check_id("message_id", p.message_id.as_deref()),
        TextDelta(p) | ReasoningDelta(p) => check_id("message_id", p.message_id.as_deref()),
        ToolStart(p) => {
            check_id("call_id", Some(&p.call_id))?;
            check_id("tool", Some(&p.tool))
        }
        ToolProgress(p) => check_id("call_id", Some(&p.call_id)),
        ToolEnd(p) => check_id("call_id", Some(&p.call_id)),
        ChildSpawn(p) => check_id("child_id", Some(&p.child_id)),
        PlanProposal(p) => check_id("plan.id", Some(&p.plan.id)),
        PlanDecision(p) => check_id("plan_id", Some(&p.plan_id)),
        _ => Ok(()),
    }
}

fn malformed(e: serde_json::Error) -> Rejection {
    Rejection::new(ErrorCode::BodyMalformed, format!("body is not valid JSON: {e}"))
}

fn empty() -> Rejection {
    Rejection::new(ErrorCode::BatchEmpty, "the batch holds no events")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str, f: Framing) -> Result<Batch, Rejection> {
        parse_batch(s.as_bytes(), f, Limits::default())
    }

    #[test]
    fn array_object_and_ndjson_agree() {
        let a = parse(r#"[{"type":"text.delta","payload":{"text":"hi"}}]"#, Framing::Json).unwrap();
        let o = parse(
            r#"{"events":[{"type":"text.delta","payload":{"text":"hi"}}],"expected_last_seq":3}"#,
            Framing::Json,
        )
        .unwrap();
        let n = parse("\n{\"type\":\"text.delta\",\"payload\":{\"text\":\"hi\"}}\r\n\n", Framing::Ndjson)
            .unwrap();
        assert_eq!(a.events, o.events);
        assert_eq!(a.events, n.events);
        assert_eq!(o.expected_last_seq, Some(3));
    }

    #[test]
    fn errors_name_the_event() {
        let r = parse(
            r#"[{"type":"text.delta","payload":{"text":"a"}},{"type":"nope","payload":{}}]"#,
            Framing::Json,
        )
        .unwrap_err();
        assert_eq!((r.code, r.index), (ErrorCode::UnknownType, Some(1)));
        let r = parse(r#"[{"type":"tool.start","payload":{"call_id":"c"}}]"#, Framing::Json).unwrap_err();
        assert_eq!(r.code, ErrorCode::InvalidPayload);
        assert!(r.message.contains("tool"), "{}", r.message);
        let r =
            parse(r#"[{"type":"text.delta","seq":4,"payload":{"text":"a"}}]"#, Framing::Json).unwrap_err();
        assert_eq!(r.code, ErrorCode::EventMalformed);
        assert!(r.message.contains("`seq`"));
    }

    #[test]
    fn size_and_count_limits() {
        let limits = Limits { max_event_bytes: 64, max_batch_events: 2 };
        let big = format!(r#"[{{"type":"text.delta","payload":{{"text":"{}"}}}}]"#, "x".repeat(100));
        let r = parse_batch(big.as_bytes(), Framing::Json, limits).unwrap_err();
        assert_eq!((r.code, r.index), (ErrorCode::EventTooLarge, Some(0)));
        let three =
            r#"[{"type":"compaction.start"},{"type":"compaction.start"},{"type":"compaction.start"}]"#;
        let r = parse_batch(three.as_bytes(), Framing::Json, limits).unwrap_err();
        assert_eq!(r.code, ErrorCode::BatchTooLarge);
        assert_eq!(parse("  ", Framing::Json).unwrap_err().code, ErrorCode::BatchEmpty);
        assert_eq!(parse("[]", Framing::Json).unwrap_err().code, ErrorCode::BatchEmpty);
    }

    /// Events the two paths must agree on: valid ones of every shape, and every way
    /// to be refused that a quick reading could get wrong.
    const CORPUS: &[&str] = &[
        r#"{"type":"text.delta","payload":{"text":"hi"}}"#,
        r#" {"payload":{"message_id":"m1","text":"a\nb \u00e9"},"type":"reasoning.delta","key":"k1","child_id":"c"}"#,
        r#"{"type":"text.delta","payload":{"text":"hi"},"child_id":null,"key":null}"#,
        r#"{"type":"text\u002edelta","payload":{"text":"escaped type"}}"#,
        r#"{"type":"tool.start","payload":{"call_id":"c1","tool":"search","input":{"n":1e2,"x":[1.50e1,2]}}}"#,
        r#"{"type":"tool.start","payload":{"call_id":"c1","tool":"search","input":{"n":-0}}}"#,
        r#"{"type":"custom.ping","payload":{"at":12.50,"k":"v"}}"#,
        r#"{"type":"custom.ping","payload":null}"#,
        r#"{"type":"custom.ping"}"#,
        r#"{"type":"compaction.start"}"#,
        r#"{"type":"custom.bad name","payload":{}}"#,
        r#"["text.delta",{"text":"an array, not an object"}]"#,
        r#"{"type":"text.delta","type":"text.delta","payload":{"text":"twice"}}"#,
        r#"{"type":"text.delta","payload":{"text":"a","text":"b"}}"#,
        r#"{"type":"text.delta","payload":{"text":"a"},"seq":3}"#,
        r#"{"type":"text.delta","payload":{"text":"a"},"extra":1}"#,
        r#"{"type":"text.delta","payload":{"text":"a","extra":1}}"#,
        r#"{"type":"text.delta","payload":{"text":"nul \u0000 here"}}"#,
        r#"{"type":"text.delta","payload":{"text":"a","message_id":"\u0000"}}"#,
        r#"{"type":"text.delta","payload":{"text":"a"},"key":"\u0000"}"#,
        r#"{"type":"text.delta","payload":{"text":"a"},"child_id":""}"#,
        r#"{"type":"text.delta","payload":{"text":"a","message_id":""}}"#,
        r#"{"type":"text.delta","payload":{"text":5}}"#,
        r#"{"type":"text.delta","payload":{}}"#,
        r#"{"type":"text.delta","payload":null}"#,
        r#"{"type":"text.delta"}"#,
        r#"{"type":"nope","payload":{}}"#,
        r#"{"payload":{"text":"a"}}"#,
        r#"{"type":"text.delta","payload":{"text":"a"}} x"#,
        r#"{"type":"text.delta","payload":{"text":"\ud800"}}"#,
        r#"{"type":"tool.end","payload":{"call_id":"c1","output":{"a\u0000":1}}}"#,
        r#"42"#,
    ];

    #[test]
    fn the_quick_reading_agrees_with_the_full_one() {
        for raw in CORPUS {
            let full = parse_any(raw.as_bytes());
            if let Some(quick) = parse_valid(raw.as_bytes()) {
                assert_eq!(full.as_ref(), Ok(&quick), "{raw}");
            }
            assert_eq!(parse_event(raw.as_bytes(), Limits::default()), full, "{raw}");
        }
        // It is taken for valid events (escapes in `type` aside), and not for an array
        // or a repeated field, which the full path refuses or reads otherwise.
        for (i, raw) in CORPUS.iter().enumerate() {
            let taken = parse_valid(raw.as_bytes()).is_some();
            assert_eq!(taken, [0, 1, 2, 4, 6, 7, 8, 9].contains(&i), "{raw}");
        }
        assert!(parse_valid(CORPUS[11].as_bytes()).is_none());
        assert!(parse_any(CORPUS[11].as_bytes()).is_err());
        assert_eq!(
            parse_any(CORPUS[12].as_bytes()).map(|e| e.body.type_name().into_owned()),
            Ok("text.delta".into())
        );
        assert!(parse_valid(CORPUS[12].as_bytes()).is_none());
    }

    #[test]
    fn repeated_key_in_batch() {
        let r = parse(
            r#"[{"type":"compaction.start","key":"k"},{"type":"compaction.start","key":"k"}]"#,
            Framing::Json,
        )
        .unwrap_err();
        assert_eq!((r.code, r.index), (ErrorCode::KeyRepeated, Some(1)));
    }
}
