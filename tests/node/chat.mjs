// The AI SDK's chat (AbstractChat, what useChat wraps) with DefaultChatTransport as it
// is: only `api` and `headers` set, the chat id being the run id.
// Usage:
//   node chat.mjs send <http base> <api key> <run id> <text>
//     sendMessage({ text }); if the stream is cut (the service was killed), resumeStream()
//     every 200 ms until the chat is ready again without an error.
//   node chat.mjs late <http base> <api key> <run id> <text>
//     a client that arrives after the run has ended: resumeStream(), then sendMessage().
// Prints `{"data": "<type>"}` for each data chunk as it arrives (the test's progress
// signal), then one line `{"final": {...}}`: the chat's messages, status, error text, and
// what each onFinish reported.
import { AbstractChat, DefaultChatTransport } from 'ai';

const [mode, base, key, run, text] = process.argv.slice(2);

class PlainChatState {
  status = 'ready';
  error = undefined;
  messages = [];
  pushMessage = (m) => { this.messages = this.messages.concat(m); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; };
  snapshot = (v) => structuredClone(v);
}

class PlainChat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new PlainChatState() });
  }
}

let n = 0;
const finishes = [];
const errors = [];
const chat = new PlainChat({
  id: run,
  generateId: () => `${mode === "late" ? "late" : "u"}-${++n}`,
  transport: new DefaultChatTransport({ api: `${base}/v1/chat`, headers: { Authorization: `Bearer ${key}` } }),
  onData: (d) => console.log(JSON.stringify({ data: d.type })),
  onFinish: ({ isAbort, isDisconnect, isError, finishReason }) => finishes.push({ isAbort, isDisconnect, isError, finishReason }),
  onError: (e) => errors.push(String(e?.message ?? e)),
});

const timer = setTimeout(() => { console.error('timeout'); process.exit(2); }, 60000);
const final = (extra = {}) => {
  console.log(JSON.stringify({ final: { messages: chat.messages, status: chat.status, error: chat.error ? String(chat.error.message) : null, errors, finishes, ...extra } }));
  clearTimeout(timer);
};

if (mode === 'send') {
  await chat.sendMessage({ text });
  let resumes = 0;
  while (chat.status !== 'ready' || chat.error) {
    await new Promise((r) => setTimeout(r, 200));
    resumes++;
    await chat.resumeStream();
  }
  final({ resumes });
} else if (mode === 'late') {
  await chat.resumeStream();
  const afterResume = { status: chat.status, messages: chat.messages.length };
  await chat.sendMessage({ text });
  final({ afterResume });
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
