/** Following a run over Server-Sent Events, with automatic resume and no duplicates. */

import { type StoredEvent, isTerminal } from "./events.js";
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
import { parseSse } from "./sse.js";

/** Options of {@link followRun}. */
export interface FollowOptions extends Connection {
  /** The run to follow. */
  runId: string;
  /** Start after this seq (default 0: the whole run). */
  afterSeq?: number;
  /** Stops following (the iterator then ends quietly). */
  signal?: AbortSignal;
  /** First wait before reconnecting, in ms (default 100); doubles up to `maxRetryDelayMs`. */
  retryDelayMs?: number;
  /** Longest wait between reconnects, in ms (default 5000). */
  maxRetryDelayMs?: number;
  /** Reconnects in a row without receiving an event before giving up (default: never). */
  maxRetries?: number;
  /** Called before each reconnect, with what cut the stream. */
  onReconnect?: (info: { attempt: number; afterSeq: number; error: unknown }) => void;
}

/**
 * Follows a run over SSE (`GET /v1/runs/{id}/stream?detail=full`, native dialect): every
 * stored event from `afterSeq` on, then live ones, until the run's terminal lifecycle
 * event. A cut connection, a restarted service, `429` and `503` are retried (honouring
 * `Retry-After`), resuming with `Last-Event-ID` = the last seq received, and an event is
 * never yielded twice (seqs are checked). Ends at once for a run that has already ended
 * with nothing after `afterSeq` (`204`). Other refusals throw an {@link AgentStreamError}.
 */
export async function* followRun(opts: FollowOptions): AsyncGenerator<StoredEvent, void, undefined> {
  const doFetch = opts.fetch ?? globalThis.fetch;
  const url = `${trimBase(opts.baseUrl)}/v1/runs/${encodeURIComponent(opts.runId)}/stream?detail=full`;
  const base = opts.retryDelayMs ?? 100;
  const max = opts.maxRetryDelayMs ?? 5000;
  let last = opts.afterSeq ?? 0;
  let attempt = 0;
  for (;;) {
    if (opts.signal?.aborted) return;
    // One controller per connection: leaving the loop (or the caller's break) ends it.
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(opts.signal?.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    let wait: number | undefined;
    let cause: unknown;
    try {
      const headers: Record<string, string> = { ...authHeaders(opts.apiKey), Accept: "text/event-stream" };
      if (last > 0) headers["Last-Event-ID"] = String(last);
      const res = await doFetch(url, { headers, signal: ctl.signal });
      if (res.status === 204) return; // the run has ended and nothing is after `last`
      if (!res.ok || !res.body) {
        const err = await AgentStreamError.from(res);
        if (!retryable(res.status)) throw err;
        cause = err;
        wait = retryAfterMs(res);
      } else {
        for await (const msg of parseSse(res.body)) {
          let e: StoredEvent;
          try {
            e = JSON.parse(msg.data) as StoredEvent;
          } catch {
            continue; // not an event frame
          }
          if (typeof e?.seq !== "number" || e.seq <= last) continue;
          last = e.seq;
          attempt = 0;
          yield e;
          if (isTerminal(e)) return;
        }
        cause = new Error("the stream ended before the run did");
      }
    } catch (err) {
      if (opts.signal?.aborted) return;
      if (err instanceof AgentStreamError) throw err;
      cause = err; // a refused or cut connection: try again
    } finally {
      opts.signal?.removeEventListener("abort", onAbort);
      ctl.abort();
    }
    attempt++;
    if (opts.maxRetries !== undefined && attempt > opts.maxRetries) throw cause;
    opts.onReconnect?.({ attempt, afterSeq: last, error: cause });
    try {
      await sleep(wait ?? backoffMs(attempt - 1, base, max), opts.signal);
    } catch {
      return; // aborted while waiting
    }
  }
}
