/** Creating a run and reading a page of its events. */

import type { StoredEvent } from "./events.js";
import { AgentStreamError, type Connection, authHeaders, trimBase } from "./http.js";

/** A run as the service returns it. */
export interface Run {
  run_id: string;
  parent_run_id: string | null;
  root_run_id: string;
  created_at: string;
  updated_at: string;
  last_seq: number;
  state: string | null;
}

/** Creates a run (a sub-run of `parentRunId` when given). */
export async function createRun(conn: Connection, parentRunId?: string): Promise<Run> {
  const res = await (conn.fetch ?? globalThis.fetch)(`${trimBase(conn.baseUrl)}/v1/runs`, {
    method: "POST",
    headers: { ...authHeaders(conn.apiKey), "Content-Type": "application/json" },
    body: JSON.stringify(parentRunId ? { parent_run_id: parentRunId } : {}),
  });
  if (!res.ok) throw await AgentStreamError.from(res);
  return (await res.json()) as Run;
}

/** One page of a run's events after `afterSeq` (at most `limit`, 1..10000). */
export async function readEvents(
  conn: Connection,
  runId: string,
  afterSeq = 0,
  limit = 1000,
): Promise<{ last_seq: number; next_after_seq: number; events: StoredEvent[] }> {
  const url = `${trimBase(conn.baseUrl)}/v1/runs/${encodeURIComponent(runId)}/events?after_seq=${afterSeq}&limit=${limit}`;
  const res = await (conn.fetch ?? globalThis.fetch)(url, { headers: authHeaders(conn.apiKey) });
  if (!res.ok) throw await AgentStreamError.from(res);
  return (await res.json()) as { last_seq: number; next_after_seq: number; events: StoredEvent[] };
}
