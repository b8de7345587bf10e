/**
 * The event vocabulary of agent-stream as TypeScript types (README: "Event vocabulary").
 * `EVENT_TYPES` is checked against the server's own list by the Rust test
 * `clients::the_typescript_event_types_match_the_server_vocabulary`, and every payload
 * shape by `npm test` (a sample of each type, typed here, must be accepted by the server).
 */

/** Every built-in event type, in the server's order. `custom.<name>` is open-ended. */
export const EVENT_TYPES = [
  "run.lifecycle",
  "message.start",
  "message.end",
  "text.delta",
  "reasoning.delta",
  "tool.start",
  "tool.progress",
  "tool.end",
  "step.boundary",
  "child.spawn",
  "plan.proposal",
  "plan.decision",
  "compaction.start",
  "compaction.end",
] as const;

/** A built-in event type. */
export type BuiltinEventType = (typeof EVENT_TYPES)[number];
/** A custom event type: `custom.` then 1 to 128 of letters, digits and `_ - . :`. */
export type CustomEventType = `custom.${string}`;
/** Any event type the server stores. */
export type EventType = BuiltinEventType | CustomEventType;

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A run's (or a child's) lifecycle state. */
export type RunState =
  | "planning"
  | "awaiting_approval"
  | "running"
  | "paused"
  | "redirecting"
  | "done"
  | "aborted"
  | "error";

/** The states after which nothing more is appended. */
export const TERMINAL_STATES: readonly RunState[] = ["done", "aborted", "error"];

/** Who wrote a message. */
export type Role = "user" | "assistant" | "system";
/** What a step boundary closes. */
export type StepKind = "plan" | "tool-roundtrip" | "text-only" | "fan-out" | "fan-in" | "done";
/** What a plan step intends to do. */
export type Intent = "research" | "write" | "edit" | "execute" | "verify" | "report" | "other";

/** `run.lifecycle` */
export interface LifecyclePayload { state: RunState; reason?: string }
/** `message.start` */
export interface MessageStartPayload { message_id: string; role: Role }
/** `message.end`; `text`, when given, must equal the streamed text. */
export interface MessageEndPayload { message_id?: string; stop_reason?: string; text?: string }
/** `text.delta` and `reasoning.delta` */
export interface DeltaPayload { text: string; message_id?: string }
/** `tool.start` */
export interface ToolStartPayload { call_id: string; tool: string; input?: Json; skill_id?: string }
/** `tool.progress` */
export interface ToolProgressPayload { call_id: string; data?: Json }
/** `tool.end` */
export interface ToolEndPayload {
  call_id: string;
  ok: boolean;
  output?: Json;
  error?: Json;
  duration_ms?: number;
  blob_ref?: string;
}
/** `step.boundary` */
export interface StepBoundaryPayload { step_index: number; step_kind: StepKind; checkpoint_id?: string }
/** `child.spawn` */
export interface ChildSpawnPayload { child_id: string; prompt?: string; tools_allowed?: string[] }
/** One step of a proposed plan. */
export interface PlanStep { id: string; title: string; intent: Intent; est_tools?: string[]; est_cost_usd?: number }
/** A proposed plan. */
export interface Plan { id: string; run_id?: string; steps: PlanStep[]; est_total_cost_usd?: number }
/** `plan.proposal` */
export interface PlanProposalPayload { plan: Plan }
/** `plan.decision` (written only by the service). */
export interface PlanDecisionPayload {
  plan_id: string;
  decision: "approved" | "rejected";
  reason?: string;
  decided_by?: string;
}
/** `compaction.start` */
export interface CompactionStartPayload { reason?: string }
/** `compaction.end` */
export interface CompactionEndPayload {
  removed: number;
  kept: number;
  tokens_removed?: number;
  tokens_kept?: number;
  reason: string;
}

/** The payload of each built-in type. */
export interface PayloadOf {
  "run.lifecycle": LifecyclePayload;
  "message.start": MessageStartPayload;
  "message.end": MessageEndPayload;
  "text.delta": DeltaPayload;
  "reasoning.delta": DeltaPayload;
  "tool.start": ToolStartPayload;
  "tool.progress": ToolProgressPayload;
  "tool.end": ToolEndPayload;
  "step.boundary": StepBoundaryPayload;
  "child.spawn": ChildSpawnPayload;
  "plan.proposal": PlanProposalPayload;
  "plan.decision": PlanDecisionPayload;
  "compaction.start": CompactionStartPayload;
  "compaction.end": CompactionEndPayload;
}

/** What a producer sends: a typed built-in event or a custom one. */
export type NewEvent =
  | { [T in BuiltinEventType]: { type: T; payload: PayloadOf[T]; child_id?: string; key?: string } }[BuiltinEventType]
  | { type: CustomEventType; payload?: Json; child_id?: string; key?: string };

/** A stored event as the server returns it; `type` narrows `payload`. */
export type StoredEvent =
  | {
      [T in BuiltinEventType]: {
        id: string;
        ts: string;
        type: T;
        run_id: string;
        child_id: string | null;
        seq: number;
        payload: PayloadOf[T];
      };
    }[BuiltinEventType]
  | {
      id: string;
      ts: string;
      type: CustomEventType;
      run_id: string;
      child_id: string | null;
      seq: number;
      payload: Json;
    };

/** True for the run's own terminal `run.lifecycle` event (a child's ends only the child). */
export function isTerminal(e: StoredEvent): boolean {
  return e.type === "run.lifecycle" && e.child_id == null && TERMINAL_STATES.includes(e.payload.state);
}
