// Seed 004 T1 from JavaScript: the `ws` npm client follows a run over the WebSocket
// profile (subprotocol koder-agent-stream-v1, `Detail: full`), checks each frame is text
// and survives marshal -> unmarshal unchanged, and prints it (one JSON line per frame),
// then "close <code>".
// Usage: node seed004_ws.mjs <http base> <api key> <run id>
import assert from 'node:assert/strict';
import WebSocket from 'ws';

const [base, key, run] = process.argv.slice(2);
const url = `${base.replace(/^http/, 'ws')}/v1/agent/runs/${run}/stream?access_token=${key}`;
const ws = new WebSocket(url, 'koder-agent-stream-v1', { headers: { Detail: 'full' } });
const timer = setTimeout(() => { console.error('timeout'); process.exit(2); }, 20000);
ws.on('message', (data, isBinary) => {
  assert.equal(isBinary, false, 'binary frames are forbidden');
  const event = JSON.parse(data.toString('utf8'));
  assert.deepEqual(JSON.parse(JSON.stringify(event)), event, 'marshal -> unmarshal -> equal');
  for (const k of ['id', 'ts', 'type', 'run_id', 'seq', 'payload']) assert.ok(k in event, `envelope field ${k}`);
  console.log(JSON.stringify(event));
});
ws.on('close', (code) => { console.log(`close ${code}`); clearTimeout(timer); });
ws.on('error', (err) => { console.error('error', err.message); process.exit(1); });
