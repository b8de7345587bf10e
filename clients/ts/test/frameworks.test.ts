// The AI SDK and AG-UI helpers, with the real packages: a frontend posts a user message,
// a runtime answers by appending, the frontend sees the answer stream.

import assert from "node:assert/strict";
import { test } from "node:test";
import { AbstractChat, type ChatState, type UIMessage } from "ai";
import { chatTransport } from "../src/ai-sdk.js";
import { aguiAgent } from "../src/ag-ui.js";
import { allEvents, append, conn, newRun, until } from "./env.js";

class PlainState implements ChatState<UIMessage> {
  status: ChatState<UIMessage>["status"] = "ready";
  error: Error | undefined = undefined;
  messages: UIMessage[] = [];
  pushMessage = (m: UIMessage) => void (this.messages = this.messages.concat(m));
  popMessage = () => void (this.messages = this.messages.slice(0, -1));
  replaceMessage = (i: number, m: UIMessage) => void (this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]);
  snapshot = <T>(v: T): T => structuredClone(v);
}

class PlainChat extends AbstractChat<UIMessage> {}

/** The runtime's side: once the user's message is in the run, answer it and end. */
async function answerOnce(run: string, text: string): Promise<void> {
  await until("the user message", async () => (await allEvents(run)).some((e) => e.type === "message.end"));
  await append(run, [
    { type: "message.start", payload: { message_id: "a1", role: "assistant" } },
    { type: "text.delta", payload: { text, message_id: "a1" } },
    { type: "message.end", payload: { message_id: "a1" } },
    { type: "run.lifecycle", payload: { state: "done" } },
  ]);
}

test("chatTransport: sendMessage appends the user message and streams the answer", async () => {
  const run = await newRun();
  await append(run, [{ type: "run.lifecycle", payload: { state: "running" } }]);
  const chat = new PlainChat({ id: run, state: new PlainState(), transport: chatTransport({ ...conn }) });
  await Promise.all([chat.sendMessage({ text: "Compare the offers" }), answerOnce(run, "Offer B.")]);
  assert.equal(chat.error, undefined);
  const answer = chat.messages.find((m) => m.role === "assistant");
  assert.ok(answer, JSON.stringify(chat.messages));
  const text = answer.parts.flatMap((p) => (p.type === "text" ? [p.text] : [])).join("");
  assert.equal(text, "Offer B.");
  const user = (await allEvents(run)).find((e) => e.type === "message.end" && e.payload.text === "Compare the offers");
  assert.ok(user, "the user's message is in the run");
});

test("aguiAgent: runAgent appends the user message and streams the answer", async () => {
  const run = await newRun();
  await append(run, [{ type: "run.lifecycle", payload: { state: "running" } }]);
  const agent = aguiAgent({ ...conn, runId: run });
  agent.addMessage({ id: "u1", role: "user", content: "Compare the offers" });
  const types: string[] = [];
  await Promise.all([agent.runAgent({}, { onEvent: ({ event }) => void types.push(event.type) }), answerOnce(run, "Offer B.")]);
  const answer = agent.messages.find((m) => m.role === "assistant");
  assert.ok(answer, JSON.stringify(agent.messages));
  assert.equal(answer.content, "Offer B.");
  assert.ok(types.includes("RUN_FINISHED"), types.join(","));
});
