//! Generated runs for property tests and benchmarks: a simulated producer that only
//! emits what the guard accepts (random interleavings of children, messages, tools,
//! steps, plans, compactions and lifecycle changes). Deterministic for a given seed.

use chrono::{TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use ulid::Ulid;

use crate::domain::{Event, EventBody};

/// Append inputs as the log would store them: seqs from 1, one millisecond apart.
/// Panics on an invalid input; test data is supposed to be valid.
pub fn stored(inputs: &[Value]) -> Vec<Event> {
    // The append path resolves each event's message with the guard; so does this.
    let mut guard = crate::domain::RunGuard::new();
    inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let child_id = v.get("child_id").and_then(Value::as_str).map(str::to_owned);
            let seq = i as i64 + 1;
            let body = EventBody::parse(v["type"].as_str().expect("type"), v["payload"].clone())
                .expect("valid event");
            let message_id =
                match guard.apply(seq, child_id.as_deref(), &body, crate::domain::Origin::Service) {
                    Ok(crate::domain::Resolution::Message { id, .. }) => Some(id),
                    _ => None,
                };
            Event {
                id: Ulid::from_parts(1_700_000_000_000 + i as u64, 0),
                ts: Utc.timestamp_millis_opt(1_700_000_000_000 + i as i64).single().expect("ts"),
                run_id: "run".into(),
                child_id,
                seq,
                body,
                message_id,
            }
        })
        .collect()
}

#[derive(Default)]
struct Scope {
    child: Option<String>,
    /// Open message ids with their streamed visible text.
    open: Vec<(String, String)>,
    /// Whether the last opened message was opened implicitly (its id is unknown to us).
    tools: Vec<String>,
    state: &'static str,
    ended: bool,
}

/// A valid run of about `steps` events (plus a few lifecycle events), as append inputs
/// `{type, payload, child_id?}`. Every kind of event is frequent: good for finding bugs.
pub fn generated_run(seed: u64, steps: usize) -> Vec<Value> {
    generated_run_mix(seed, steps, 0)
}

/// Like [`generated_run`], but `delta_pct` percent of the steps are text or reasoning
/// deltas on top of the usual mix, as in real agent runs where streamed tokens dominate.
pub fn generated_run_mix(seed: u64, steps: usize, delta_pct: u32) -> Vec<Value> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: Vec<Value> = vec![];
    let mut scopes = vec![Scope { state: "running", ..Default::default() }];
    let mut n = 0u64;
    out.push(json!({"type": "run.lifecycle", "payload": {"state": "running", "reason": "start"}}));
    let mut paused = false;
    for _ in 0..steps {
        let live: Vec<usize> = (0..scopes.len()).filter(|i| !scopes[*i].ended).collect();
        let si = live[rng.gen_range(0..live.len())];
        n += 1;
        let child = scopes[si].child.clone();
        let with_child = |mut v: Value| {
            if let Some(c) = &child {
                v["child_id"] = json!(c);
            }
            v
        };
        let mut roll = if rng.gen_range(0..100) < delta_pct { 10 } else { rng.gen_range(0..100) };
        // Real producers keep a few messages and calls open at a time: past that,
        // finish one instead of opening another.
        let (open, running) = (scopes[si].open.len(), scopes[si].tools.len());
        if (roll <= 9 && open >= 3) || ((10..=44).contains(&roll) && open > 3) {
            roll = 45;
        }
        if (55..=62).contains(&roll) && running >= 4 {
            roll = 67;
        }
        let ev = match roll {
            0..=9 => {
                let id = format!("m{n}");
                scopes[si].open.push((id.clone(), String::new()));
                let role = ["assistant", "user", "system"][rng.gen_range(0..3)];
                json!({"type": "message.start", "payload": {"message_id": id, "role": role}})
            }
            10..=44 => {
                let text: String = (0..rng.gen_range(1..12)).map(|_| rng.gen_range('a'..='z')).collect();
                let reasoning = rng.gen_bool(0.25);
                let ty = if reasoning { "reasoning.delta" } else { "text.delta" };
                let s = &mut scopes[si];
                if s.open.is_empty() || rng.gen_bool(0.6) {
                    // Omit the id: the current open message, or a new implicit one.
                    if s.open.is_empty() {
                        s.open.push((format!("msg-{}", out.len() + 1), String::new()));
                    }
                    let last = s.open.len() - 1;
                    if !reasoning {
                        s.open[last].1.push_str(&text);
                    }
                    json!({"type": ty, "payload": {"text": text}})
                } else {
                    let k = rng.gen_range(0..s.open.len());
                    if !reasoning {
                        s.open[k].1.push_str(&text);
                    }
                    json!({"type": ty, "payload": {"text": text, "message_id": s.open[k].0}})
                }
            }
            45..=54 if !scopes[si].open.is_empty() => {
                let s = &mut scopes[si];
                let k = rng.gen_range(0..s.open.len());
                let (id, text) = s.open.remove(k);
                let mut p = json!({"message_id": id});
                if rng.gen_bool(0.5) {
                    p["text"] = json!(text);
                }
                if rng.gen_bool(0.3) {
                    let reason = ["end_turn", "tool_use", "error", "max_tokens"][rng.gen_range(0..4)];
                    p["stop_reason"] = json!(reason);
                }
                json!({"type": "message.end", "payload": p})
            }
            55..=62 => {
                let id = format!("call{n}");
                scopes[si].tools.push(id.clone());
                let tool = ["web.search", "shell", "file.write"][rng.gen_range(0..3)];
                json!({"type": "tool.start", "payload": {"call_id": id, "tool": tool, "input": {"n": n}}})
            }
            63..=66 if !scopes[si].tools.is_empty() => {
                let s = &scopes[si];
                let id = &s.tools[rng.gen_range(0..s.tools.len())];
                let pct = rng.gen_range(0..100);
                json!({"type": "tool.progress", "payload": {"call_id": id, "data": {"pct": pct}}})
            }
            67..=74 if !scopes[si].tools.is_empty() => {
                let s = &mut scopes[si];
                let id = s.tools.remove(rng.gen_range(0..s.tools.len()));
                let ok = rng.gen_bool(0.7);
                let ms = rng.gen_range(1..5000);
                let mut p = json!({"call_id": id, "ok": ok, "duration_ms": ms});
                if ok {
                    p["output"] = json!({"n": n});
                } else {
                    p["error"] = json!("KAI-TOOL-0001");
                }
                json!({"type": "tool.end", "payload": p})
            }
            75..=78 => {
                let kinds = ["plan", "tool-roundtrip", "text-only", "fan-out", "fan-in", "done"];
                let kind = kinds[rng.gen_range(0..kinds.len())];
                json!({"type": "step.boundary", "payload": {"step_index": n, "step_kind": kind}})
            }
            79..=82 if scopes.len() < 6 => {
                let id = format!("child{n}");
                let spawn = with_child(
                    json!({"type": "child.spawn", "payload": {"child_id": id, "prompt": "sub-task"}}),
                );
                out.push(spawn);
                scopes.push(Scope { child: Some(id.clone()), state: "running", ..Default::default() });
                // The child's own first event: its scope, not the spawner's.
                out.push(json!({"type": "run.lifecycle", "child_id": id, "payload": {"state": "running"}}));
                continue;
            }
            83..=84 if si > 0 => {
                let st = ["done", "error", "aborted"][rng.gen_range(0..3)];
                scopes[si].ended = true;
                scopes[si].state = st;
                json!({"type": "run.lifecycle", "payload": {"state": st, "reason": "child finished"}})
            }
            85..=86 => json!({"type": "compaction.start", "payload": {}}),
            87..=88 => {
                let (removed, kept, tokens) =
                    (rng.gen_range(0..50), rng.gen_range(0..50), rng.gen_range(0..90000));
                json!({"type": "compaction.end", "payload": {"removed": removed, "kept": kept, "tokens_removed": tokens, "reason": "tokens"}})
            }
            89..=90 => {
                json!({"type": "plan.proposal", "payload": {"plan": {"id": format!("plan{n}"), "steps": [
                {"id": "s1", "title": "Research", "intent": "research", "est_cost_usd": 0.25},
                {"id": "s2", "title": "Write", "intent": "write", "est_cost_usd": 0.5}]}}})
            }
            91..=93 if si == 0 => {
                paused = !paused;
                json!({"type": "run.lifecycle", "payload": {"state": if paused { "paused" } else { "running" }}})
            }
            _ => json!({"type": "custom.note", "payload": {"n": n}}),
        };
        out.push(with_child(ev));
    }
    if rng.gen_bool(0.7) {
        let st = if paused {
            ["aborted", "error"][rng.gen_range(0..2)]
        } else {
            ["done", "aborted", "error"][rng.gen_range(0..3)]
        };
        out.push(json!({"type": "run.lifecycle", "payload": {"state": st, "reason": "end"}}));
    }
    out
}

const WORDS: &[&str] = &[
    "the", "agent", "reads", "page", "and", "compares", "prices", "across", "three", "shops,", "then",
    "writes", "a", "short", "summary", "for", "user.", "Next", "it", "checks", "shipping", "costs",
];

/// Deterministic prose of exactly `len` ASCII bytes; `n` varies the words.
pub fn prose(n: usize, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    let mut i = n;
    while s.len() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[i % WORDS.len()]);
        i = i.wrapping_mul(7).wrapping_add(3);
    }
    s.truncate(len);
    s
}
