/**
 * Following a run over GraphQL (`runEvents` on `/graphql/ws`, with the `graphql-ws` client):
 * graphql-ws reconnects by itself, and the subscription's `afterSeq` follows the last seq
 * received, so a re-subscription asks for exactly what is missing (README: GraphQL,
 * "Reconnecting without duplicates").
 */

import { type Client, type ClientOptions, createClient } from "graphql-ws";
import { type StoredEvent, TERMINAL_STATES, type RunState, isTerminal } from "./events.js";
import { AgentStreamError, type Connection, authHeaders, trimBase } from "./http.js";

/** Options of {@link followRunGraphQL}. */
export interface GraphQLFollowOptions extends Connection {
  /** The run to follow. */
  runId: string;
  /** Start after this seq (default 0: the whole run). */
  afterSeq?: number;
  /** Stops following (the iterator then ends quietly). */
  signal?: AbortSignal;
  /** More `graphql-ws` client options (say, `webSocketImpl` where there is no global WebSocket). */
  clientOptions?: Partial<ClientOptions>;
}

/** The subscription {@link followRunGraphQL} sends. */
export const RUN_EVENTS_SUBSCRIPTION =
  "subscription($runId: ID!, $afterSeq: Int) { runEvents(runId: $runId, afterSeq: $afterSeq) { id seq ts type runId childId payload } }";

/** A `graphql-ws` client for the service: the key in `connection_init`, endless retries
 * (but not when the key is missing, `4401`, or refused, `4403`). */
export function graphqlClient(opts: Omit<GraphQLFollowOptions, "runId" | "afterSeq" | "signal">): Client {
  return createClient({
    url: `${trimBase(opts.baseUrl).replace(/^http/, "ws")}/graphql/ws`,
    connectionParams: { Authorization: `Bearer ${opts.apiKey}` },
    retryAttempts: Number.MAX_SAFE_INTEGER,
    retryWait: (n) => new Promise((r) => setTimeout(r, Math.min(5000, 100 * 2 ** n))),
    shouldRetry: (e) => !(isCloseEvent(e) && (e.code === 4401 || e.code === 4403)),
    ...opts.clientOptions,
  });
}

function isCloseEvent(e: unknown): e is { code: number } {
  return typeof e === "object" && e !== null && typeof (e as { code?: unknown }).code === "number";
}

/**
 * Follows a run over GraphQL: stored events from `afterSeq`, then live ones, until the run's
 * terminal event; across reconnects (a restarted service) each event comes once. Throws
 * what graphql-ws gives up with (GraphQL errors, or a close it does not retry).
 */
export async function* followRunGraphQL(opts: GraphQLFollowOptions): AsyncGenerator<StoredEvent, void, undefined> {
  // `runEvents` completes after the run's terminal event; resuming after that event, there
  // is nothing left to complete it, so a run that ended at or before `afterSeq` ends here.
  if ((opts.afterSeq ?? 0) > 0 && (await endedBy(opts, opts.afterSeq ?? 0))) return;
  const client = graphqlClient(opts);
  // graphql-ws serialises this object anew at each (re)subscribe: keeping `afterSeq` on the
  // last seq received is what makes a reconnect resume rather than start over.
  const variables = { runId: opts.runId, afterSeq: opts.afterSeq ?? 0 };
  const queue: StoredEvent[] = [];
  let done = false;
  let failure: unknown;
  let wake: (() => void) | undefined;
  const notify = () => {
    wake?.();
    wake = undefined;
  };
  const unsubscribe = client.subscribe<{ runEvents: GqlEvent }>(
    { query: RUN_EVENTS_SUBSCRIPTION, variables },
    {
      next: (msg) => {
        if (msg.errors?.length) {
          failure = new Error(msg.errors.map((e) => e.message).join("; "));
          done = true;
        } else if (msg.data) {
          const e = msg.data.runEvents;
          if (e.seq > variables.afterSeq) {
            variables.afterSeq = e.seq;
            queue.push(toStored(e));
          }
        }
        notify();
      },
      error: (err) => {
        failure = err instanceof Error ? err : new Error(`graphql-ws: ${describe(err)}`);
        done = true;
        notify();
      },
      complete: () => {
        done = true;
        notify();
      },
    },
  );
  const onAbort = () => {
    done = true;
    notify();
  };
  opts.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for (;;) {
      while (queue.length > 0 && !opts.signal?.aborted) {
        const e = queue.shift() as StoredEvent;
        yield e;
        if (isTerminal(e)) return;
      }
      if (opts.signal?.aborted) return;
      if (done) {
        if (failure) throw failure;
        return;
      }
      await new Promise<void>((r) => (wake = r));
    }
  } finally {
    opts.signal?.removeEventListener("abort", onAbort);
    unsubscribe();
    await client.dispose();
  }
}

/** True when the run has ended and its last event is at or before `seq`. */
async function endedBy(opts: GraphQLFollowOptions, seq: number): Promise<boolean> {
  const res = await (opts.fetch ?? globalThis.fetch)(`${trimBase(opts.baseUrl)}/graphql`, {
    method: "POST",
    headers: { ...authHeaders(opts.apiKey), "Content-Type": "application/json" },
    body: JSON.stringify({ query: "query($id: ID!) { run(id: $id) { lastSeq state } }", variables: { id: opts.runId } }),
  });
  if (!res.ok) throw await AgentStreamError.from(res);
  const body = (await res.json()) as { data?: { run: { lastSeq: number; state: string | null } | null }; errors?: { message: string }[] };
  if (body.errors?.length) throw new Error(body.errors.map((e) => e.message).join("; "));
  const run = body.data?.run;
  if (!run) return false; // let the subscription report it
  const state = run.state?.toLowerCase() as RunState | undefined;
  return state !== undefined && TERMINAL_STATES.includes(state) && run.lastSeq <= seq;
}

interface GqlEvent {
  id: string;
  seq: number;
  ts: string;
  type: string;
  runId: string;
  childId: string | null;
  payload: unknown;
}

function toStored(e: GqlEvent): StoredEvent {
  return { id: e.id, ts: e.ts, type: e.type, run_id: e.runId, child_id: e.childId, seq: e.seq, payload: e.payload } as StoredEvent;
}

function describe(err: unknown): string {
  if (isCloseEvent(err)) return `closed with ${err.code} ${(err as { reason?: string }).reason ?? ""}`.trim();
  if (Array.isArray(err)) return err.map((e) => e?.message ?? String(e)).join("; ");
  return String(err);
}
