// Drives the real `graphql-ws` client against a running agent-stream.
// Usage: node graphql_ws.mjs <http base> <api key> <run id>
// Subscribes to runEvents from the start and prints one JSON line per event received,
// then "complete" when the server completes the subscription (after the run's end).
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';

const [base, key, run] = process.argv.slice(2);
const client = createClient({
  url: base.replace(/^http/, 'ws') + '/graphql/ws',
  webSocketImpl: WebSocket,
  connectionParams: { Authorization: `Bearer ${key}` },
  retryAttempts: 0,
});

const query = `subscription($run: ID!) { runEvents(runId: $run) { seq type payload } }`;
const timer = setTimeout(() => { console.error('timeout'); process.exit(2); }, 20000);
client.subscribe({ query, variables: { run } }, {
  next: (msg) => {
    if (msg.errors) { console.error(JSON.stringify(msg.errors)); process.exit(1); }
    console.log(JSON.stringify(msg.data.runEvents));
  },
  error: (err) => { console.error('error', err?.message ?? JSON.stringify(err)); process.exit(1); },
  complete: () => { console.log('complete'); clearTimeout(timer); client.dispose(); },
});
