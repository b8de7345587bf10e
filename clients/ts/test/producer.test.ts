// The producer: batches, idempotency keys, and retries of 429 and 503 after Retry-After.

import assert from "node:assert/strict";
import { test } from "node:test";
import { AgentStreamError, Producer } from "../src/index.js";
import { OwnServer, allEvents, conn, delta, newRun, noServerBinary } from "./env.js";

test("events queued together share a request, in order, each with a key", async () => {
  const run = await newRun();
  const p = new Producer({ ...conn, runId: run, keyPrefix: "p1" });
  const got = await Promise.all(Array.from({ length: 250 }, (_, i) => p.append(delta(`t${i}`))));
  assert.deepEqual(got.map((a) => a.seq), Array.from({ length: 250 }, (_, i) => i + 1));
  assert.ok(p.requests <= 2, `${p.requests} requests for 250 events`);
  const stored = await allEvents(run);
  assert.deepEqual(stored.map((e) => (e.payload as { text: string }).text), got.map((_, i) => `t${i}`));
  // A second producer with the same prefix re-sends the same keyed events: nothing new.
  const again = new Producer({ ...conn, runId: run, keyPrefix: "p1", maxBatch: 250 });
  const replay = await again.appendAll(Array.from({ length: 250 }, (_, i) => delta(`t${i}`)));
  assert.ok(replay.every((a, i) => a.replayed && a.seq === i + 1));
  assert.equal((await allEvents(run)).length, 250);
});

test("a refused batch fails its events with the server's code and index", async () => {
  const run = await newRun();
  const p = new Producer({ ...conn, runId: run });
  const [ok] = await Promise.all([p.append(delta("fine"))]);
  assert.equal(ok.seq, 1);
  const a = p.append({ type: "tool.end", payload: { call_id: "nope", ok: true } });
  await assert.rejects(a, (e: unknown) => {
    assert.ok(e instanceof AgentStreamError);
    assert.equal(e.code, "TOOL-UNKNOWN-CALL");
    assert.equal(e.status, 422);
    assert.equal(e.index, 0);
    return true;
  });
  await p.flush();
  assert.equal((await allEvents(run)).length, 1, "nothing of the refused batch was written");
});

test("503 after the batch was written: retried after Retry-After, stored once", async () => {
  const run = await newRun();
  let calls = 0;
  const waits: number[] = [];
  let at = 0;
  // Between the producer and the real service: the first answer is lost and replaced by
  // a 503 (as when a connection breaks while the commit lands).
  const flaky: typeof fetch = async (input, init) => {
    const res = await fetch(input, init);
    calls++;
    if (calls > 1) waits.push(Date.now() - at);
    at = Date.now();
    if (calls === 1) return new Response('{"error":{"code":"SERVICE-UNAVAILABLE","message":"lost"}}', { status: 503, headers: { "Retry-After": "1" } });
    return res;
  };
  const p = new Producer({ ...conn, runId: run, fetch: flaky });
  const got = await p.appendAll([delta("a"), delta("b"), delta("c")]);
  assert.deepEqual(got.map((a) => [a.seq, a.replayed]), [[1, true], [2, true], [3, true]]);
  assert.equal(calls, 2);
  assert.ok(waits[0]! >= 900, `waited ${waits[0]} ms for Retry-After: 1`);
  assert.equal((await allEvents(run)).length, 3, "each event once");
});

test("429 from the service's rate limit: retried after Retry-After until stored", { skip: noServerBinary }, async () => {
  const server = await OwnServer.start({ AGENT_STREAM_APPEND_RATE: "2" }); // bursts of 4
  try {
    const run = await newRun();
    const statuses: number[] = [];
    const counting: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      statuses.push(res.status);
      return res;
    };
    // One event per request: 8 requests against a burst of 4.
    const p = new Producer({ baseUrl: server.baseUrl, apiKey: conn.apiKey, runId: run, maxBatch: 1, fetch: counting });
    const got = [];
    for (let i = 0; i < 8; i++) got.push(p.append(delta(`r${i}`)));
    const stored = await Promise.all(got);
    assert.deepEqual(stored.map((a) => a.seq), [1, 2, 3, 4, 5, 6, 7, 8]);
    assert.ok(statuses.includes(429), `rate limited at least once: ${statuses}`);
    assert.equal(statuses.filter((s) => s === 201).length, 8);
    assert.equal((await allEvents(run)).length, 8);
  } finally {
    await server.kill();
  }
});

test("across a service SIGKILL and restart, the producer keeps retrying and loses nothing", { skip: noServerBinary }, async () => {
  const server = await OwnServer.start();
  try {
    const run = await newRun();
    const p = new Producer({ baseUrl: server.baseUrl, apiKey: conn.apiKey, runId: run, retryDelayMs: 50 });
    const first = await p.appendAll([delta("1"), delta("2")]);
    await server.kill();
    const pending = p.appendAll([delta("3"), delta("4")]);
    await new Promise((r) => setTimeout(r, 300));
    await server.restart();
    const second = await pending;
    assert.deepEqual([...first, ...second].map((a) => a.seq), [1, 2, 3, 4]);
    assert.equal((await allEvents(run)).length, 4);
  } finally {
    await server.kill();
  }
});
