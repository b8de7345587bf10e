// A small graphql-transport-ws client (the protocol of the `graphql-ws` package), written
// here because the page has no bundler and loads nothing from a CDN: the handshake is
// connection_init -> connection_ack, then subscribe / next / error / complete, and a
// pong for every ping. One socket carries every subscription of the page; when it
// drops, it is reopened with a growing delay and each subscription is started again
// through its `restart` callback, which gives the variables to resume with (afterSeq).

const PROTOCOL = 'graphql-transport-ws';

export class GqlSocket {
  /**
   * @param {string} url ws(s)://host/graphql/ws
   * @param {() => string} key the API key, sent in connection_init (never in the URL)
   * @param {(state: string) => void} onState 'connecting' | 'open' | 'closed' | 'refused'
   */
  constructor(url, key, onState) {
    this.url = url;
    this.key = key;
    this.onState = onState;
    this.subs = new Map();
    this.nextId = 1;
    this.ws = null;
    this.acked = false;
    this.delay = 250;
    this.stopped = false;
    this.timer = null;
  }

  connect() {
    if (this.stopped || this.ws) return;
    this.onState('connecting');
    const ws = new WebSocket(this.url, PROTOCOL);
    this.ws = ws;
    this.acked = false;
    ws.onopen = () => ws.send(JSON.stringify({ type: 'connection_init', payload: { authorization: `Bearer ${this.key()}` } }));
    ws.onmessage = (ev) => this.#message(ev.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.acked = false;
      // 4401/4403: the key was refused; reconnecting would only be refused again.
      if (ev.code === 4401 || ev.code === 4403) {
        this.onState('refused');
        return;
      }
      this.onState('closed');
      if (!this.stopped) {
        clearTimeout(this.timer);
        this.timer = setTimeout(() => this.connect(), this.delay);
        this.delay = Math.min(this.delay * 2, 4000);
      }
    };
  }

  #message(data) {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    switch (msg.type) {
      case 'connection_ack':
        this.acked = true;
        this.delay = 250;
        this.onState('open');
        for (const [id, sub] of this.subs) this.#start(id, sub);
        break;
      case 'ping':
        this.ws?.send(JSON.stringify({ type: 'pong' }));
        break;
      case 'next': {
        const sub = this.subs.get(msg.id);
        if (!sub) break;
        if (msg.payload?.errors?.length) sub.onError(msg.payload.errors);
        else sub.onNext(msg.payload?.data);
        break;
      }
      case 'error': {
        const sub = this.subs.get(msg.id);
        if (sub) {
          this.subs.delete(msg.id);
          sub.onError(msg.payload);
        }
        break;
      }
      case 'complete': {
        const sub = this.subs.get(msg.id);
        if (sub) {
          this.subs.delete(msg.id);
          sub.onComplete();
        }
        break;
      }
      default:
        break;
    }
  }

  #start(id, sub) {
    const payload = { query: sub.query, variables: sub.restart() };
    this.ws.send(JSON.stringify({ id, type: 'subscribe', payload }));
  }

  /**
   * Starts a subscription; `restart()` is called for its variables at every (re)start.
   * Returns a function that stops it.
   */
  subscribe(query, restart, { onNext, onError = () => {}, onComplete = () => {} }) {
    const id = String(this.nextId++);
    const sub = { query, restart, onNext, onError, onComplete };
    this.subs.set(id, sub);
    if (this.ws && this.acked) this.#start(id, sub);
    else this.connect();
    return () => {
      if (this.subs.delete(id) && this.ws && this.acked) {
        this.ws.send(JSON.stringify({ id, type: 'complete' }));
      }
    };
  }

  close() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.ws?.close(1000);
    this.ws = null;
  }
}
