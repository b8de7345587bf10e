// What the tests need from outside: a running service and a key with read and write
// (AGENT_STREAM_URL, AGENT_STREAM_KEY); to kill and restart a service of their own, the
// binary (AGENT_STREAM_BIN) with the database it uses (DATABASE_URL, AGENT_STREAM_SCHEMA).
// `cargo test --test it clients::the_typescript_client_package_tests_pass` sets them all.

import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { type NewEvent, type StoredEvent, createRun, readEvents } from "../src/index.js";

function need(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run npm test against a service (see README, "Tests")`);
  return v;
}

/** The shared service. */
export const conn = { baseUrl: need("AGENT_STREAM_URL"), apiKey: need("AGENT_STREAM_KEY") };

/** Why the restart tests cannot run here, if they cannot. */
export const noServerBinary = process.env.AGENT_STREAM_BIN ? false : "AGENT_STREAM_BIN is not set";

/** A new run on the shared service. */
export async function newRun(): Promise<string> {
  return (await createRun(conn)).run_id;
}

/** Appends a batch on the shared service and returns its last seq. */
export async function append(runId: string, events: NewEvent[]): Promise<number> {
  const res = await fetch(`${conn.baseUrl}/v1/runs/${runId}/events`, {
    method: "POST",
    headers: { Authorization: `Bearer ${conn.apiKey}`, "Content-Type": "application/json" },
    body: JSON.stringify(events),
  });
  if (!res.ok) throw new Error(`append: ${res.status} ${await res.text()}`);
  return ((await res.json()) as { last_seq: number }).last_seq;
}

/** Every event of a run, read page by page. */
export async function allEvents(runId: string): Promise<StoredEvent[]> {
  const out: StoredEvent[] = [];
  for (let after = 0; ; ) {
    const page = await readEvents(conn, runId, after);
    out.push(...page.events);
    if (page.events.length === 0) return out;
    after = page.next_after_seq;
  }
}

/** A text delta. */
export function delta(text: string): NewEvent {
  return { type: "text.delta", payload: { text } };
}

/** Waits until `check` holds (polling), or fails after `ms`. */
export async function until(what: string, check: () => boolean | Promise<boolean>, ms = 20000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => (typeof a === "object" && a ? resolve(a.port) : reject(new Error("no port"))));
    });
  });
}

/** A service process of the test's own, on the shared service's database, that can be
 * SIGKILLed and started again on the same port. */
export class OwnServer {
  private child: ChildProcess | undefined;
  private constructor(
    readonly port: number,
    private readonly env: Record<string, string>,
  ) {}

  /** Starts one; `env` adds settings (say, AGENT_STREAM_APPEND_RATE). */
  static async start(env: Record<string, string> = {}): Promise<OwnServer> {
    const s = new OwnServer(await freePort(), env);
    await s.restart();
    return s;
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async restart(): Promise<void> {
    for (let tries = 0; tries < 5; tries++) {
      const child = spawn(need("AGENT_STREAM_BIN"), ["serve", "--retention-interval", "0"], {
        env: { ...process.env, AGENT_STREAM_LISTEN: `127.0.0.1:${this.port}`, RUST_LOG: "warn", ...this.env },
        stdio: ["ignore", "ignore", "inherit"],
      });
      this.child = child;
      let exited = false;
      child.once("exit", () => (exited = true));
      for (let i = 0; i < 300 && !exited; i++) {
        try {
          if ((await fetch(`${this.baseUrl}/healthz`)).ok) return;
        } catch {
          // not up yet
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      child.kill("SIGKILL");
      await new Promise((r) => setTimeout(r, 200)); // the port was not free yet: again
    }
    throw new Error("the service did not start");
  }

  /** SIGKILL: no shutdown, connections are reset. */
  async kill(): Promise<void> {
    const c = this.child;
    this.child = undefined;
    if (!c || c.exitCode !== null) return;
    const gone = new Promise((r) => c.once("exit", r));
    c.kill("SIGKILL");
    await gone;
  }
}
