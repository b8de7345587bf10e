/**
 * The AI SDK (`ai` 7) wired to a run: `useChat({ id: runId, transport: chatTransport(...) })`.
 * The chat id is the run id; `sendMessage` POSTs `/v1/chat` and `resumeStream` GETs
 * `/v1/chat/{run_id}/stream` (README: "Standard clients").
 */

import { DefaultChatTransport, type HttpChatTransportInitOptions, type UIMessage } from "ai";
import { type Connection, authHeaders, trimBase } from "./http.js";

/** Options of {@link chatTransport}: the connection, and any other transport option. */
export type ChatTransportOptions<M extends UIMessage> = Omit<Connection, "fetch"> &
  Omit<HttpChatTransportInitOptions<M>, "api" | "headers"> & {
    /** More headers to send (the key's `Authorization` is set). */
    headers?: Record<string, string>;
  };

/** A `DefaultChatTransport` pointed at the service's `/v1/chat` with the key set. */
export function chatTransport<M extends UIMessage = UIMessage>(opts: ChatTransportOptions<M>): DefaultChatTransport<M> {
  const { baseUrl, apiKey, headers, ...rest } = opts;
  return new DefaultChatTransport<M>({
    ...rest,
    api: `${trimBase(baseUrl)}/v1/chat`,
    headers: { ...headers, ...authHeaders(apiKey) },
  });
}
