// The run inspector: the tenant's runs (live), a run's timeline (live, resumable), replay
// of a stored run or of a JSONL export from disk, and the run's controls. Everything it
// shows comes folded by the server (see view.js); this file moves views and updates
// between the API and the renderer.

import { GqlSocket } from './gqlws.js';
import { RUN_VIEW, Renderer, applyUpdate, camel, terminal, word } from './view.js';

const KEY = 'agent-stream-key';
const $ = (id) => document.getElementById(id);

// What the tests (and a curious reader, in the console) can look at.
const probe = {
  updates: 0, // updates applied
  gaps: [], // [expected, got] when an update skipped a seq
  repeats: [], // seqs received again after they were complete
  reconnects: 0,
  mode: 'none',
  settled: () => Boolean(current.renderer?.settled()),
  seq: () => current.view?.seq ?? null,
};
window.__inspector = probe;

// ---- the key -----------------------------------------------------------------------

/** Takes `#key=...` into session storage and out of the address bar. */
function takeKey() {
  const m = location.hash.match(/(?:^#|&)key=([^&]*)/);
  if (m) {
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(history.state, '', location.pathname + location.search);
  }
  return sessionStorage.getItem(KEY);
}

function key() {
  return sessionStorage.getItem(KEY) ?? '';
}

function signOut(message) {
  sessionStorage.removeItem(KEY);
  socket?.close();
  socket = null;
  showLogin(message);
}

function showLogin(message) {
  $('app').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message ?? '';
  $('key-input').focus();
}

$('login-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const k = $('key-input').value.trim();
  if (!k) return;
  sessionStorage.setItem(KEY, k);
  $('key-input').value = '';
  start();
});
$('sign-out').addEventListener('click', () => signOut('Signed out.'));

// ---- the API -----------------------------------------------------------------------

class ApiError extends Error {}

async function gql(query, variables = {}) {
  const r = await fetch('/graphql', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key()}` },
    body: JSON.stringify({ query, variables }),
  });
  if (r.status === 401) {
    signOut('The key was refused.');
    throw new ApiError('the key was refused');
  }
  const body = await r.json();
  if (body.errors?.length) throw new ApiError(body.errors.map((e) => e.message).join('; '));
  return body.data;
}

function say(text, error = false) {
  const s = $('status');
  s.textContent = text;
  s.classList.toggle('error', error);
}

let socket = null;

function connection(state) {
  const c = $('connection');
  c.textContent = { open: 'live', connecting: 'connecting…', closed: 'reconnecting…', refused: 'key refused' }[state] ?? state;
  c.className = `badge conn-${state}`;
  if (state === 'closed') probe.reconnects += 1;
  if (state === 'refused') signOut('The key was refused.');
}

// ---- the runs list -----------------------------------------------------------------

const RUN_FIELDS = 'id parentRunId createdAt updatedAt lastSeq state';
const runs = new Map();

function drawRuns() {
  const ul = $('runs');
  const sorted = [...runs.values()].sort((a, b) => (a.id < b.id ? 1 : -1)); // ULIDs: newest first
  const open = current.runId;
  ul.replaceChildren(
    ...sorted.map((r) => {
      const li = document.createElement('li');
      const a = document.createElement('a');
      a.href = `/ui/runs/${r.id}`;
      a.dataset.run = r.id;
      if (r.id === open) a.setAttribute('aria-current', 'page');
      const id = document.createElement('span');
      id.className = 'run-id';
      id.textContent = r.id;
      const st = document.createElement('span');
      st.className = `badge state-${word(r.state)}`;
      st.textContent = word(r.state) || 'new';
      const info = document.createElement('span');
      info.className = 'run-info';
      info.textContent = `${r.lastSeq} events · ${new Date(r.createdAt).toLocaleString()}`;
      a.append(id, st, info);
      li.append(a);
      return li;
    }),
  );
  $('runs-empty').hidden = runs.size > 0;
}

async function loadRuns() {
  try {
    const d = await gql(`{ runs(first: 100) { nodes { ${RUN_FIELDS} } } }`);
    // The list may answer after the subscription's first items: keep the newer row.
    for (const r of d.runs.nodes) {
      const had = runs.get(r.id);
      if (!had || had.lastSeq <= r.lastSeq) runs.set(r.id, r);
    }
    drawRuns();
  } catch (e) {
    say(`Could not list the runs: ${e.message}`, true);
  }
}

function followRuns() {
  socket.subscribe(
    `subscription { runsActivity { kind run { ${RUN_FIELDS} } } }`,
    () => {
      // runsActivity starts with what moved in the 5 s before it began: read the list
      // again at every (re)start so nothing made while the socket was away is missing.
      loadRuns();
      return {};
    },
    {
      onNext: (d) => {
        const r = d.runsActivity.run;
        runs.set(r.id, r);
        drawRuns();
        if (r.id === current.runId) drawHeader();
      },
    },
  );
}

// ---- one run -----------------------------------------------------------------------

const current = {
  runId: null,
  view: null,
  renderer: null,
  stop: null, // stops the live subscription or the replay
  mode: 'none', // live | replay | file
  done: 0, // every update of this seq and before has arrived
  last: 0, // seq of the last update
  times: new Map(),
  file: null, // a folded file: {initial, events, updates}
};

function resetTracking(seq) {
  current.done = seq;
  current.last = seq;
}

/** Applies one update from the subscription and keeps the resume point. */
function onUpdate(u) {
  u = camel(u);
  if (String(u.kind).toUpperCase() === 'SNAPSHOT') {
    current.view = u.view;
    resetTracking(u.view.seq);
  } else if (current.view) {
    if (u.seq <= current.done) probe.repeats.push(u.seq);
    if (u.seq > current.last + 1) probe.gaps.push([current.last + 1, u.seq]);
    if (u.seq > current.last) {
      current.done = current.last;
      current.last = u.seq;
    }
    current.view = applyUpdate(current.view, u);
  } else {
    return;
  }
  probe.updates += 1;
  show();
}

function show() {
  current.renderer.show(current.view);
  drawHeader();
}

function timeOf(seq) {
  if (current.times.has(seq)) return Promise.resolve(current.times.get(seq));
  if (current.mode === 'file' || !current.runId) return Promise.resolve(null);
  return gql('query($r: ID!, $a: Int) { events(runId: $r, afterSeq: $a, first: 1) { nodes { seq ts } } }', {
    r: current.runId,
    a: seq - 1,
  })
    .then((d) => {
      const ts = d.events.nodes[0]?.ts ?? null;
      current.times.set(seq, ts);
      return ts;
    })
    .catch(() => null);
}

function controlsOn() {
  return current.mode === 'live';
}

function newRenderer() {
  current.renderer = new Renderer($('timeline'), {
    timeOf,
    controls: controlsOn,
    onDecide: (what) => control(what === 'approve' ? 'approvePlan' : 'rejectPlan'),
  });
}

function stopRun() {
  current.stop?.();
  current.stop = null;
  current.view = null;
  current.times = new Map();
}

/** Follows a run live: the view now, then every update; resumes after `done`. */
function openLive(runId) {
  stopRun();
  current.mode = probe.mode = 'live';
  newRenderer();
  liveSub(runId);
}

function liveSub(runId) {
  current.stop = socket.subscribe(
    RUN_VIEW,
    // First the whole view; after a dropped socket or a restarted service, the updates
    // after the last seq whose updates all arrived (the server checks that cursor).
    () => (current.view ? { runId, afterSeq: current.done, snapshot: false } : { runId, afterSeq: null, snapshot: true }),
    {
      onNext: (d) => onUpdate(d.runView),
      onError: (errors) => say(`The run's stream failed: ${errors.map?.((e) => e.message).join('; ') ?? errors}`, true),
      onComplete: () => {
        // A stream completes after the run's end; anything else (a server going
        // down gracefully) is resumed like a dropped socket.
        const again = () => current.runId === runId && current.mode === 'live' && !terminal(current.view?.lifecycle.state);
        if (again()) setTimeout(() => again() && liveSub(runId), 500);
        drawHeader();
      },
    },
  );
}

function drawHeader() {
  const v = current.view;
  const run = runs.get(current.runId);
  const state = word(v?.lifecycle.state ?? run?.state);
  $('run-title').textContent = current.mode === 'file' ? `File: ${current.file?.name ?? ''}` : current.runId ?? '';
  const badge = $('run-state');
  badge.textContent = state || 'new';
  badge.className = `badge state-${state}`;
  $('run-seq').textContent = v ? `seq ${v.seq}${current.mode === 'live' ? '' : ` of ${lastSeq()}`}` : '';
  $('mode').textContent = { live: 'live', replay: 'replay', file: 'file replay' }[current.mode] ?? '';
  const live = current.mode === 'live';
  $('pause-run').hidden = !(live && state === 'running');
  $('resume-run').hidden = !(live && state === 'paused');
  $('abort-run').hidden = !(live && state && !terminal(state));
  $('go-live').hidden = live || current.mode === 'file';
}

async function control(mutation) {
  const reasons = { abortRun: 'aborted from the inspector' };
  try {
    await gql(`mutation($r: ID!, $why: String) { ${mutation}(runId: $r, reason: $why) { id state } }`, {
      r: current.runId,
      why: reasons[mutation] ?? null,
    });
    say(`${mutation.replace(/([A-Z])/g, ' $1').toLowerCase()}: done`);
  } catch (e) {
    say(`${mutation} failed: ${e.message}`, true);
  }
}

$('pause-run').addEventListener('click', () => control('pauseRun'));
$('resume-run').addEventListener('click', () => control('resumeRun'));
$('abort-run').addEventListener('click', () => {
  if (confirm('Abort this run? It cannot be resumed.')) control('abortRun');
});
$('go-live').addEventListener('click', () => current.runId && openLive(current.runId));

// ---- replay ------------------------------------------------------------------------

const replay = { at: 0, playing: false, buffer: [], abort: null, timer: null };

function lastSeq() {
  if (current.mode === 'file') return current.file?.events.length ?? 0;
  return runs.get(current.runId)?.lastSeq ?? current.view?.seq ?? 0;
}

function speed() {
  return Number($('speed').value) || 1;
}

/** Moves the replay's clock to `seq`: the buffered updates up to it are applied. */
function advance(seq) {
  replay.at = Math.max(replay.at, seq);
  let n = 0;
  while (replay.buffer.length && replay.buffer[0].seq <= replay.at) {
    onUpdate(replay.buffer.shift());
    n += 1;
  }
  $('replay-at').value = String(replay.at);
  if (!n) drawHeader();
}

/**
 * Replays a stored run from `from`: the view at `from` and every later update come at
 * once from `runView` (the server's fold), and the replay route's paced SSE stream is
 * the clock that releases them, one event at a time, at the chosen speed.
 */
function openReplay(from) {
  stopRun();
  stopClock();
  current.mode = probe.mode = 'replay';
  newRenderer();
  replay.buffer = [];
  replay.at = from;
  const runId = current.runId;
  // What arrived (applied or buffered): a dropped socket resumes after it.
  const recv = { started: false, done: from, last: from };
  const stopSub = socket.subscribe(
    RUN_VIEW,
    () => {
      if (recv.started) return { runId, afterSeq: recv.done, snapshot: false };
      recv.started = true;
      return { runId, afterSeq: from, snapshot: true };
    },
    {
      onNext: (d) => {
        const u = camel(d.runView);
        if (u.seq > recv.last) {
          recv.done = recv.last;
          recv.last = u.seq;
        }
        if (String(u.kind).toUpperCase() === 'SNAPSHOT') onUpdate(u);
        else if (u.seq <= replay.at) onUpdate(u);
        else replay.buffer.push(u);
      },
      onError: (e) => say(`Replay failed: ${JSON.stringify(e)}`, true),
    },
  );
  current.stop = () => {
    stopSub();
    stopClock();
  };
  play(true);
}

function stopClock() {
  replay.abort?.abort();
  replay.abort = null;
  clearTimeout(replay.timer);
  replay.timer = null;
}

/** Starts (or restarts at a new speed) the clock from the replay's position. */
function play(on) {
  replay.playing = on;
  $('play').textContent = on ? 'Pause' : 'Play';
  $('play').setAttribute('aria-pressed', String(on));
  stopClock();
  if (!on) return;
  if (current.mode === 'file') return fileTick();
  if (current.mode !== 'replay') return;
  const ctl = new AbortController();
  replay.abort = ctl;
  sseClock(current.runId, replay.at, speed(), ctl.signal).catch((e) => {
    if (e.name !== 'AbortError') say(`Replay stopped: ${e.message}`, true);
  });
}

/** Reads the replay route's SSE with fetch (a header for the key, no key in the URL). */
async function sseClock(runId, after, pace, signal) {
  const r = await fetch(`/v1/runs/${encodeURIComponent(runId)}/replay?speed=${pace}&after_seq=${after}`, {
    headers: { authorization: `Bearer ${key()}`, accept: 'text/event-stream' },
    signal,
  });
  if (r.status === 204) return finishReplay();
  if (!r.ok) throw new Error(`${r.status} ${(await r.text()).slice(0, 200)}`);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let text = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
    let end;
    while ((end = text.indexOf('\n\n')) >= 0) {
      const frame = text.slice(0, end);
      text = text.slice(end + 2);
      const id = frame.split('\n').find((l) => l.startsWith('id:'));
      const seq = id ? parseInt(id.slice(3).trim(), 10) : NaN;
      if (Number.isFinite(seq)) advance(seq);
    }
  }
  finishReplay();
}

function finishReplay() {
  if (replay.at >= lastSeq()) {
    replay.playing = false;
    $('play').textContent = 'Play';
    $('play').setAttribute('aria-pressed', 'false');
    say('Replay finished.');
  }
}

/** Jumps to `seq`: forward by releasing buffered updates, back by starting over there. */
function jump(seq) {
  seq = Math.max(0, Math.min(seq, lastSeq()));
  if (current.mode === 'file') {
    stopClock();
    if (seq < replay.at) fileRestart();
    fileAdvance(seq);
    if (replay.playing) play(true);
    return;
  }
  if (current.mode !== 'replay') {
    replay.at = 0;
    return openReplayAt(seq, false);
  }
  if (seq >= replay.at) {
    stopClock();
    advance(seq);
    if (replay.playing) play(true);
  } else {
    openReplayAt(seq, replay.playing);
  }
}

function openReplayAt(seq, playing) {
  openReplay(seq);
  if (!playing) play(false);
}

$('replay-start').addEventListener('click', () => (current.mode === 'file' ? jumpBack() : openReplay(0)));
$('play').addEventListener('click', () => {
  if (current.mode !== 'replay' && current.mode !== 'file') return openReplay(0);
  if (!replay.playing && replay.at >= lastSeq()) return jumpBack();
  play(!replay.playing);
});
function jumpBack() {
  if (current.mode === 'file') {
    fileRestart();
    play(true);
  } else openReplay(0);
}
$('speed').addEventListener('change', () => replay.playing && play(true));
$('jump-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const n = parseInt($('replay-at').value, 10);
  if (Number.isFinite(n)) jump(n);
});

// ---- a file from disk --------------------------------------------------------------

/** Sends the file to `POST /v1/fold` (stored nowhere) and replays the updates it gives. */
async function openFile(file) {
  say(`Folding ${file.name}…`);
  const r = await fetch('/v1/fold', {
    method: 'POST',
    headers: { 'content-type': 'application/x-ndjson', authorization: `Bearer ${key()}` },
    body: file,
  });
  const body = await r.json().catch(() => null);
  if (!r.ok) {
    say(`The file was refused: ${body?.error?.code ?? r.status}: ${body?.error?.message ?? ''}`, true);
    return;
  }
  stopRun();
  stopClock();
  history.pushState(null, '', '/ui/');
  current.runId = null;
  current.mode = probe.mode = 'file';
  current.file = { name: file.name, initial: body.initial, events: body.events, updates: body.updates.map(camel), next: 0 };
  for (const e of body.events) current.times.set(e.seq, e.ts);
  $('run-pane').hidden = false;
  $('no-run').hidden = true;
  document.body.classList.add('has-run');
  newRenderer();
  fileRestart();
  say(`${file.name}: ${body.events.length} events, folded by the server; nothing was stored.`);
  play(true);
}

function fileRestart() {
  const f = current.file;
  current.view = camel(structuredClone(f.initial));
  resetTracking(0);
  f.next = 0;
  replay.at = 0;
  show();
}

function fileAdvance(seq) {
  const f = current.file;
  replay.at = seq;
  while (f.next < f.updates.length && f.updates[f.next].seq <= seq) onUpdate(f.updates[f.next++]);
  $('replay-at').value = String(seq);
  show();
}

/** The file's clock: waits each recorded gap divided by the speed. */
function fileTick() {
  const f = current.file;
  const ev = f.events;
  if (replay.at >= ev.length) return finishReplay();
  const next = ev[replay.at]; // events[i] has seq i + 1
  const prev = replay.at > 0 ? ev[replay.at - 1] : null;
  const gap = prev ? Math.max(0, Date.parse(next.ts) - Date.parse(prev.ts)) : 0;
  replay.timer = setTimeout(() => {
    fileAdvance(next.seq);
    fileTick();
  }, Math.min(gap / speed(), 60_000));
}

$('file').addEventListener('change', (ev) => {
  const f = ev.target.files?.[0];
  if (f) openFile(f).catch((e) => say(`Could not read the file: ${e.message}`, true));
  ev.target.value = '';
});

// ---- pages -------------------------------------------------------------------------

function route() {
  const m = location.pathname.match(/^\/ui\/runs\/([^/]+)$/);
  const runId = m ? decodeURIComponent(m[1]) : null;
  if (current.mode === 'file' && !runId) return;
  stopRun();
  stopClock();
  current.runId = runId;
  current.mode = probe.mode = 'none';
  document.body.classList.toggle('has-run', Boolean(runId));
  $('run-pane').hidden = !runId;
  $('no-run').hidden = Boolean(runId);
  drawRuns();
  if (runId) {
    openLive(runId);
    drawHeader();
    document.title = `Run ${runId} · agent-stream`;
  } else {
    document.title = 'Runs · agent-stream';
  }
}

// Links inside the page change the view without reloading it (the socket stays).
document.addEventListener('click', (ev) => {
  const a = ev.target.closest?.('a[href^="/ui/"]');
  if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
  ev.preventDefault();
  if (current.mode === 'file') current.mode = 'none';
  history.pushState(null, '', a.getAttribute('href'));
  route();
  $('run-pane').focus?.();
});
window.addEventListener('popstate', () => {
  if (current.mode === 'file') current.mode = 'none';
  route();
});

function start() {
  if (!takeKey()) return showLogin();
  $('login').hidden = true;
  $('app').hidden = false;
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  socket = new GqlSocket(`${proto}://${location.host}/graphql/ws`, key, connection);
  followRuns();
  route();
}

start();
