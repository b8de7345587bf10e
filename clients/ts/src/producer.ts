/** A producer that batches appends, keys every event, and retries what may be retried. */

import type { NewEvent } from "./events.js";
import {
  AgentStreamError,
  type Connection,
  authHeaders,
  backoffMs,
  retryAfterMs,
  retryable,
  sleep,
  trimBase,
} from "./http.js";

/** Options of {@link Producer}. */
export interface ProducerOptions extends Connection {
  /** The run to append to. */
  runId: string;
  /** Most events in one request (default 500; the server's limit is 10,000). */
  maxBatch?: number;
  /** How long an event may wait for others to share its request, in ms (default 5). */
  lingerMs?: number;
  /** Prefix of the idempotency keys it sets (default: a random UUID, unique per producer). */
  keyPrefix?: string;
  /** Tries per batch before its events fail (default 20). */
  maxAttempts?: number;
  /** First wait when no `Retry-After` is given, in ms (default 100; doubles up to 5 s). */
  retryDelayMs?: number;
}

/** Where an appended event was stored. */
export interface Appended {
  /** Its seq in the run. */
  seq: number;
  /** The idempotency key it was sent with. */
  key: string;
  /** True when the server already had it (a retry of a batch that had been written). */
  replayed: boolean;
}

interface Pending {
  event: NewEvent & { key: string };
  resolve: (a: Appended) => void;
  reject: (e: unknown) => void;
}

/**
 * Appends events to one run in order. `append` queues an event and resolves with its seq
 * once stored; events queued close together share a request (`POST /v1/runs/{id}/events`,
 * atomic per batch, one request at a time so order is kept). Each event gets an
 * idempotency key (`<keyPrefix>:<n>`) unless it has one, so a batch is retried as it was:
 * on `429`/`503` (and `502`/`504`) after `Retry-After`, and on a connection that failed,
 * where the server answers `replayed: true` if the first try had been written. A refusal
 * (a `4xx` with its code) fails that batch's events with an {@link AgentStreamError}.
 */
export class Producer {
  private readonly opts: ProducerOptions;
  private readonly url: string;
  private readonly prefix: string;
  private queue: Pending[] = [];
  private counter = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private running: Promise<void> | undefined;
  /** Requests sent so far (retries included). */
  requests = 0;

  constructor(opts: ProducerOptions) {
    this.opts = opts;
    this.url = `${trimBase(opts.baseUrl)}/v1/runs/${encodeURIComponent(opts.runId)}/events`;
    this.prefix = opts.keyPrefix ?? crypto.randomUUID();
  }

  /** Queues one event; resolves once it is stored. */
  append(event: NewEvent): Promise<Appended> {
    const keyed = { ...event, key: event.key ?? `${this.prefix}:${++this.counter}` } as NewEvent & { key: string };
    return new Promise<Appended>((resolve, reject) => {
      this.queue.push({ event: keyed, resolve, reject });
      if (this.queue.length >= (this.opts.maxBatch ?? 500)) this.kick();
      else this.timer ??= setTimeout(() => this.kick(), this.opts.lingerMs ?? 5);
    });
  }

  /** Queues several events, in order; resolves once all are stored. */
  appendAll(events: NewEvent[]): Promise<Appended[]> {
    return Promise.all(events.map((e) => this.append(e)));
  }

  /** Resolves once everything queued so far has been sent (stored or failed). */
  async flush(): Promise<void> {
    while (this.queue.length > 0 || this.running) {
      this.kick();
      await this.running;
    }
  }

  private kick(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.running ??= this.drain().finally(() => {
      this.running = undefined;
      if (this.queue.length > 0) this.kick();
    });
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, this.opts.maxBatch ?? 500);
      try {
        const r = await this.send(batch.map((p) => p.event));
        batch.forEach((p, i) => p.resolve({ seq: r.first_seq + i, key: p.event.key, replayed: r.replayed }));
      } catch (e) {
        for (const p of batch) p.reject(e);
      }
    }
  }

  private async send(events: NewEvent[]): Promise<{ first_seq: number; last_seq: number; replayed: boolean }> {
    const doFetch = this.opts.fetch ?? globalThis.fetch;
    const body = JSON.stringify(events);
    const tries = this.opts.maxAttempts ?? 20;
    let cause: unknown;
    for (let attempt = 0; attempt < tries; attempt++) {
      if (attempt > 0) await sleep(cause instanceof RetryAfter ? cause.ms : backoffMs(attempt - 1, this.opts.retryDelayMs ?? 100, 5000));
      this.requests++;
      let res: Response;
      try {
        res = await doFetch(this.url, {
          method: "POST",
          headers: { ...authHeaders(this.opts.apiKey), "Content-Type": "application/json" },
          body,
        });
      } catch (e) {
        cause = e; // no answer: the keys make the next try safe whether it was written or not
        continue;
      }
      if (res.ok) return (await res.json()) as { first_seq: number; last_seq: number; replayed: boolean };
      const err = await AgentStreamError.from(res);
      if (!retryable(res.status)) throw err;
      const ms = retryAfterMs(res);
      cause = ms === undefined ? err : new RetryAfter(ms, err);
    }
    throw cause instanceof RetryAfter ? cause.error : cause;
  }
}

/** A retryable answer that said how long to wait. */
class RetryAfter {
  constructor(
    readonly ms: number,
    readonly error: AgentStreamError,
  ) {}
}
