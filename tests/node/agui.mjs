// AG-UI's HttpAgent (@ag-ui/client) as it is: only `url` and `headers` set, its
// threadId naming the run.
// Usage:
//   node agui.mjs send <http base> <api key> <run id> <text> [--resume-plan <plan id>]
//     addMessage(user) and runAgent(); when the run is cut (the service was killed),
//     runAgent() again every 200 ms until one ends cleanly. With --resume-plan, once the
//     state says awaiting_approval, abortRun() and runAgent({resume}) approving the plan.
//   node agui.mjs late <http base> <api key> <run id> <text>
//     a client that arrives after the run has ended: runAgent() with no new message,
//     then addMessage + runAgent() (refused: the run has ended).
// Prints `{"data": "<event type>"}` per event (CUSTOM: `CUSTOM:<name>`) as progress,
// then `{"final": {...}}`: the agent's messages and state, the runs, their outcomes
// (RUN_FINISHED) and RUN_ERRORs, and the errors runAgent threw.
import { HttpAgent } from '@ag-ui/client';

const [mode, base, key, run, text, flag, planId] = process.argv.slice(2);
const agent = new HttpAgent({ url: `${base}/v1/agui`, headers: { Authorization: `Bearer ${key}` }, threadId: run });
const errors = [];
const outcomes = [];
const runErrors = [];
let awaiting = false;
const subscriber = {
  onEvent: ({ event }) => {
    console.log(JSON.stringify({ data: event.type === 'CUSTOM' ? `CUSTOM:${event.name}` : event.type }));
  },
  onStateChanged: ({ state }) => {
    if (state?.lifecycle === "awaiting_approval") awaiting = true;
  },
  onRunFinishedEvent: ({ event }) => outcomes.push(event.outcome?.type ?? null),
  onRunErrorEvent: ({ event }) => runErrors.push({ message: event.message, code: event.code ?? null }),
};
// @ag-ui/client leaves a rejection of the cut response body unhandled (a browser logs it);
// Node would exit on it, so note it instead. runAgent() itself fails as well.
process.on('unhandledRejection', (e) => errors.push(`unhandled: ${String(e?.message ?? e).slice(0, 200)}`));
const timer = setTimeout(() => { console.error('timeout'); process.exit(2); }, 60000);
// AG-UI's client logs a failed run with console.error; keep stdout for the test's lines.
console.error = (...args) => errors.push(args.map(String).join(' ').slice(0, 300));
const final = (extra = {}) => {
  console.log(JSON.stringify({ final: { messages: agent.messages, state: agent.state, errors, outcomes, runErrors, ...extra } }));
  clearTimeout(timer);
};

async function runUntilClean(params) {
  let runs = 0;
  for (;;) {
    runs++;
    try {
      await agent.runAgent(params, subscriber);
      return runs;
    } catch (e) {
      const msg = String(e?.message ?? e);
      errors.push(msg.slice(0, 300));
      // Only a cut connection is worth another run; a run that failed (RUN_ERROR) is over.
      if (!/terminated|fetch failed|other side closed|ECONNREFUSED/i.test(msg)) return runs;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

if (mode === 'send') {
  agent.addMessage({ id: 'u-1', role: 'user', content: text });
  if (flag === '--resume-plan') {
    const first = agent.runAgent({}, subscriber).catch((e) => errors.push(String(e?.message ?? e)));
    while (!awaiting) await new Promise((r) => setTimeout(r, 20));
    agent.abortRun();
    await first;
    const runs = await runUntilClean({ resume: [{ interruptId: planId, status: 'resolved', payload: { approved: true, reason: 'looks good' } }] });
    final({ runs });
  } else {
    const runs = await runUntilClean({});
    final({ runs });
  }
} else if (mode === 'late') {
  const runs = await runUntilClean({});
  const afterRun = { messages: agent.messages.length };
  agent.addMessage({ id: 'late-1', role: 'user', content: text });
  let refused = null;
  try {
    await agent.runAgent({}, subscriber);
  } catch (e) {
    refused = String(e?.message ?? e);
  }
  final({ runs, afterRun, refused });
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
