// The streaming producer: one long-lived streaming append per run, each event resolved
// with its seq as its group commits; a refused line fails it and every line after it.

import assert from "node:assert/strict";
import { test } from "node:test";
import { AgentStreamError } from "../src/index.js";
import { StreamProducer } from "../src/stream.js";
import { allEvents, conn, delta, newRun } from "./env.js";

test("a streaming producer's events are acknowledged with their seqs, in order", async () => {
  const run = await newRun();
  const p = new StreamProducer({ ...conn, runId: run, keyPrefix: "s1" });
  const first = await p.append({ type: "run.lifecycle", payload: { state: "running" } });
  assert.deepEqual(first, { seq: 1, key: "s1:1", replayed: false }, "acknowledged while the stream is open");
  const rest = await Promise.all(Array.from({ length: 200 }, (_, i) => p.append(delta(`t${i}`))));
  assert.deepEqual(rest.map((a) => a.seq), Array.from({ length: 200 }, (_, i) => i + 2));
  assert.deepEqual(await p.close(), { lines: 201, events: 201 });
  const stored = await allEvents(run);
  assert.deepEqual(stored.slice(1).map((e) => (e.payload as { text: string }).text), rest.map((_, i) => `t${i}`));
  // The same events again under the same prefix (a producer restarted after a cut):
  // every one is answered from the log, nothing is written.
  const again = new StreamProducer({ ...conn, runId: run, keyPrefix: "s1" });
  const replay = await Promise.all([
    again.append({ type: "run.lifecycle", payload: { state: "running" } }),
    ...Array.from({ length: 200 }, (_, i) => again.append(delta(`t${i}`))),
  ]);
  assert.ok(replay.every((a, i) => a.replayed && a.seq === i + 1));
  assert.deepEqual(await again.close(), { lines: 201, events: 0 });
  assert.equal((await allEvents(run)).length, 201);
});

test("a refused line fails with its code and line, and the lines after it too", async () => {
  const run = await newRun();
  const p = new StreamProducer({ ...conn, runId: run });
  const ok = await p.append({ type: "run.lifecycle", payload: { state: "running" } });
  assert.equal(ok.seq, 1);
  const bad = p.append({ type: "tool.end", payload: { call_id: "nope", ok: true } });
  const after = p.append(delta("never"));
  for (const r of [bad, after]) {
    await assert.rejects(r, (e: unknown) => {
      assert.ok(e instanceof AgentStreamError);
      assert.equal(e.code, "TOOL-UNKNOWN-CALL");
      assert.equal((e as AgentStreamError & { line?: number }).line, 2);
      return true;
    });
  }
  await assert.rejects(p.close(), { code: "TOOL-UNKNOWN-CALL" });
  assert.equal((await allEvents(run)).length, 1, "nothing after the refused line was written");
});

test("a run of another tenant, or none, is refused before the first line", async () => {
  const p = new StreamProducer({ ...conn, runId: "01M82EFA61SA47S6546MJGZGF7" });
  await assert.rejects(p.append(delta("x")), { code: "RUN-NOT-FOUND", status: 404 });
  await assert.rejects(p.close(), { code: "RUN-NOT-FOUND" });
});
