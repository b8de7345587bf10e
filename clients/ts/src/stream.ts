/// <reference types="node" />
/**
 * `@agent-stream/client/stream`: a producer over the streaming append
 * (`POST /v1/runs/{id}/events/stream`). Node only: the route needs the answer read
 * while the body is still being sent (HTTP/1.1 full duplex), which `fetch` does not do,
 * so it uses `node:http`; in a browser, use {@link Producer} from the main entry.
 */

import { request as httpRequest, type ClientRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import type { NewEvent } from "./events.js";
import { AgentStreamError, authHeaders, trimBase } from "./http.js";
import type { Appended } from "./producer.js";

/** Options of {@link StreamProducer}. */
export interface StreamProducerOptions {
  /** The service's base URL, such as `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** An API key with `write`. */
  apiKey: string;
  /** The run to append to. */
  runId: string;
  /** Prefix of the idempotency keys it sets (default: a random UUID, unique per producer). */
  keyPrefix?: string;
}

/** How a stream ended: its lines, and the events written (retries not counted). */
export interface StreamDone {
  lines: number;
  events: number;
}

interface Waiting {
  key: string;
  resolve: (a: Appended) => void;
  reject: (e: unknown) => void;
}

/**
 * Appends events to one run as lines of one long-lived streaming append. `append` writes
 * the event at once and resolves with its seq when the service acknowledges it (events
 * are committed in groups within milliseconds); `close` ends the body and resolves once
 * every line is committed. Each event gets an idempotency key (`<keyPrefix>:<n>`) unless
 * it has one, so after a cut a new producer with the same `keyPrefix` can send the same
 * events again: the stored ones are answered with `replayed: true`. A refused line
 * rejects its promise with an {@link AgentStreamError} (`code`, and `line`: its number
 * in the stream), and every later line's too: the service writes nothing after it.
 */
export class StreamProducer {
  private readonly req: ClientRequest;
  private readonly prefix: string;
  private readonly waiting = new Map<number, Waiting>();
  private readonly ended: Promise<StreamDone>;
  private failure: unknown;
  private lines = 0;
  private counter = 0;

  constructor(opts: StreamProducerOptions) {
    this.prefix = opts.keyPrefix ?? crypto.randomUUID();
    const url = new URL(`${trimBase(opts.baseUrl)}/v1/runs/${encodeURIComponent(opts.runId)}/events/stream`);
    const request = url.protocol === "https:" ? httpsRequest : httpRequest;
    this.req = request(url, {
      method: "POST",
      headers: { ...authHeaders(opts.apiKey), "Content-Type": "application/x-ndjson" },
    });
    this.ended = new Promise<StreamDone>((resolve, reject) => {
      const fail = (e: unknown) => {
        this.fail(e, 1);
        reject(e);
      };
      this.req.on("error", fail);
      this.req.on("response", (res: IncomingMessage) => {
        res.setEncoding("utf8");
        let buf = "";
        if (res.statusCode !== 200) {
          res.on("data", (c: string) => (buf += c));
          res.on("end", () => fail(refusal(res.statusCode ?? 0, buf)));
          return;
        }
        let done: StreamDone | undefined;
        res.on("data", (chunk: string) => {
          buf += chunk;
          for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
            const line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (line.trim() === "") continue;
            const v = JSON.parse(line);
            if (v.done) done = v.done as StreamDone;
            else if (v.error) {
              const e = new AgentStreamError(200, v.error.code, v.error.message);
              (e as AgentStreamError & { line?: number }).line = v.error.line;
              this.fail(e, v.error.line);
            } else this.acknowledged(v);
          }
        });
        res.on("end", () => {
          if (done) resolve(done);
          else fail(this.failure ?? new Error("the streaming append ended without its last line"));
        });
        res.on("error", fail);
      });
    });
    // Failures reach the events' promises; `close` reports them again.
    this.ended.catch(() => undefined);
    this.req.flushHeaders();
  }

  /** Writes one event; resolves once it is committed. */
  append(event: NewEvent): Promise<Appended> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    const key = event.key ?? `${this.prefix}:${++this.counter}`;
    const line = ++this.lines;
    const p = new Promise<Appended>((resolve, reject) => this.waiting.set(line, { key, resolve, reject }));
    this.req.write(`${JSON.stringify({ ...event, key })}\n`);
    return p;
  }

  /** Ends the stream; resolves once every line is committed (rejects as the stream failed). */
  close(): Promise<StreamDone> {
    this.req.end();
    return this.ended;
  }

  private acknowledged(a: { first_seq: number; first_line: number; last_line: number; replayed: boolean }): void {
    for (let n = a.first_line; n <= a.last_line; n++) {
      const w = this.waiting.get(n);
      if (!w) continue;
      this.waiting.delete(n);
      w.resolve({ seq: a.first_seq + (n - a.first_line), key: w.key, replayed: a.replayed });
    }
  }

  /** Rejects every line from `from` on. */
  private fail(e: unknown, from: number): void {
    this.failure ??= e;
    for (const [n, w] of this.waiting) {
      if (n >= from) {
        this.waiting.delete(n);
        w.reject(e);
      }
    }
  }
}

function refusal(status: number, body: string): AgentStreamError {
  try {
    const e = JSON.parse(body).error;
    if (e && typeof e.code === "string") return new AgentStreamError(status, e.code, String(e.message ?? ""));
  } catch {
    // not JSON: keep the text
  }
  return new AgentStreamError(status, `HTTP-${status}`, body.slice(0, 500));
}
