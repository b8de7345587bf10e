/** Shared HTTP pieces: connection options, the error type, and retry timing. */

/** Where the service is and the key to use. */
export interface Connection {
  /** The service's base URL, such as `http://127.0.0.1:8080` (no trailing `/v1`). */
  baseUrl: string;
  /** An API key (`ask_...`), sent as `Authorization: Bearer <key>`. */
  apiKey: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
}

/** An error answer of the service: `{"error": {"code", "message", "index"?}}`. */
export class AgentStreamError extends Error {
  /** The stable error code, such as `RUN-CLOSED` (README: "Errors"). */
  readonly code: string;
  /** The HTTP status. */
  readonly status: number;
  /** The 0-based position of the offending event in a batch, when one is to blame. */
  readonly index?: number;

  constructor(status: number, code: string, message: string, index?: number) {
    super(`${code}: ${message}`);
    this.name = "AgentStreamError";
    this.status = status;
    this.code = code;
    if (index !== undefined) this.index = index;
  }

  /** Reads an error response's body into an error (a body of another shape keeps its text). */
  static async from(res: Response): Promise<AgentStreamError> {
    const text = await res.text().catch(() => "");
    try {
      const e = JSON.parse(text).error;
      if (e && typeof e.code === "string") return new AgentStreamError(res.status, e.code, String(e.message ?? ""), e.index);
    } catch {
      // not JSON: keep the text
    }
    return new AgentStreamError(res.status, `HTTP-${res.status}`, text.slice(0, 500));
  }
}

/** The base URL without a trailing slash. */
export function trimBase(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, "");
}

/** The `Authorization` header for a key. */
export function authHeaders(apiKey: string): Record<string, string> {
  return { Authorization: `Bearer ${apiKey}` };
}

/** Statuses worth another try: rate limited, unavailable, or a gateway in between. */
export function retryable(status: number): boolean {
  return status === 429 || status === 502 || status === 503 || status === 504;
}

/** How long `Retry-After` asks to wait, in ms (seconds or an HTTP date), if it is set. */
export function retryAfterMs(res: Response): number | undefined {
  const v = res.headers.get("retry-after");
  if (v == null) return undefined;
  const secs = Number(v);
  if (Number.isFinite(secs)) return Math.max(0, secs * 1000);
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** Exponential backoff from `base` ms, capped at `max` ms, with a little jitter. */
export function backoffMs(attempt: number, base: number, max: number): number {
  const d = Math.min(max, base * 2 ** Math.min(attempt, 16));
  return d * (0.8 + Math.random() * 0.4);
}

/** Waits `ms`, or until `signal` aborts (then rejects with its reason). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
