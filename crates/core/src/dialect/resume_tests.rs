//! The resume rule, for every dialect, at every item of generated runs: a client that
//! disconnects after any item and resumes with that item's id ends with exactly the
//! state of a client that never disconnected. Streams are shaped as SSE shapes them
//! (merged per lane, windows closing at random points, or `detail=full`), so merged
//! frames' cursors are exercised too.

use proptest::prelude::*;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::clients::{client, fold, Client};
use super::shape::{Shaper, WINDOW};
use super::{Cursor, Encoding, Format, Out, Resume, RunCtx};
use crate::domain::Event;
use crate::projection::RunView;
use crate::testkit::{generated_run, generated_run_mix, stored};

fn ctx() -> RunCtx {
    RunCtx { run_id: "run".into(), root_run_id: "root".into() }
}

/// The stream a client standing at `from` gets, shaped; windows close after the events
/// `closes` picks. True with it when the stream drops nothing the client saw (a resync
/// stream is then whole on its own).
fn stream_whole(
    format: Format,
    events: &[Event],
    from: &Cursor,
    raw: bool,
    closes: &dyn Fn(i64) -> bool,
) -> (Vec<Out>, bool) {
    let base = from.complete_seq();
    let view = RunView::fold(&events[..base as usize]);
    let mut enc = Encoding::new(format, ctx(), view);
    enc.resume_at(from.clone());
    let mode = enc.resume();
    let mut now = Instant::now();
    let start = match mode {
        Resume::Exact => from.clone(),
        Resume::Resync => Cursor::at(base),
    };
    let mut shaper = Shaper::new(raw, start, now);
    if mode == Resume::Resync {
        shaper = shaper.resumed(from);
    }
    let mut out = vec![];
    for o in enc.open() {
        shaper.push(&enc, o, now, &mut out);
    }
    let mut resumer = enc.resumer();
    let whole = resumer.is_done();
    for e in &events[base as usize..] {
        let items = enc.push(e);
        let mut kept = vec![];
        resumer.push(items, &mut kept);
        for o in kept {
            shaper.push(&enc, o, now, &mut out);
        }
        if closes(e.seq) {
            now += WINDOW * 50;
            shaper.tick(now, &mut out);
        }
    }
    let mut rest = vec![];
    resumer.finish(&mut rest);
    for o in rest {
        shaper.push(&enc, o, now, &mut out);
    }
    shaper.flush(now, &mut out);
    (out, whole)
}

fn stream(
    format: Format,
    events: &[Event],
    from: &Cursor,
    raw: bool,
    closes: &dyn Fn(i64) -> bool,
) -> Vec<Out> {
    stream_whole(format, events, from, raw, closes).0
}

/// Stream-level validity: ids never go back; AG-UI's open/close order holds (what
/// `verifyEvents` checks for the events we send); AI SDK parts are open when written.
fn check_valid(format: Format, items: &[Out], what: &str, from: &Cursor) {
    if let Some(first) = items.first() {
        assert!(first.cursor().base_key() >= from.base_key(), "{what}: id {} before {from}", first.cursor());
    }
    for w in items.windows(2) {
        assert!(
            w[0].cursor().base_key() <= w[1].cursor().base_key(),
            "{what}: id {} then {}",
            w[0].cursor(),
            w[1].cursor()
        );
    }
    match format {
        Format::Agui => {
            let mut open = std::collections::BTreeSet::new();
            let first = items.first().and_then(Out::to_json);
            assert_eq!(first.map(|f| f["type"].clone()), Some(json!("RUN_STARTED")), "{what}: first event");
            for o in items {
                let e = o.to_json().expect("json");
                let id = e["messageId"].as_str().unwrap_or_default().to_owned();
                match e["type"].as_str().unwrap_or_default() {
                    "TEXT_MESSAGE_START" | "REASONING_MESSAGE_START" => {
                        assert!(open.insert(id.clone()), "{what}: {id} started twice in {e}")
                    }
                    "TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT" => {
                        assert!(open.contains(&id), "{what}: content of {id}, not open: {e}")
                    }
                    "TEXT_MESSAGE_END" | "REASONING_MESSAGE_END" => {
                        assert!(open.remove(&id), "{what}: end of {id}, not open: {e}")
                    }
                    "RUN_FINISHED" | "RUN_ERROR" => {
                        assert!(open.is_empty(), "{what}: run ended with {open:?} open")
                    }
                    _ => {}
                }
            }
        }
        Format::Vercel => {
            let first = items.first().and_then(Out::to_json);
            assert_eq!(first.map(|f| f["type"].clone()), Some(json!("start")), "{what}: first chunk");
        }
        _ => {}
    }
}

fn state(format: Format, items: &[Out]) -> Client {
    let mut c = client(format);
    fold(format, &mut c, items);
    c
}

fn no_errors(c: &Client, what: &str) {
    if let Client::Vercel(v) = c {
        assert!(v.parts.iter().all(|p| p.get("error").is_none()), "{what}: {:?}", v.parts);
    }
}

/// Every cut of one run in one dialect.
fn check(format: Format, inputs: &[Value], raw: bool, pattern: u64) {
    let events = stored(inputs);
    let last = events.last().map_or(0, |e| e.seq);
    let ended = events.last().is_some_and(Event::is_run_end);
    let closes = |seq: i64| (pattern >> (seq % 61)) & 1 == 1;
    let other = |seq: i64| (pattern >> ((seq + 17) % 59)) & 1 == 0;
    let full = stream(format, &events, &Cursor::at(0), raw, &closes);
    check_valid(format, &full, "full stream", &Cursor::at(0));
    let want = state(format, &full);
    no_errors(&want, "full stream");
    // Shaping changes frames, never what the client ends with.
    assert_eq!(
        state(format, &stream(format, &events, &Cursor::at(0), !raw, &other)),
        want,
        "{}: raw and merged streams differ",
        format.name()
    );
    for i in 0..full.len() {
        let cut = full[i].cursor();
        let what = format!("{} cut after item {i} (id {cut})", format.name());
        let c = state(format, &full[..=i]);
        if ended && cut.complete_seq() >= last {
            assert_eq!(c, want, "{what}: the end was sent, nothing is left to resume");
            continue;
        }
        for (name, pattern) in [("same windows", &closes as &dyn Fn(i64) -> bool), ("other windows", &other)]
        {
            let (resumed, whole) = stream_whole(format, &events, &cut, raw, pattern);
            check_valid(format, &resumed, &format!("{what}, {name}"), &cut);
            let mut resumed_client = c.clone();
            fold(format, &mut resumed_client, &resumed);
            if resumed_client != want && std::env::var("DEBUG_RESUME").is_ok() {
                let show = |items: &[Out]| {
                    items
                        .iter()
                        .map(|o| format!("{} {}", o.cursor(), o.to_text()))
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                eprintln!("--- full:\n{}\n--- resumed:\n{}", show(&full), show(&resumed));
            }
            assert_eq!(resumed_client, want, "{what}, {name}");
            if format.resume() == Resume::Resync && whole {
                // A resync stream that drops nothing is whole on its own: a client with
                // nothing gets it all.
                assert_eq!(state(format, &resumed), want, "{what}, {name}: fresh client");
            }
        }
    }
}

proptest! {
    // 12 cases per test run (every cut of every dialect is checked in each);
    // `RESUME_CASES=n` soaks it.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("RESUME_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(12)
    ))]

    #[test]
    fn every_dialect_resumes_exactly_after_any_item(seed in any::<u64>(), steps in 20usize..90, raw in any::<bool>(), pattern in any::<u64>()) {
        let inputs = generated_run(seed, steps);
        for format in Format::ALL {
            check(format, &inputs, raw, pattern);
        }
    }

    /// The same with streamed tokens dominating, as in real runs (and in the Node
    /// resume check): more merged frames, so more cuts past their base.
    #[test]
    fn every_dialect_resumes_exactly_in_delta_heavy_runs(seed in any::<u64>(), steps in 20usize..90, raw in any::<bool>(), pattern in any::<u64>()) {
        let inputs = generated_run_mix(seed, steps, 40);
        for format in Format::ALL {
            check(format, &inputs, raw, pattern);
        }
    }
}

/// A run with what the issue saw break: a user message, several messages and a
/// child streaming at once, reasoning between text, a message whose text comes whole
/// with its end, a tool call without input. Every dialect, every cut, both shapes.
#[test]
fn the_runs_that_broke_resume_now_resume_exactly() {
    let inputs = vec![
        json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
        json!({"type": "message.start", "payload": {"message_id": "u1", "role": "user"}}),
        json!({"type": "text.delta", "payload": {"message_id": "u1", "text": "Compare "}}),
        json!({"type": "text.delta", "payload": {"message_id": "u1", "text": "prices."}}),
        json!({"type": "message.end", "payload": {"message_id": "u1", "text": "Compare prices."}}),
        json!({"type": "child.spawn", "payload": {"child_id": "k", "prompt": "shop A"}}),
        json!({"type": "run.lifecycle", "child_id": "k", "payload": {"state": "running"}}),
        json!({"type": "message.start", "payload": {"message_id": "a1", "role": "assistant"}}),
        json!({"type": "reasoning.delta", "payload": {"message_id": "a1", "text": "Two shops"}}),
        json!({"type": "text.delta", "child_id": "k", "payload": {"text": "A costs "}}),
        json!({"type": "text.delta", "payload": {"message_id": "a1", "text": "Looking"}}),
        json!({"type": "reasoning.delta", "payload": {"message_id": "a1", "text": " to check."}}),
        json!({"type": "text.delta", "child_id": "k", "payload": {"text": "12."}}),
        json!({"type": "text.delta", "payload": {"message_id": "a1", "text": " now."}}),
        json!({"type": "tool.start", "payload": {"call_id": "c1", "tool": "web.search"}}),
        json!({"type": "message.end", "child_id": "k", "payload": {"text": "A costs 12."}}),
        json!({"type": "run.lifecycle", "child_id": "k", "payload": {"state": "done"}}),
        json!({"type": "tool.end", "payload": {"call_id": "c1", "ok": false, "error": {"code": "KAI-1"}}}),
        json!({"type": "message.end", "payload": {"message_id": "a1", "text": "Looking now."}}),
        json!({"type": "message.start", "payload": {"message_id": "a2", "role": "assistant"}}),
        json!({"type": "message.end", "payload": {"message_id": "a2", "text": "Shop A wins."}}),
        json!({"type": "message.start", "payload": {"message_id": "a3", "role": "assistant"}}),
        json!({"type": "text.delta", "payload": {"message_id": "a3", "text": "Bye"}}),
        json!({"type": "run.lifecycle", "payload": {"state": "done"}}),
    ];
    check_every_shape(&inputs);
}

/// [`check`] in every dialect, raw and merged, with windows closing after no event,
/// every event and every other one.
fn check_every_shape(inputs: &[Value]) {
    for format in Format::ALL {
        for raw in [false, true] {
            for pattern in [0, u64::MAX, 0x5555_5555_5555_5555] {
                check(format, inputs, raw, pattern);
            }
        }
    }
}

/// The generated run CI found on 2026-11-29: AG-UI cut inside a merged reasoning frame
/// repeated part of the reasoning text.
#[test]
fn the_generated_run_ci_found_resumes_exactly() {
    let inputs = generated_run(4108086090032722745, 44);
    for format in Format::ALL {
        check(format, &inputs, false, 1330438800717980333);
    }
}

/// Runs cut inside their first event: the view at the base is empty, so a resync
/// stream must still re-synchronise what the client saw of that event (AG-UI sends no
/// `MESSAGES_SNAPSHOT` to a new client, but does to this one).
#[test]
fn runs_cut_inside_their_first_event_resume_exactly() {
    let tail = [
        json!({"type": "reasoning.delta", "payload": {"message_id": "a1", "text": " more"}}),
        json!({"type": "text.delta", "payload": {"message_id": "a1", "text": "Hi"}}),
        json!({"type": "reasoning.delta", "payload": {"message_id": "a1", "text": " still"}}),
        json!({"type": "text.delta", "payload": {"message_id": "a1", "text": " there"}}),
        json!({"type": "message.end", "payload": {"message_id": "a1", "text": "Hi there"}}),
        json!({"type": "run.lifecycle", "payload": {"state": "done"}}),
    ];
    let firsts = [
        json!({"type": "reasoning.delta", "payload": {"message_id": "a1", "text": "Think"}}),
        json!({"type": "tool.start", "payload": {"call_id": "c0", "tool": "web.search", "input": {"q": "x"}}}),
        json!({"type": "child.spawn", "payload": {"child_id": "k", "prompt": "shop A"}}),
    ];
    for first in firsts {
        let inputs: Vec<Value> = std::iter::once(first).chain(tail.iter().cloned()).collect();
        check_every_shape(&inputs);
    }
}

/// A fresh encoding, which makes no view for a dialect that does not read one, writes
/// every dialect's stream of a run as one given a new view does.
#[test]
fn a_fresh_encoding_writes_what_a_new_one_does() {
    let events = stored(&generated_run_mix(11, 400, 0));
    for format in Format::ALL {
        let (mut fresh, mut new) =
            (Encoding::fresh(format, ctx()), Encoding::new(format, ctx(), RunView::new()));
        for e in &events {
            assert_eq!(fresh.push(e), new.push(e), "{format:?} at seq {}", e.seq);
        }
        assert_eq!(fresh.view_seq(), new.view_seq(), "{format:?}");
    }
}
