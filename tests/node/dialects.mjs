// Validates an agent-stream SSE "dialect" with the real npm packages of that dialect.
//
// Usage:
//   node dialects.mjs <agui|vercel> <url> <api-key> [--allow-unfinished]
//   node dialects.mjs --self-test
//
// GETs <url> with `Authorization: Bearer <api-key>`, reads the whole SSE body (the stream
// ends when the server closes it), parses the frames and validates them:
//
//   agui   - every data is an event of @ag-ui/core's EventSchemas (`@ag-ui/core/schemas`),
//            carries no property the schema does not describe, and the sequence passes
//            @ag-ui/client's transformChunks + verifyEvents operators. Then the events are
//            folded by the real client (AbstractAgent.runAgent: compatibility boundary,
//            enforceEvents, transformChunks, verifyEvents, defaultApplyEvents); any error
//            or console warning it raises is a failure. The last event must be RUN_FINISHED
//            or RUN_ERROR (unless --allow-unfinished).
//   vercel - header `x-vercel-ai-ui-message-stream: v1`; the last data is `[DONE]` (and only
//            the last); every other data is a chunk of the `ai` package's uiMessageChunkSchema;
//            the package's own parseJsonEventStream sees the same chunks; readUIMessageStream
//            folds them into UIMessage(s) without a UIMessageStreamError; the folded messages
//            pass validateUIMessages; no text/reasoning part is left "streaming" and no tool
//            part "input-streaming"; after an `error` chunk only error/finish-step/finish/abort
//            (useChat stops at an error chunk). The first chunk must be `start` and the last one
//            before [DONE] `finish`, `error` or `abort` (unless --allow-unfinished).
//
// Both: content-type text/event-stream, HTTP 200, every data frame has an `id:` that is a
// non-negative integer and ids never decrease (vercel: the [DONE] frame may omit its id).
// Frames: blank-line separated; `:` comment lines ignored; multi-line data joined by "\n";
// a block with no data line is not a frame (keep-alive); a trailing block with no blank line
// after it is an error.
//
// Prints exactly one JSON line on stdout:
//   {"ok":true,"format":"agui","frames":N,"types":{"RUN_STARTED":1,...},"messages":M}
//   {"ok":false,"error":"..."}                                  (exit code 1)
// `frames` counts data frames (vercel: including [DONE]); `types` counts events / chunks by
// `type` ([DONE] excluded); `messages` is the number of messages the real client folded.
//
// --self-test serves samples/*.sse (listed in samples/manifest.json) from a local HTTP server
// on 127.0.0.1 and checks every valid sample passes and every invalid one fails for the
// expected reason. Ends with "N passed, N failed"; exit 0 only if none failed.
// Env: DIALECTS_TIMEOUT_MS (default 60000) bounds each fetch.

import http from 'node:http';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { from, lastValueFrom, toArray } from 'rxjs';
import { EventSchemas } from '@ag-ui/core/schemas';
import { AbstractAgent, transformChunks, verifyEvents } from '@ag-ui/client';
import {
  uiMessageChunkSchema,
  parseJsonEventStream,
  readUIMessageStream,
  validateUIMessages,
  UIMessageStreamError,
} from 'ai';

const HERE = path.dirname(fileURLToPath(import.meta.url));

class Fail extends Error {}
const fail = (msg) => {
  throw new Fail(msg);
};
const clip = (s, n = 600) => (s.length > n ? s.slice(0, n) + '…' : s);
const show = (v) => clip(typeof v === 'string' ? v : JSON.stringify(v));
const errText = (e) => (e instanceof Error ? e.message : String(e));

// ---------------------------------------------------------------------------------------
// SSE framing (WHATWG "event stream interpretation", plus strictness for tests).

export function parseSse(text) {
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const lines = text.split(/\r\n|\r|\n/);
  // A body that ends with a line terminator yields a final "" element, which is not a line.
  const terminated = lines.length > 0 && lines[lines.length - 1] === '';
  if (terminated) lines.pop();
  const frames = [];
  let cur = null; // { id, event, data: [] , line }
  let lineNo = 0;
  const dispatch = () => {
    if (cur && cur.data.length > 0) {
      frames.push({ id: cur.id, event: cur.event, data: cur.data.join('\n'), line: cur.line });
    }
    cur = null;
  };
  for (const line of lines) {
    lineNo++;
    if (line === '') {
      dispatch();
      continue;
    }
    if (line.startsWith(':')) continue; // comment
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    cur ??= { id: undefined, event: undefined, data: [], line: lineNo };
    switch (field) {
      case 'data':
        cur.data.push(value);
        break;
      case 'id':
        if (!value.includes('\0')) cur.id = value;
        break;
      case 'event':
        cur.event = value;
        break;
      case 'retry':
        break;
      default:
        fail(`SSE line ${lineNo}: unknown field '${clip(field, 40)}'`);
    }
  }
  if (cur && cur.data.length > 0) {
    fail(`SSE: the body ends inside a frame (line ${cur.line}): no blank line after its last data line`);
  }
  return frames;
}

function checkIds(frames, { optional = () => false } = {}) {
  let last = -1;
  frames.forEach((f, i) => {
    if (f.id === undefined) {
      if (optional(f)) return;
      fail(`frame ${i} (line ${f.line}) has no id: line; data=${show(f.data)}`);
    }
    if (!/^\d+$/.test(f.id) || !Number.isSafeInteger(Number(f.id))) {
      fail(`frame ${i} (line ${f.line}) id '${clip(f.id, 40)}' is not a non-negative integer`);
    }
    const n = Number(f.id);
    if (n < last) fail(`frame ${i} (line ${f.line}) id ${n} decreases (previous ${last})`);
    last = n;
  });
}

function countTypes(items) {
  const types = {};
  for (const it of items) types[it.type] = (types[it.type] ?? 0) + 1;
  return types;
}

function parseJsonFrame(f, i) {
  try {
    return JSON.parse(f.data);
  } catch (e) {
    fail(`frame ${i} (line ${f.line}) data is not JSON (${errText(e)}): ${show(f.data)}`);
  }
}

// Runs fn with console.warn/error captured; returns [result, captured lines].
async function capturingConsole(fn) {
  const seen = [];
  const { warn, error } = console;
  console.warn = (...a) => seen.push(a.map((x) => (x instanceof Error ? x.message : typeof x === 'string' ? x : JSON.stringify(x))).join(' '));
  console.error = console.warn;
  try {
    return [await fn(), seen];
  } finally {
    console.warn = warn;
    console.error = error;
  }
}

// ---------------------------------------------------------------------------------------
// AG-UI

const AGUI_SCHEMA_BY_TYPE = new Map(EventSchemas.options.map((o) => [o.shape.type.value, o]));

class ReplayAgent extends AbstractAgent {
  constructor(events, threadId) {
    super({ threadId });
    this.events = events;
  }
  run() {
    return from(this.events);
  }
}

async function validateAgui(res, frames, opts) {
  checkIds(frames);
  const events = frames.map((f, i) => {
    const ev = parseJsonFrame(f, i);
    const r = EventSchemas.safeParse(ev);
    if (!r.success) {
      fail(`event ${i} (id ${f.id}) fails @ag-ui/core EventSchemas: ${show(ev)} :: ${show(r.error.issues)}`);
    }
    // The schemas are loose (unknown keys pass), but the real client strips and warns about
    // them (enforceEvents), so an encoder must not emit them.
    const schema = AGUI_SCHEMA_BY_TYPE.get(ev.type);
    const extra = Object.keys(ev).filter((k) => !(k in schema.shape));
    if (extra.length) {
      fail(`event ${i} (id ${f.id}) ${ev.type} has properties the schema does not describe: ${extra.join(', ')} :: ${show(ev)}`);
    }
    return ev;
  });
  if (events.length === 0) fail('no events');

  // The ordering rules, exactly as the client applies them: chunk expansion, then the verifier.
  try {
    await lastValueFrom(from(events).pipe(transformChunks(false), verifyEvents(false), toArray()));
  } catch (e) {
    fail(`@ag-ui/client verifyEvents: ${errText(e)}`);
  }

  const lastType = events[events.length - 1].type;
  if (!opts.allowUnfinished && lastType !== 'RUN_FINISHED' && lastType !== 'RUN_ERROR') {
    fail(`the stream ended with ${lastType}; the last event must be RUN_FINISHED or RUN_ERROR`);
  }

  // Fold with the real client; it reports deviations on the console, which we treat as errors.
  const agent = new ReplayAgent(events, events[0].threadId);
  const [outcome, warnings] = await capturingConsole(async () => {
    try {
      await agent.runAgent({ runId: events[0].runId });
      return null;
    } catch (e) {
      return e;
    }
  });
  if (outcome) fail(`@ag-ui/client runAgent failed: ${errText(outcome)}`);
  if (warnings.length) fail(`@ag-ui/client warned while applying the events: ${clip(warnings.join(' | '))}`);

  return { types: countTypes(events), messages: agent.messages.length };
}

// ---------------------------------------------------------------------------------------
// Vercel AI SDK UI message stream v1

// uiMessageChunkSchema is a plain (non-discriminated) union, so zod reports every member's
// complaint; keep only the members whose `type` matched.
function narrowUnionIssues(error, type) {
  const issues = error?.issues;
  if (!Array.isArray(issues)) return errText(error);
  if (issues.length === 1 && issues[0].code === 'invalid_union' && Array.isArray(issues[0].errors)) {
    const same = issues[0].errors.filter((branch) => !branch.some((i) => i.path?.[0] === 'type'));
    return same.length ? same.flat() : `unknown chunk type ${JSON.stringify(type)}`;
  }
  return issues;
}

async function validateVercel(res, frames, bodyBytes, opts) {
  const hdr = res.headers.get('x-vercel-ai-ui-message-stream');
  if (hdr !== 'v1') fail(`header x-vercel-ai-ui-message-stream is ${JSON.stringify(hdr)}, expected "v1"`);
  if (frames.length === 0) fail('no frames');
  const isDone = (f) => f.data === '[DONE]';
  checkIds(frames, { optional: isDone });
  if (!isDone(frames[frames.length - 1])) {
    fail(`the last data is ${show(frames[frames.length - 1].data)}, expected [DONE]`);
  }
  const chunkFrames = frames.slice(0, -1);
  const early = chunkFrames.findIndex(isDone);
  if (early >= 0) fail(`[DONE] at frame ${early}, before the end of the stream`);

  const schema = uiMessageChunkSchema();
  const chunks = [];
  for (const [i, f] of chunkFrames.entries()) {
    const value = parseJsonFrame(f, i);
    const r = await schema.validate(value);
    if (!r.success) {
      fail(`chunk ${i} (id ${f.id}) fails ai uiMessageChunkSchema: ${show(value)} :: ${show(narrowUnionIssues(r.error, value?.type))}`);
    }
    chunks.push(r.value);
  }

  // The same bytes through the package's own SSE + JSON parser, as DefaultChatTransport does.
  const parsed = [];
  const reader = parseJsonEventStream({ stream: new Response(bodyBytes).body, schema: uiMessageChunkSchema }).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (!value.success) fail(`ai parseJsonEventStream rejected a chunk: ${errText(value.error)}`);
    parsed.push(value.value);
  }
  if (parsed.length !== chunks.length || parsed.some((c, i) => c.type !== chunks[i].type)) {
    fail(`ai parseJsonEventStream saw ${parsed.length} chunks (${parsed.map((c) => c.type).join(',')}), this parser ${chunks.length}`);
  }

  if (!opts.allowUnfinished) {
    if (chunks.length === 0 || chunks[0].type !== 'start') {
      fail(`the first chunk is ${chunks[0]?.type ?? '(none)'}, expected start`);
    }
    const lastType = chunks[chunks.length - 1].type;
    if (!['finish', 'error', 'abort'].includes(lastType)) {
      fail(`the last chunk before [DONE] is ${lastType}, expected finish, error or abort`);
    }
  }

  // useChat (AbstractChat) rethrows an `error` chunk from onError and stops consuming: any
  // content after it would never reach the UI.
  const firstError = chunks.findIndex((c) => c.type === 'error');
  if (firstError >= 0) {
    const after = chunks.slice(firstError + 1).find((c) => !['error', 'finish-step', 'finish', 'abort'].includes(c.type));
    if (after) fail(`chunk ${after.type} after an error chunk (${firstError}); useChat stops at the error chunk`);
  }

  // Fold into UIMessage(s) with the package's reader. Errors carried by `error` chunks are the
  // stream's own content; anything else (UIMessageStreamError: text-delta without text-start,
  // tool output without tool input, ...) is a protocol violation.
  const errorTexts = chunks.filter((c) => c.type === 'error').map((c) => c.errorText);
  const problems = [];
  const messages = new Map();
  const stream = new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(ch);
      c.close();
    },
  });
  for await (const snapshot of readUIMessageStream({
    stream,
    onError: (e) => {
      if (UIMessageStreamError.isInstance(e) || !errorTexts.includes(e?.message)) problems.push(e);
    },
  })) {
    messages.set(snapshot.id, snapshot);
  }
  if (problems.length) fail(`ai readUIMessageStream: ${problems.map(errText).join(' | ')}`);

  const folded = [...messages.values()];
  for (const m of folded) {
    for (const [pi, p] of m.parts.entries()) {
      if ((p.type === 'text' || p.type === 'reasoning') && p.state !== 'done') {
        fail(`message ${m.id} part ${pi} (${p.type}) was never ended (state ${p.state})`);
      }
      if ((p.type.startsWith('tool-') || p.type === 'dynamic-tool') && p.state === 'input-streaming') {
        fail(`message ${m.id} part ${pi} (${p.type} ${p.toolCallId}) never got tool-input-available`);
      }
    }
  }
  if (folded.length) {
    try {
      await validateUIMessages({ messages: folded });
    } catch (e) {
      fail(`ai validateUIMessages on the folded messages: ${errText(e)}`);
    }
  }
  return { types: countTypes(chunks), messages: folded.length };
}

// ---------------------------------------------------------------------------------------

export async function check(format, url, key, opts = {}) {
  if (format !== 'agui' && format !== 'vercel') fail(`unknown format '${format}' (agui|vercel)`);
  const timeoutMs = Number(process.env.DIALECTS_TIMEOUT_MS ?? 60000);
  let res, bodyBytes;
  try {
    res = await fetch(url, {
      headers: { Authorization: `Bearer ${key}`, Accept: 'text/event-stream' },
      signal: AbortSignal.timeout(timeoutMs),
    });
    bodyBytes = new Uint8Array(await res.arrayBuffer());
  } catch (e) {
    fail(`GET ${url}: ${errText(e)}${e?.cause ? ` (${errText(e.cause)})` : ''}`);
  }
  const text = new TextDecoder('utf-8', { fatal: true }).decode(bodyBytes);
  if (res.status !== 200) fail(`GET ${url}: HTTP ${res.status}: ${clip(text, 300)}`);
  const ct = res.headers.get('content-type') ?? '';
  if (!/^text\/event-stream\b/i.test(ct)) fail(`content-type is '${ct}', expected text/event-stream`);
  const frames = parseSse(text);
  const r = format === 'agui' ? await validateAgui(res, frames, opts) : await validateVercel(res, frames, bodyBytes, opts);
  return { ok: true, format, frames: frames.length, types: r.types, messages: r.messages };
}

// ---------------------------------------------------------------------------------------
// Self-test: samples/manifest.json lists { file, format, expect, [noStreamHeader], [key] }.
// expect is "ok" or a substring the error must contain.

async function selfTest() {
  const dir = path.join(HERE, 'samples');
  const manifest = JSON.parse(readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
  const KEY = 'self-test-key';
  const server = http.createServer((req, res) => {
    const u = new URL(req.url, 'http://x');
    const entry = manifest[Number(u.searchParams.get('case'))];
    if (req.headers.authorization !== `Bearer ${KEY}`) {
      res.writeHead(401, { 'content-type': 'text/plain' });
      res.end('unauthorized');
      return;
    }
    if (!entry) {
      res.writeHead(404);
      res.end();
      return;
    }
    const headers = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };
    if (entry.format === 'vercel' && !entry.noStreamHeader) headers['x-vercel-ai-ui-message-stream'] = 'v1';
    res.writeHead(200, headers);
    // Write in small pieces, so frames straddle reads as they would on a real connection.
    const body = readFileSync(path.join(dir, entry.file));
    let off = 0;
    const step = () => {
      if (off >= body.length) return res.end();
      res.write(body.subarray(off, off + 97));
      off += 97;
      setImmediate(step);
    };
    step();
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address();
  let passed = 0;
  let failed = 0;
  try {
    for (const [i, entry] of manifest.entries()) {
      const url = `http://127.0.0.1:${port}/stream?case=${i}`;
      let got;
      try {
        got = await check(entry.format, url, entry.key ?? KEY, { allowUnfinished: !!entry.allowUnfinished });
      } catch (e) {
        if (!(e instanceof Fail)) throw e;
        got = { ok: false, error: e.message };
      }
      const good = entry.expect === 'ok' ? got.ok : !got.ok && got.error.includes(entry.expect);
      const label = `${entry.format} ${entry.file}${entry.noStreamHeader ? ' (no stream header)' : ''}${entry.key ? ' (wrong key)' : ''}`;
      if (good) {
        passed++;
        console.log(`ok   ${label}: ${got.ok ? JSON.stringify(got) : got.error}`);
      } else {
        failed++;
        console.log(`FAIL ${label}: expected ${entry.expect === 'ok' ? 'ok' : `an error containing ${JSON.stringify(entry.expect)}`}, got ${JSON.stringify(got)}`);
      }
    }
  } finally {
    server.close();
  }
  console.log(`dialects: ${passed} passed, ${failed} failed`);
  return failed === 0 && passed > 0;
}

// ---------------------------------------------------------------------------------------

const argv = process.argv.slice(2);
if (argv[0] === '--self-test') {
  const ok = await selfTest();
  process.exit(ok ? 0 : 1);
} else {
  const flags = argv.filter((a) => a.startsWith('--'));
  const [format, url, key] = argv.filter((a) => !a.startsWith('--'));
  let out;
  try {
    if (!format || !url || key === undefined) {
      fail('usage: node dialects.mjs <agui|vercel> <url> <api-key> [--allow-unfinished] | --self-test');
    }
    out = await check(format, url, key, { allowUnfinished: flags.includes('--allow-unfinished') });
  } catch (e) {
    out = { ok: false, error: e instanceof Fail ? e.message : `internal error: ${e?.stack ?? e}` };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(out.ok ? 0 : 1);
}
