/**
 * `@agent-stream/client`: follow an agent-stream run over SSE with resume and no
 * duplicates, append to it with a batching, retrying producer, and the event vocabulary
 * as types. GraphQL, the AI SDK and AG-UI are separate entry points
 * (`@agent-stream/client/graphql`, `/ai-sdk`, `/ag-ui`) so their packages stay optional.
 */

export * from "./events.js";
export { AgentStreamError, type Connection } from "./http.js";
export { followRun, type FollowOptions } from "./follow.js";
export { Producer, type ProducerOptions, type Appended } from "./producer.js";
export { parseSse, type SseMessage } from "./sse.js";
export { createRun, readEvents, type Run } from "./runs.js";
