// @durable-streams/client's stream() as it is (url and headers only) reading a run.
// Usage: node durable.mjs <http base> <api key> <run id> <live: catchup|long-poll|sse> [offset]
// Prints one line per event `{"seq", "type", "offset"}` (the batch's Stream-Next-Offset),
// then `{"end": {offset, upToDate, streamClosed}}` when the session ends.
import { stream } from '@durable-streams/client';

const [base, key, run, live, offset] = process.argv.slice(2);
// A cut response body can surface as an unhandled rejection; note it on stderr.
process.on('unhandledRejection', (e) => console.error(`unhandled: ${String(e?.message ?? e)}`));
process.on('uncaughtException', (e) => console.error(`${live} uncaught: ${String(e?.message ?? e)}`));
const timer = setTimeout(() => { console.error('timeout'); process.exit(2); }, 60000);
const res = await stream({
  url: `${base}/v1/durable/runs/${run}`,
  headers: { Authorization: `Bearer ${key}` },
  offset: offset ?? '-1',
  live: live === 'catchup' ? false : live,
  json: true,
  // Quick retries while the service restarts under the test.
  backoffOptions: { initialDelay: 100, maxDelay: 300, multiplier: 1.3, maxRetries: Infinity },
});
let last = { offset: offset ?? '-1', upToDate: false, streamClosed: false };
let ended = false;
const end = (error = null) => {
  if (ended) return;
  ended = true;
  console.log(JSON.stringify({ end: { ...last, error } }));
  clearTimeout(timer);
};
res.subscribeJson((batch) => {
  for (const e of batch.items) console.log(JSON.stringify({ seq: e.seq, type: e.type, payload: e.payload, offset: batch.offset }));
  last = { offset: batch.offset, upToDate: batch.upToDate, streamClosed: batch.streamClosed };
  // The stream's end: the batch that says it is closed (`closed` may settle before the
  // subscriber has seen the last batch).
  if (batch.streamClosed) end();
});
res.closed.then(
  () => setTimeout(() => end(), 500),
  (e) => end(String(e?.message ?? e)),
);
