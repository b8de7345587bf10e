/**
 * AG-UI (`@ag-ui/client` 1.0) wired to a run: an `HttpAgent` whose `threadId` is the run id,
 * pointed at `POST /v1/agui` (README: "Standard clients"). CopilotKit takes it as an agent.
 */

import { HttpAgent, type HttpAgentConfig } from "@ag-ui/client";
import { type Connection, authHeaders, trimBase } from "./http.js";

/** Options of {@link aguiAgent}: the connection, the run, and any other agent option. */
export type AguiAgentOptions = Omit<Connection, "fetch"> &
  Omit<HttpAgentConfig, "url" | "threadId"> & {
    /** The run this agent's thread is. */
    runId: string;
  };

/** An `HttpAgent` pointed at the service's `/v1/agui`, its thread being the run. */
export function aguiAgent(opts: AguiAgentOptions): HttpAgent {
  const { baseUrl, apiKey, runId, headers, ...rest } = opts;
  return new HttpAgent({
    ...rest,
    url: `${trimBase(baseUrl)}/v1/agui`,
    headers: { ...headers, ...authHeaders(apiKey) },
    threadId: runId,
  });
}
