// Following a run over SSE and GraphQL: live, across a SIGKILL and restart of the
// service, and after the run has ended; every event exactly once, the same events as a
// follower that never disconnected.

import assert from "node:assert/strict";
import { test } from "node:test";
import { type StoredEvent, followRun } from "../src/index.js";
import { followRunGraphQL } from "../src/graphql.js";
import { OwnServer, allEvents, append, conn, delta, newRun, noServerBinary, until } from "./env.js";

type Follow = (o: { baseUrl: string; apiKey: string; runId: string; afterSeq?: number }) => AsyncGenerator<StoredEvent>;

const transports: [string, Follow][] = [
  ["SSE", followRun],
  ["GraphQL", followRunGraphQL],
];

function collect(it: AsyncGenerator<StoredEvent>): { events: StoredEvent[]; done: Promise<void> } {
  const events: StoredEvent[] = [];
  const done = (async () => {
    for await (const e of it) events.push(e);
  })();
  return { events, done };
}

const seqs = (es: StoredEvent[]) => es.map((e) => e.seq);
const range = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

for (const [name, follow] of transports) {
  test(`${name}: follows a run live, across a service SIGKILL and restart, each event once`, { skip: noServerBinary }, async () => {
    const run = await newRun();
    await append(run, [{ type: "run.lifecycle", payload: { state: "running" } }, delta("a")]);
    const server = await OwnServer.start();
    try {
      const cut = collect(follow({ baseUrl: server.baseUrl, apiKey: conn.apiKey, runId: run }));
      const steady = collect(follow({ ...conn, runId: run }));
      await until("the history", () => cut.events.length >= 2);
      for (let i = 0; i < 5; i++) await append(run, [delta(`live ${i}`)]);
      await until("the live events", () => cut.events.length >= 7);
      await server.kill();
      for (let i = 0; i < 5; i++) await append(run, [delta(`while down ${i}`)]);
      await server.restart();
      for (let i = 0; i < 5; i++) await append(run, [delta(`after ${i}`)]);
      const last = await append(run, [{ type: "run.lifecycle", payload: { state: "done" } }]);
      await Promise.all([cut.done, steady.done]);
      assert.deepEqual(seqs(steady.events), range(last), "the never-disconnected follower");
      assert.deepEqual(seqs(cut.events), range(last), "every event exactly once across the restart");
      assert.deepEqual(cut.events.map((e) => [e.type, e.payload]), steady.events.map((e) => [e.type, e.payload]));
      assert.deepEqual(
        cut.events.map((e) => e.id),
        (await allEvents(run)).map((e) => e.id),
        "the stored events",
      );
    } finally {
      await server.kill();
    }
  });

  test(`${name}: after the run has ended, reads it whole or from a saved seq, then ends`, async () => {
    const run = await newRun();
    const last = await append(run, [
      { type: "run.lifecycle", payload: { state: "running" } },
      delta("x"),
      delta("y"),
      { type: "run.lifecycle", payload: { state: "aborted", reason: "stop" } },
    ]);
    const whole = collect(follow({ ...conn, runId: run }));
    await whole.done;
    assert.deepEqual(seqs(whole.events), range(last));
    const rest = collect(follow({ ...conn, runId: run, afterSeq: 2 }));
    await rest.done;
    assert.deepEqual(seqs(rest.events), [3, 4]);
    const none = collect(follow({ ...conn, runId: run, afterSeq: last }));
    await none.done;
    assert.deepEqual(none.events, []);
  });
}

test("SSE: a refusal is thrown with its code, not retried", async () => {
  const it = followRun({ ...conn, runId: "01J00000000000000000000000" });
  await assert.rejects(it.next(), { name: "AgentStreamError", code: "RUN-NOT-FOUND", status: 404 });
  const bad = followRun({ ...conn, apiKey: "ask_000000000000_" + "0".repeat(48), runId: await newRun() });
  await assert.rejects(bad.next(), { code: "AUTH-INVALID", status: 401 });
});

test("SSE: breaking out of the loop closes the stream", async () => {
  const run = await newRun();
  await append(run, [delta("one"), delta("two")]);
  for await (const e of followRun({ ...conn, runId: run })) {
    assert.equal(e.seq, 1);
    break;
  }
  const ctl = new AbortController();
  const got: number[] = [];
  const done = (async () => {
    for await (const e of followRun({ ...conn, runId: run, signal: ctl.signal })) got.push(e.seq);
  })();
  await until("both events", () => got.length === 2);
  ctl.abort();
  await done;
  assert.deepEqual(got, [1, 2]);
});
