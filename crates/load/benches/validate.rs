//! The pure append-side hot path, no I/O: parsing a producer batch and running a long
//! run through the append guard.
//!
//! Machines are shared and noisy, so every figure comes with a baseline measured in the
//! same run and is read as a ratio (see BENCHMARKS.md):
//! - `parse_batch/agent_stream` against `parse_batch/serde_json_value`: the cost of our
//!   parsing and checks over merely parsing the same bytes as JSON;
//! - `guard/apply` against `guard/walk`: the state machine against one plain pass over the
//!   same event bodies;
//! - `guard_per_append/apply_cloned_per_event` against `guard_per_append/walk`: the same
//!   with a clone of the guard per event, as single appends and streamed lines apply it.
//!
//! Run with `cargo bench --bench validate`.

use std::hint::black_box;
use std::time::Duration;

use agent_stream::domain::event::{
    ChildSpawn, Delta, Lifecycle, MessageEnd, MessageStart, Role, StepBoundary, StepKind, ToolEnd,
    ToolProgress, ToolStart,
};
use agent_stream::domain::{EventBody, Framing, Limits, Origin, RunGuard, RunState};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput};
use serde_json::json;

/// Events per parsed batch.
const BATCH: usize = 1_000;
/// Wire size of each `text.delta` event in the parsed batch, in bytes.
const EVENT_BYTES: usize = 100;
/// Events in the generated run the guard folds.
const RUN_EVENTS: usize = 1_000_000;
/// Events applied one clone at a time, as single appends do.
const PER_APPEND_EVENTS: usize = 200_000;

use agent_stream_core::testkit::prose as text;

/// The service's allocator (see `agent_stream::alloc`).
#[global_allocator]
static GLOBAL: agent_stream::Allocator = agent_stream::Allocator;

/// A JSON array of `BATCH` `text.delta` events of `EVENT_BYTES` bytes each.
fn delta_batch() -> Vec<u8> {
    let overhead = r#"{"type":"text.delta","payload":{"text":""}}"#.len();
    let events: Vec<String> = (0..BATCH)
        .map(|i| {
            let e = json!({"type": "text.delta", "payload": {"text": text(i, EVENT_BYTES - overhead)}});
            let s = e.to_string();
            assert_eq!(s.len(), EVENT_BYTES);
            s
        })
        .collect();
    format!("[{}]", events.join(",")).into_bytes()
}

fn bench_parse(c: &mut Criterion) {
    let body = delta_batch();
    let parsed = agent_stream::domain::input::parse_batch(&body, Framing::Json, Limits::default())
        .expect("the generated batch is valid");
    assert_eq!(parsed.events.len(), BATCH);

    let mut g = c.benchmark_group("parse_batch");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(2));
    g.measurement_time(Duration::from_secs(6));
    g.bench_function("serde_json_value", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&body)).expect("json"))
    });
    g.bench_function("agent_stream", |b| {
        b.iter(|| {
            agent_stream::domain::input::parse_batch(black_box(&body), Framing::Json, Limits::default())
                .expect("valid")
        })
    });
    g.finish();
}

type Ev = (Option<String>, EventBody);

/// A realistic run: `running`, then repeating turns of one streamed message (20 deltas),
/// one tool call (start, progress, end) and a step boundary; every tenth turn also spawns
/// a child that streams a short message of its own and finishes.
fn generated_run(n: usize) -> Vec<Ev> {
    let mut out: Vec<Ev> = Vec::with_capacity(n + 64);
    let lifecycle = |state| EventBody::Lifecycle(Lifecycle { state, reason: None });
    out.push((None, lifecycle(RunState::Running)));
    let mut turn = 0usize;
    while out.len() < n {
        let m = format!("m{turn}");
        out.push((
            None,
            EventBody::MessageStart(MessageStart { message_id: m.clone(), role: Role::Assistant }),
        ));
        let mut full = String::new();
        for d in 0..20 {
            let t = text(turn * 20 + d, 24 + (turn + d) % 40);
            full.push_str(&t);
            // Most producers name the message; some rely on the current open one.
            let message_id = (d % 4 != 0).then(|| m.clone());
            out.push((None, EventBody::TextDelta(Delta { text: t, message_id })));
        }
        out.push((
            None,
            EventBody::MessageEnd(MessageEnd {
                message_id: Some(m),
                stop_reason: Some("tool_use".into()),
                text: Some(full),
            }),
        ));
        let call = format!("c{turn}");
        out.push((
            None,
            EventBody::ToolStart(ToolStart {
                call_id: call.clone(),
                tool: "browser.navigate".into(),
                input: json!({"url": format!("https://example.com/{turn}")}).into(),
                skill_id: None,
            }),
        ));
        out.push((
            None,
            EventBody::ToolProgress(ToolProgress { call_id: call.clone(), data: json!({"pct": 50}).into() }),
        ));
        out.push((
            None,
            EventBody::ToolEnd(ToolEnd {
                call_id: call,
                ok: true,
                output: json!({"status": 200}).into(),
                error: Default::default(),
                duration_ms: Some(1200),
                blob_ref: None,
            }),
        ));
        out.push((
            None,
            EventBody::StepBoundary(StepBoundary {
                step_index: turn as u32,
                step_kind: StepKind::ToolRoundtrip,
                checkpoint_id: None,
            }),
        ));
        if turn % 10 == 9 {
            let kid = format!("k{turn}");
            out.push((
                None,
                EventBody::ChildSpawn(ChildSpawn {
                    child_id: kid.clone(),
                    prompt: Some("look it up".into()),
                    tools_allowed: None,
                }),
            ));
            let k = Some(kid);
            out.push((k.clone(), lifecycle(RunState::Running)));
            for d in 0..5 {
                out.push((
                    k.clone(),
                    EventBody::TextDelta(Delta { text: text(turn + d, 32), message_id: None }),
                ));
            }
            out.push((
                k.clone(),
                EventBody::MessageEnd(MessageEnd { message_id: None, stop_reason: None, text: None }),
            ));
            out.push((k, lifecycle(RunState::Done)));
        }
        turn += 1;
    }
    out.truncate(n);
    out
}

/// Folds the whole run into a fresh guard, as a rebuild after a restart does.
fn apply_all(events: &[Ev]) -> RunGuard {
    let mut g = RunGuard::new();
    for (i, (child, body)) in events.iter().enumerate() {
        g.apply(i as i64 + 1, child.as_deref(), body, Origin::Producer).expect("the generated run is valid");
    }
    g
}

/// As the append path does: per batch of 1,000, clone the guard, apply, keep the clone.
fn apply_batched(events: &[Ev]) -> RunGuard {
    let mut kept = RunGuard::new();
    for (b, chunk) in events.chunks(BATCH).enumerate() {
        let mut g = kept.clone();
        for (i, (child, body)) in chunk.iter().enumerate() {
            let seq = (b * BATCH + i) as i64 + 1;
            g.apply(seq, child.as_deref(), body, Origin::Producer).expect("the generated run is valid");
        }
        kept = g;
    }
    kept
}

/// As single appends and streamed lines do: per event, clone the guard, apply, keep the
/// clone. Each first change to a shared map copies the nodes on its path, keys included.
fn apply_one_at_a_time(events: &[Ev]) -> RunGuard {
    let mut kept = RunGuard::new();
    for (i, (child, body)) in events.iter().enumerate() {
        let mut g = kept.clone();
        g.apply(i as i64 + 1, child.as_deref(), body, Origin::Producer).expect("the generated run is valid");
        kept = g;
    }
    kept
}

/// The baseline: one pass over the same bodies that looks at each event (its variant
/// and, for deltas, the length of its text) and does nothing else.
fn walk(events: &[Ev]) -> usize {
    let mut acc = 0usize;
    for (child, body) in events {
        acc = acc.wrapping_add(child.as_ref().map_or(0, String::len));
        acc = acc.wrapping_add(match body {
            EventBody::TextDelta(d) | EventBody::ReasoningDelta(d) => d.text.len(),
            EventBody::MessageEnd(e) => e.text.as_ref().map_or(1, String::len),
            EventBody::ToolStart(t) => t.call_id.len(),
            _ => 1,
        });
    }
    acc
}

/// A group whose every iteration folds `events` events: ten flat samples.
fn whole_run_group<'a>(c: &'a mut Criterion, name: &str, events: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(events as u64));
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.warm_up_time(Duration::from_secs(2));
    g.measurement_time(Duration::from_secs(8));
    g
}

fn bench_guard(c: &mut Criterion) {
    let events = generated_run(RUN_EVENTS);
    let last = apply_all(&events);
    assert_eq!(last.last_seq(), RUN_EVENTS as i64);

    let mut g = whole_run_group(c, "guard", RUN_EVENTS);
    g.bench_function("walk", |b| b.iter(|| walk(black_box(&events))));
    // The guard's drop (its maps) is not part of the apply loop.
    g.bench_function("apply", |b| b.iter_with_large_drop(|| apply_all(black_box(&events))));
    g.bench_function("apply_batched_clone", |b| b.iter_with_large_drop(|| apply_batched(black_box(&events))));
    g.finish();

    // A clone per event: the first `PER_APPEND_EVENTS` of the run (~7,000 messages and
    // tool calls by its end), against the walk over the same events.
    let first = &events[..PER_APPEND_EVENTS];
    let mut g = whole_run_group(c, "guard_per_append", PER_APPEND_EVENTS);
    g.bench_function("walk", |b| b.iter(|| walk(black_box(first))));
    g.bench_function("apply_cloned_per_event", |b| {
        b.iter_with_large_drop(|| apply_one_at_a_time(black_box(first)))
    });
    g.finish();
}

criterion_group!(benches, bench_parse, bench_guard);
criterion_main!(benches);
