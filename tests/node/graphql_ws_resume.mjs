// The real `graphql-ws` client, as the README tells a frontend to use it: automatic
// reconnect, and no duplicates after one, because the subscription's `variables` object
// follows the last seq seen. graphql-ws serialises a subscription's payload each time it
// (re)subscribes, so setting `variables.afterSeq` on every event makes a re-subscribe
// after a reconnect ask for exactly what the client has not got.
// Usage: node graphql_ws_resume.mjs <http base> <api key> <run id> [--static]
// `--static` leaves `afterSeq` as it was (what a client that does not follow the seq gets).
// Prints one JSON line per event, `{"connected":n}` at each (re)connection, then
// "complete" after the run's end.
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';

const [base, key, run, mode] = process.argv.slice(2);
let connections = 0;
const client = createClient({
  url: base.replace(/^http/, 'ws') + '/graphql/ws',
  webSocketImpl: WebSocket,
  connectionParams: { Authorization: `Bearer ${key}` },
  // Keep trying while the service is down (it is restarted under the test).
  retryAttempts: 600,
  retryWait: () => new Promise((r) => setTimeout(r, 100)),
  shouldRetry: () => true,
  on: { connected: () => console.log(JSON.stringify({ connected: ++connections })) },
});

const query = `subscription($run: ID!, $afterSeq: Int) { runEvents(runId: $run, afterSeq: $afterSeq) { seq type payload } }`;
const variables = { run, afterSeq: 0 };
const timer = setTimeout(() => { console.error('timeout'); process.exit(2); }, 60000);
client.subscribe({ query, variables }, {
  next: (msg) => {
    if (msg.errors) { console.error(JSON.stringify(msg.errors)); process.exit(1); }
    const e = msg.data.runEvents;
    if (mode !== '--static') variables.afterSeq = e.seq;
    console.log(JSON.stringify(e));
  },
  error: (err) => { console.error('error', err?.message ?? err?.code ?? JSON.stringify(err)); process.exit(1); },
  complete: () => { console.log('complete'); clearTimeout(timer); client.dispose(); },
});
