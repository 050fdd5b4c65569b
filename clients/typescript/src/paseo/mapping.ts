// Pi's RPC events (Pi 0.84.2, docs/rpc.md of pi-coding-agent) to Paseo's stream events, for
// one session: a Paseo turn is one prompt (Pi's own "turns" are its model calls within it),
// text and thinking deltas are timeline items, tool executions are tool_call items by
// status, and agent_end closes the turn as completed, canceled (stopReason "aborted") or
// failed (stopReason "error"), unless Pi says it will retry.

import type { PiEvent } from "../pi.js";
import type { AgentProvider, AgentStreamEvent, AgentUsage, ToolCallDetail, ToolCallTimelineItem } from "./types.js";

interface PiUsage {
  input?: number;
  output?: number;
  cacheRead?: number;
  cost?: { total?: number };
}

interface PiAssistantMessage {
  role?: string;
  stopReason?: string;
  errorMessage?: string;
  usage?: PiUsage;
}

export function toUsage(u: PiUsage | undefined): AgentUsage | undefined {
  if (!u) return undefined;
  const usage: AgentUsage = {};
  if (typeof u.input === "number") usage.inputTokens = u.input;
  if (typeof u.cacheRead === "number") usage.cachedInputTokens = u.cacheRead;
  if (typeof u.output === "number") usage.outputTokens = u.output;
  if (typeof u.cost?.total === "number") usage.totalCostUsd = u.cost.total;
  return usage;
}

/** The text of a Pi tool result ({content: [{type: "text", text}]}), if any. */
export function resultText(result: unknown): string | undefined {
  const content = (result as { content?: unknown } | null | undefined)?.content;
  if (!Array.isArray(content)) return undefined;
  const texts = content.filter((c): c is { type: "text"; text: string } => c?.type === "text" && typeof c.text === "string").map((c) => c.text);
  return texts.length > 0 ? texts.join("\n") : undefined;
}

/** Paseo's detail of one of Pi's built-in tools (bash, read, edit, write, grep, find, ls). */
export function toolDetail(name: string, args: unknown, result: unknown): ToolCallDetail {
  const a = (args ?? {}) as Record<string, unknown>;
  const str = (v: unknown) => (typeof v === "string" ? v : undefined);
  const output = resultText(result);
  switch (name) {
    case "bash":
      return { type: "shell", command: str(a.command) ?? "", ...(output !== undefined ? { output } : {}) };
    case "read":
      return {
        type: "read",
        filePath: str(a.path) ?? "",
        ...(output !== undefined ? { content: output } : {}),
        ...(typeof a.offset === "number" ? { offset: a.offset } : {}),
        ...(typeof a.limit === "number" ? { limit: a.limit } : {}),
      };
    case "write":
      return { type: "write", filePath: str(a.path) ?? "", ...(str(a.content) !== undefined ? { content: str(a.content) } : {}) };
    case "edit": {
      // Pi 0.84's edit takes edits[]: {oldText, newText}; one edit maps whole.
      const edits = Array.isArray(a.edits) ? (a.edits as Array<Record<string, unknown>>) : [];
      const one = edits.length === 1 ? edits[0] : undefined;
      return {
        type: "edit",
        filePath: str(a.path) ?? "",
        ...(one && str(one.oldText) !== undefined ? { oldString: str(one.oldText) } : {}),
        ...(one && str(one.newText) !== undefined ? { newString: str(one.newText) } : {}),
      };
    }
    case "grep":
      return { type: "search", query: str(a.pattern) ?? "", toolName: "grep", ...(output !== undefined ? { content: output } : {}) };
    case "find":
    case "ls":
      return { type: "search", query: str(a.pattern) ?? str(a.path) ?? "", toolName: "glob", ...(output !== undefined ? { content: output } : {}) };
    default:
      return { type: "unknown", input: args ?? null, output: result ?? null };
  }
}

export class PiToPaseo {
  private readonly provider: AgentProvider;
  private readonly sessionId: () => string;
  private turnId: string | undefined;
  private turnStarted = false;
  private readonly tools = new Map<string, { name: string; args: unknown }>();
  private last: PiAssistantMessage | undefined;

  constructor(provider: AgentProvider, sessionId: () => string) {
    this.provider = provider;
    this.sessionId = sessionId;
  }

  /** The turn the next events belong to (set by startTurn, cleared when it ends). */
  begin(turnId: string): void {
    this.turnId = turnId;
    this.turnStarted = false;
    this.last = undefined;
  }

  get activeTurn(): string | undefined {
    return this.turnId;
  }

  /** Ends the active turn as failed for a reason outside Pi (the sandbox ended). */
  fail(error: string, code: string): AgentStreamEvent[] {
    const turnId = this.turnId;
    if (turnId === undefined) return [];
    this.turnId = undefined;
    return [{ type: "turn_failed", provider: this.provider, turnId, error, code }];
  }

  map(e: PiEvent): AgentStreamEvent[] {
    const provider = this.provider;
    const turnId = this.turnId;
    const withTurn = turnId === undefined ? {} : { turnId };
    switch (e.type) {
      case "agent_start":
        return [{ type: "thread_started", provider, sessionId: this.sessionId() }];
      case "turn_start":
        if (this.turnStarted) return [];
        this.turnStarted = true;
        return [{ type: "turn_started", provider, ...withTurn }];
      case "message_update": {
        const m = e.message as PiAssistantMessage | undefined;
        const ame = e.assistantMessageEvent as { type?: string; delta?: string } | undefined;
        // Pi's RPC mode may leave the partial message out of message_update; when it is
        // there, only the assistant's counts.
        if ((m !== undefined && m.role !== "assistant") || typeof ame?.delta !== "string") return [];
        if (ame.type === "text_delta") return [{ type: "timeline", provider, ...withTurn, item: { type: "assistant_message", text: ame.delta } }];
        if (ame.type === "thinking_delta") return [{ type: "timeline", provider, ...withTurn, item: { type: "reasoning", text: ame.delta } }];
        return [];
      }
      case "message_end": {
        const m = e.message as PiAssistantMessage | undefined;
        if (m?.role === "assistant") this.last = m;
        return [];
      }
      case "tool_execution_start":
      case "tool_execution_update":
      case "tool_execution_end": {
        const id = String(e.toolCallId ?? "");
        const name = String(e.toolName ?? "");
        if (e.type === "tool_execution_start") this.tools.set(id, { name, args: e.args });
        const known = this.tools.get(id) ?? { name, args: e.args };
        let status: ToolCallTimelineItem["status"] = "running";
        let error: unknown = null;
        const result = e.type === "tool_execution_update" ? e.partialResult : e.result;
        if (e.type === "tool_execution_end") {
          this.tools.delete(id);
          status = e.isError === true ? "failed" : "completed";
          if (status === "failed") error = resultText(e.result) ?? e.result ?? "failed";
        }
        const item: ToolCallTimelineItem = { type: "tool_call", callId: id, name: known.name, detail: toolDetail(known.name, known.args, result), status, error };
        return [{ type: "timeline", provider, ...withTurn, item }];
      }
      case "compaction_start":
        return [{ type: "timeline", provider, ...withTurn, item: { type: "compaction", status: "loading", trigger: e.reason === "manual" ? "manual" : "auto" } }];
      case "compaction_end":
        return [{ type: "timeline", provider, ...withTurn, item: { type: "compaction", status: "completed" } }];
      case "agent_end": {
        if (e.willRetry === true) return [];
        const last = this.last;
        this.turnId = undefined;
        this.last = undefined;
        for (const [id] of this.tools) this.tools.delete(id);
        if (last?.stopReason === "aborted") return [{ type: "turn_canceled", provider, ...withTurn, reason: "interrupted" }];
        if (last?.stopReason === "error") return [{ type: "turn_failed", provider, ...withTurn, error: last.errorMessage ?? "the model request failed" }];
        const usage = toUsage(last?.usage);
        return [{ type: "turn_completed", provider, ...withTurn, ...(usage ? { usage } : {}) }];
      }
      default:
        // agent_settled, turn_end, message_start, extension_ui_request, responses of an
        // earlier client: nothing Paseo's stream carries.
        return [];
    }
  }
}
