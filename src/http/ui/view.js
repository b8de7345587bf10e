// The run's view on the page: the server's reducer makes it, this file only keeps it.
//
// Nothing here folds events. The page holds the `RunView` the server folded (the
// `runView` subscription's SNAPSHOT, or `POST /v1/fold`'s `initial`) and applies each
// `ViewUpdate` as the update rules in crates/core/src/projection/updates.rs say:
// SNAPSHOT replaces the view; MESSAGE, TOOL and CHILD upsert a record by id; TRANSITION
// and STEP add a record (kept by its seq, so an update received twice after a resume
// is the same record); PLAN and COMPACTION replace; every update sets `seq`.
// Records are replaced, never changed in place, so the renderer sees what changed by
// identity and touches only those DOM nodes, in batches per animation frame.

/** The `RunView` fields the page shows, for GraphQL selections. */
export const VIEW_FIELDS = `
  seq anomalies
  lifecycle { state transitions { seq ts childId from to reason } }
  messages { ...M }
  tools { ...T }
  plan { ...P }
  steps { seq ts childId stepIndex stepKind checkpointId openMessageIds }
  children { ...C }
  compaction { ...K }`;

/** Fragments of the records, shared by the query, the subscription and the tests. */
export const FRAGMENTS = `
fragment M on Message { id childId role status blocks { kind text callId } text reasoning stopReason implicit startedSeq endedSeq }
fragment T on ToolCall { callId childId tool input skillId status progressCount lastProgress output error durationMs blobRef messageId startedSeq endedSeq }
fragment P on Plan { id childId steps { id title intent estTools estCostUsd } estTotalCostUsd proposedSeq proposals decision { decision reason decidedBy seq } }
fragment C on ChildRun { childId parentChildId prompt toolsAllowed state spawnedSeq children }
fragment K on Compaction { active count tokensRemovedTotal last { removed kept tokensRemoved tokensKept reason seq } }`;

/** The `runView` subscription with every record's fields. */
export const RUN_VIEW = `subscription RunView($runId: ID!, $afterSeq: Int, $snapshot: Boolean!) {
  runView(runId: $runId, afterSeq: $afterSeq, snapshot: $snapshot) {
    seq kind runState
    view { ${VIEW_FIELDS} }
    message { ...M } tool { ...T } plan { ...P } child { ...C } compaction { ...K }
    transition { seq ts childId from to reason }
    step { seq ts childId stepIndex stepKind checkpointId openMessageIds }
  }
}
${FRAGMENTS}`;

// Fields whose values are the producer's JSON: their keys are data, not names.
const OPAQUE = new Set(['input', 'output', 'error', 'last_progress', 'lastProgress', 'payload']);

/**
 * REST and `POST /v1/fold` speak serde's snake_case, GraphQL camelCase: one spelling
 * for the page (camelCase). Renames keys only; values are untouched.
 */
export function camel(v) {
  if (Array.isArray(v)) return v.map(camel);
  if (v === null || typeof v !== 'object') return v;
  const out = {};
  for (const [k, x] of Object.entries(v)) {
    const name = k.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
    out[name] = OPAQUE.has(k) ? x : camel(x);
  }
  return out;
}

/** Enum values: GraphQL's `TOOL_ROUNDTRIP`, serde's `tool-roundtrip`: shown as the latter. */
export function word(v) {
  return v == null ? '' : String(v).toLowerCase().replace(/_/g, '-');
}

const TERMINAL = new Set(['done', 'aborted', 'error']);
/** True for done, aborted and error. */
export function terminal(state) {
  return TERMINAL.has(word(state));
}

function upsert(list, rec, same) {
  const i = list.findIndex(same);
  if (i < 0) list.push(rec);
  else list[i] = rec;
}

function addBySeq(list, rec) {
  // Kept by seq: a resumed stream may send again the updates of the one seq it was
  // in the middle of; the record is then the same, not a second one.
  if (list.length && list[list.length - 1].seq >= rec.seq) {
    const i = list.findIndex((x) => x.seq === rec.seq);
    if (i >= 0) {
      list[i] = rec;
      return;
    }
  }
  list.push(rec);
  if (list.length > 1 && list[list.length - 2].seq > rec.seq) list.sort((a, b) => a.seq - b.seq);
}

/** Applies one `ViewUpdate` (camelCase) to `view`; returns the view (a new one for SNAPSHOT). */
export function applyUpdate(view, u) {
  const kind = String(u.kind).toUpperCase();
  if (kind === 'SNAPSHOT') return u.view;
  const lane = (x) => x.childId ?? null;
  switch (kind) {
    case 'MESSAGE':
      upsert(view.messages, u.message, (m) => m.id === u.message.id && lane(m) === lane(u.message));
      break;
    case 'TOOL':
      upsert(view.tools, u.tool, (t) => t.callId === u.tool.callId && lane(t) === lane(u.tool));
      break;
    case 'CHILD':
      upsert(view.children, u.child, (c) => c.childId === u.child.childId);
      break;
    case 'TRANSITION':
      view.lifecycle = { ...view.lifecycle, state: u.runState ?? null };
      addBySeq(view.lifecycle.transitions, u.transition);
      break;
    case 'STEP':
      addBySeq(view.steps, u.step);
      break;
    case 'PLAN':
      view.plan = u.plan;
      break;
    case 'COMPACTION':
      view.compaction = u.compaction;
      break;
    default:
      break;
  }
  view.seq = Math.max(view.seq ?? 0, u.seq);
  return view;
}

// ---- rendering -------------------------------------------------------------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

/** The visible text of a JSON value: a string as it is, anything else as indented JSON. */
export function shown(v) {
  return typeof v === 'string' ? v : JSON.stringify(v, null, 2);
}

function present(v) {
  return v !== null && v !== undefined && !(typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 0);
}

/** The timeline's items of a view: one per record, each in its lane (child), by seq. */
function items(view, ctx) {
  const out = [];
  const laneOf = (x) => x.childId ?? '';
  for (const m of view.messages) out.push({ key: `m:${laneOf(m)}:${m.id}`, lane: laneOf(m), seq: m.startedSeq, kind: 'message', data: m });
  for (const t of view.tools) out.push({ key: `t:${laneOf(t)}:${t.callId}`, lane: laneOf(t), seq: t.startedSeq, kind: 'tool', data: t });
  for (const s of view.steps) out.push({ key: `s:${s.seq}`, lane: laneOf(s), seq: s.seq, kind: 'step', data: s });
  for (const l of view.lifecycle.transitions) out.push({ key: `l:${l.seq}`, lane: laneOf(l), seq: l.seq, kind: 'transition', data: l });
  for (const c of view.children) out.push({ key: `k:${c.childId}`, lane: c.parentChildId ?? '', seq: c.spawnedSeq, kind: 'child', data: c });
  if (view.plan) {
    // The buttons depend on the run's state too: a change of state redraws the plan.
    out.push({ key: 'p', lane: laneOf(view.plan), seq: view.plan.proposedSeq, kind: 'plan', data: view.plan, extra: `${word(view.lifecycle.state)}|${ctx.controls}` });
  }
  const k = view.compaction;
  if (k && (k.active || k.last)) out.push({ key: 'c', lane: '', seq: k.last?.seq ?? view.seq, kind: 'compaction', data: k });
  return out;
}

/** Draws a view into `root` and redraws only what changed, a batch per frame. */
export class Renderer {
  /**
   * @param {HTMLElement} root where the tabs and lanes go
   * @param {{timeOf: (seq:number) => Promise<string|null>, onDecide: (d:string) => void, controls: () => boolean}} ctx
   */
  constructor(root, ctx) {
    this.root = root;
    this.ctx = ctx;
    this.view = null;
    this.nodes = new Map(); // key -> {node, data, extra, seq, lane}
    this.lanes = new Map(); // lane -> container
    this.tab = '';
    this.frame = 0;
    this.root.replaceChildren();
    this.tabs = el('div', 'tabs');
    this.tabs.setAttribute('role', 'tablist');
    this.tabs.setAttribute('aria-label', 'Run and sub-runs');
    this.body = el('div', 'lanes');
    this.root.append(this.tabs, this.body);
    this.perFrame = 400;
  }

  /** Shows `view` (the same object may come again after updates were applied to it). */
  show(view) {
    this.view = view;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.#draw());
  }

  /** True when every record of the view has its node (nothing waits for a frame). */
  settled() {
    return !this.frame && this.view !== null;
  }

  #lane(id) {
    let c = this.lanes.get(id);
    if (!c) {
      c = el('ol', 'lane');
      c.dataset.lane = id;
      c.setAttribute('role', 'tabpanel');
      c.setAttribute('aria-label', id ? `Sub-run ${id}` : 'Run');
      c.hidden = id !== this.tab;
      this.lanes.set(id, c);
      this.body.append(c);
    }
    return c;
  }

  #drawTabs(view) {
    const ids = ['', ...view.children.map((c) => c.childId)];
    const want = ids.join('\u0000') + '|' + view.children.map((c) => word(c.state)).join(',') + '|' + this.tab;
    if (this.tabs.dataset.sig === want) return;
    this.tabs.dataset.sig = want;
    this.tabs.replaceChildren();
    for (const id of ids) {
      const child = view.children.find((c) => c.childId === id);
      const b = el('button', 'tab', id ? `${id}` : 'Run');
      if (child?.state) b.append(el('span', `badge state-${word(child.state)}`, word(child.state)));
      b.type = 'button';
      b.setAttribute('role', 'tab');
      b.setAttribute('aria-selected', String(id === this.tab));
      b.dataset.lane = id;
      b.onclick = () => this.select(id);
      this.tabs.append(b);
    }
    this.tabs.hidden = ids.length < 2;
  }

  /** Shows the lane of `id` ('' for the run itself). */
  select(id) {
    this.tab = id;
    for (const [lane, c] of this.lanes) c.hidden = lane !== id;
    this.tabs.dataset.sig = '';
    if (this.view) this.#drawTabs(this.view);
  }

  #draw() {
    this.frame = 0;
    const view = this.view;
    if (!view) return;
    this.#drawTabs(view);
    const list = items(view, { controls: this.ctx.controls() });
    list.sort((a, b) => (a.lane < b.lane ? -1 : a.lane > b.lane ? 1 : a.seq - b.seq));
    const seen = new Set();
    let budget = this.perFrame;
    let behind = false;
    let laneId = null;
    let prev = null;
    for (const it of list) {
      seen.add(it.key);
      if (it.lane !== laneId) {
        laneId = it.lane;
        prev = null;
      }
      const lane = this.#lane(it.lane);
      let r = this.nodes.get(it.key);
      if (!r || r.data !== it.data || r.extra !== it.extra) {
        if (budget <= 0) {
          // The rest waits for the next frame: the tab stays responsive on big runs.
          behind = true;
          if (r) prev = r.node;
          continue;
        }
        budget -= 1;
        const node = this.#node(it, r?.node);
        if (r && r.node !== node) r.node.replaceWith(node);
        r = { node, data: it.data, extra: it.extra };
        this.nodes.set(it.key, r);
      }
      const want = prev ? prev.nextSibling : lane.firstChild;
      if (r.node.parentNode !== lane || want !== r.node) lane.insertBefore(r.node, want);
      prev = r.node;
    }
    for (const [key, r] of this.nodes) {
      if (!seen.has(key)) {
        r.node.remove();
        this.nodes.delete(key);
      }
    }
    if (behind) this.frame = requestAnimationFrame(() => this.#draw());
  }

  #meta(node, it, label) {
    const meta = el('div', 'meta');
    meta.append(el('span', 'label', label), el('span', 'seq', `#${it.seq}`));
    node.prepend(meta);
    node.dataset.seq = String(it.seq);
    // The time of the item's event: known for some records, asked for on hover.
    const ts = it.data.ts;
    node.title = ts ? `seq ${it.seq} · ${ts}` : `seq ${it.seq}`;
    if (!ts) {
      node.addEventListener(
        'pointerenter',
        () => {
          this.ctx.timeOf(it.seq).then((t) => {
            if (t) node.title = `seq ${it.seq} · ${t}`;
          });
        },
        { once: true },
      );
    }
  }

  #node(it, old) {
    const n = el('li', `item ${it.kind}`);
    n.dataset.key = it.key;
    n.dataset.kind = it.kind;
    const d = it.data;
    switch (it.kind) {
      case 'message': {
        n.classList.add(`role-${word(d.role)}`);
        // Keep the reader's open reasoning open across redraws.
        const open = new Set([...(old?.querySelectorAll('details[open]') ?? [])].map((x) => x.dataset.i));
        const head = el('div', 'head');
        head.append(el('span', 'role', word(d.role)), el('span', `status status-${word(d.status)}`, word(d.status)));
        if (d.stopReason) head.append(el('span', 'stop', d.stopReason));
        n.append(head);
        const body = el('div', 'bubble');
        d.blocks.forEach((b, i) => {
          const k = word(b.kind);
          if (k === 'text') body.append(el('div', 'text', b.text ?? ''));
          else if (k === 'thinking') {
            const det = el('details', 'reasoning');
            det.dataset.i = String(i);
            det.open = open.has(String(i));
            det.append(el('summary', null, 'Reasoning'), el('div', 'thinking', b.text ?? ''));
            body.append(det);
          } else {
            const a = el('a', 'toolref', `tool call ${b.callId}`);
            a.href = `#tool-${encodeURIComponent(`${d.childId ?? ''}:${b.callId}`)}`;
            body.append(a);
          }
        });
        if (d.status && word(d.status) === 'streaming') body.append(el('span', 'cursor', '▍'));
        n.append(body);
        this.#meta(n, it, 'message');
        break;
      }
      case 'tool': {
        const s = word(d.status);
        n.id = `tool-${d.childId ?? ''}:${d.callId}`;
        const head = el('div', 'head');
        head.append(el('span', 'tool-name', d.tool), el('span', `status status-${s}`, s));
        if (s === 'running') {
          const sp = el('span', 'spinner');
          sp.setAttribute('aria-hidden', 'true');
          head.append(sp);
        }
        if (d.durationMs != null) head.append(el('span', 'duration', `${d.durationMs} ms`));
        n.append(head);
        const input = el('details', 'input');
        input.append(el('summary', null, 'Input'), el('pre', null, shown(d.input)));
        n.append(input);
        if (d.progressCount > 0) {
          const p = el('div', 'progress');
          p.append(el('span', 'count', `${d.progressCount} progress update${d.progressCount === 1 ? '' : 's'}`));
          if (present(d.lastProgress)) p.append(el('pre', 'last', shown(d.lastProgress)));
          n.append(p);
        }
        if (present(d.output)) n.append(el('pre', 'output', shown(d.output)));
        if (present(d.error)) n.append(el('pre', 'error', shown(d.error)));
        if (d.blobRef) n.append(el('div', 'blob', d.blobRef));
        this.#meta(n, it, 'tool');
        break;
      }
      case 'step':
        n.setAttribute('role', 'separator');
        n.append(el('span', 'step-text', `step ${d.stepIndex} · ${word(d.stepKind)}`));
        this.#meta(n, it, 'step');
        break;
      case 'transition':
        n.append(el('span', 'to', word(d.to)));
        if (d.reason) n.append(el('span', 'reason', d.reason));
        this.#meta(n, it, d.from ? `${word(d.from)} →` : 'lifecycle');
        break;
      case 'child': {
        const b = el('button', 'open-child', `Open sub-run ${d.childId}`);
        b.type = 'button';
        b.onclick = () => this.select(d.childId);
        n.append(el('div', 'prompt', d.prompt ?? ''), b);
        this.#meta(n, it, 'sub-run');
        break;
      }
      case 'plan': {
        const ol = el('ol', 'plan-steps');
        for (const s of d.steps) {
          const li = el('li', 'plan-step');
          li.append(el('span', 'title', s.title), el('span', 'intent', word(s.intent)));
          if (s.estCostUsd != null) li.append(el('span', 'cost', `$${s.estCostUsd}`));
          ol.append(li);
        }
        n.append(ol);
        if (d.estTotalCostUsd != null) n.append(el('div', 'total', `estimated $${d.estTotalCostUsd}`));
        if (d.decision) {
          n.append(el('div', `decision decision-${word(d.decision.decision)}`, word(d.decision.decision)));
        } else if (it.extra.startsWith('awaiting-approval|') && it.extra.endsWith('true')) {
          const row = el('div', 'decide');
          for (const [what, label] of [['approve', 'Approve plan'], ['reject', 'Reject plan']]) {
            const b = el('button', `btn ${what}`, label);
            b.type = 'button';
            b.onclick = () => this.ctx.onDecide(what);
            row.append(b);
          }
          n.append(row);
        }
        this.#meta(n, it, `plan ${d.id}`);
        break;
      }
      case 'compaction': {
        const t = d.active
          ? 'compacting the context…'
          : `context compacted: ${d.last.removed} removed, ${d.last.kept} kept` +
            (d.last.tokensRemoved != null ? `, ${d.last.tokensRemoved} tokens freed` : '') +
            ` (${d.last.reason})`;
        n.append(el('span', 'compaction-text', t));
        this.#meta(n, it, `compaction ${d.count}`);
        break;
      }
      default:
        break;
    }
    return n;
  }
}
