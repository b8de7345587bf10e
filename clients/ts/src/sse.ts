/** A Server-Sent Events parser over a fetch body (the WHATWG event-stream rules). */

/** One dispatched SSE event. */
export interface SseMessage {
  /** The `event:` field (`message` when absent). */
  event: string;
  /** The `data:` lines, joined with newlines. */
  data: string;
  /** The last `id:` seen so far in the stream (the position to resume after). */
  id: string | undefined;
  /** The `retry:` hint in ms, if this event carried one. */
  retry?: number;
}

/** Parses a `text/event-stream` body into messages as they arrive. */
export async function* parseSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let data: string[] = [];
  let event = "";
  let lastId: string | undefined;
  let retry: number | undefined;
  let sawCr = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return; // an event not ended by a blank line is dropped, as the spec says
      let chunk = decoder.decode(value, { stream: true });
      // A CRLF split across two chunks: the LF belongs to the CR already handled.
      if (sawCr && chunk.startsWith("\n")) chunk = chunk.slice(1);
      sawCr = chunk.endsWith("\r");
      buf += chunk;
      let m: RegExpExecArray | null;
      const eol = /\r\n|\r|\n/g;
      let start = 0;
      while ((m = eol.exec(buf)) !== null) {
        if (m[0] === "\r" && m.index === buf.length - 1) break; // maybe a CRLF split: wait
        const line = buf.slice(start, m.index);
        start = m.index + m[0].length;
        if (line === "") {
          if (data.length > 0) {
            const msg: SseMessage = { event: event || "message", data: data.join("\n"), id: lastId };
            if (retry !== undefined) msg.retry = retry;
            yield msg;
          }
          data = [];
          event = "";
          retry = undefined;
          continue;
        }
        if (line.startsWith(":")) continue; // a comment (keep-alive)
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") data.push(val);
        else if (field === "event") event = val;
        else if (field === "id" && !val.includes("\0")) lastId = val;
        else if (field === "retry" && /^\d+$/.test(val)) retry = Number(val);
      }
      buf = buf.slice(start);
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}
