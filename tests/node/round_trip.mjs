// The log is the bus: a frontend posts a user message, the agent runtime learns of it
// through its subscription, answers by appending, and the frontend sees the answer stream.
// Usage (Node 22): node round_trip.mjs <http base> <api key with read and write>
import { createClient } from 'graphql-ws';
import { HttpAgent } from '@ag-ui/client';

const [base, key] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${key}` };
const post = (path, body) =>
  fetch(base + path, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify(body) })
    .then((r) => r.json());

// A run, running.
const { run_id: run } = await post('/v1/runs');
await post(`/v1/runs/${run}/events`, [{ type: 'run.lifecycle', payload: { state: 'running' } }]);

// The runtime: one GraphQL subscription, filtered to message starts and ends.
const roles = new Map();
const variables = { run, afterSeq: 0 };
const runtime = createClient({ url: base.replace(/^http/, 'ws') + '/graphql/ws', connectionParams: auth });
runtime.subscribe(
  {
    query: `subscription($run: ID!, $afterSeq: Int) {
      runEvents(runId: $run, afterSeq: $afterSeq, types: ["message.start", "message.end"]) { seq type payload } }`,
    variables,
  },
  {
    next: async ({ data: { runEvents: e } }) => {
      variables.afterSeq = e.seq; // a reconnect resumes after it
      if (e.type === 'message.start') return roles.set(e.payload.message_id, e.payload.role);
      if (roles.get(e.payload.message_id) !== 'user') return;
      const words = `You said: ${e.payload.text}`.split(' ');
      await post(`/v1/runs/${run}/events`, [
        { type: 'message.start', payload: { message_id: `re-${e.payload.message_id}`, role: 'assistant' } },
        ...words.map((w, i) => ({ type: 'text.delta', payload: { text: (i ? ' ' : '') + w } })),
        { type: 'message.end', payload: { message_id: `re-${e.payload.message_id}`, stop_reason: 'end_turn' } },
        { type: 'run.lifecycle', payload: { state: 'done' } },
      ]);
    },
    error: (e) => console.error(e),
    complete: () => runtime.dispose(),
  },
);

// The frontend: AG-UI's HttpAgent, with the run as its thread.
const agent = new HttpAgent({ url: `${base}/v1/agui`, headers: auth, threadId: run });
agent.addMessage({ id: 'q-1', role: 'user', content: 'hello' });
await agent.runAgent({}, { onTextMessageContentEvent: ({ event }) => void process.stdout.write(event.delta) });
console.log(`\n${JSON.stringify(agent.messages)}`);
