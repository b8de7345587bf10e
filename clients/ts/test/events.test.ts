// The event types against the server's vocabulary: the server's own list of types (its
// refusal of an unknown type names them all) equals EVENT_TYPES, and a sample of each
// built-in type, typed by this package, is accepted and read back as sent.

import assert from "node:assert/strict";
import { test } from "node:test";
import { type BuiltinEventType, EVENT_TYPES, type NewEvent, type PayloadOf, Producer, isTerminal } from "../src/index.js";
import { allEvents, conn, newRun } from "./env.js";

test("EVENT_TYPES is the server's vocabulary, in its order", async () => {
  const res = await fetch(`${conn.baseUrl}/v1/runs/${await newRun()}/events`, {
    method: "POST",
    headers: { Authorization: `Bearer ${conn.apiKey}`, "Content-Type": "application/json" },
    body: JSON.stringify([{ type: "no.such.type" }]),
  });
  assert.equal(res.status, 422);
  const { error } = (await res.json()) as { error: { code: string; message: string } };
  assert.equal(error.code, "EVENT-UNKNOWN-TYPE");
  const listed = /expected one of (.*) or `custom\.<name>`/.exec(error.message)?.[1];
  assert.ok(listed, error.message);
  assert.deepEqual(listed.split(", "), [...EVENT_TYPES]);
});

// One of each type a producer may send, in an order the server's rules accept. The
// mapped type makes tsc refuse a payload that does not fit its type.
const samples: { [T in Exclude<BuiltinEventType, "plan.decision">]: PayloadOf[T] } = {
  "run.lifecycle": { state: "running", reason: "go" },
  "message.start": { message_id: "m1", role: "assistant" },
  "text.delta": { text: "Hel", message_id: "m1" },
  "reasoning.delta": { text: "thinking", message_id: "m1" },
  "message.end": { message_id: "m1", stop_reason: "end_turn", text: "Hel" },
  "tool.start": { call_id: "c1", tool: "search", input: { q: "x", n: [1, 2.5, null] }, skill_id: "s" },
  "tool.progress": { call_id: "c1", data: { pct: 50 } },
  "tool.end": { call_id: "c1", ok: false, output: "partial", error: { why: "timeout" }, duration_ms: 12, blob_ref: "b" },
  "step.boundary": { step_index: 0, step_kind: "tool-roundtrip", checkpoint_id: "k" },
  "child.spawn": { child_id: "ch1", prompt: "go", tools_allowed: ["search"] },
  "plan.proposal": {
    plan: { id: "p1", steps: [{ id: "s1", title: "Look", intent: "research", est_tools: ["search"], est_cost_usd: 0.25 }], est_total_cost_usd: 0.5 },
  },
  "compaction.start": { reason: "tokens" },
  "compaction.end": { removed: 3, kept: 2, tokens_removed: 100, tokens_kept: 50, reason: "tokens" },
};

test("a sample of every type, typed here, is accepted and read back as sent", async () => {
  const run = await newRun();
  const events = Object.entries(samples).map(([type, payload]) => ({ type, payload }) as NewEvent);
  events.push({ type: "custom.note", payload: { any: ["thing"] } });
  events.push({ type: "run.lifecycle", payload: { state: "error", reason: "done testing" } });
  const p = new Producer({ ...conn, runId: run });
  const got = await p.appendAll(events);
  assert.equal(got.length, events.length);
  const stored = await allEvents(run);
  assert.deepEqual(stored.map((e) => ({ type: e.type, payload: e.payload })), events.map((e) => ({ type: e.type, payload: e.payload ?? {} })));
  assert.ok(isTerminal(stored[stored.length - 1]!));
  assert.deepEqual(
    new Set([...stored.map((e) => e.type), "plan.decision"].filter((t) => !t.startsWith("custom."))),
    new Set(EVENT_TYPES),
    "every built-in type was sampled (plan.decision is the service's own)",
  );
});

test("plan.decision is the service's to write", async () => {
  const p = new Producer({ ...conn, runId: await newRun() });
  await assert.rejects(p.append({ type: "plan.decision", payload: { plan_id: "p", decision: "approved" } }), { code: "EVENT-RESERVED" });
});
