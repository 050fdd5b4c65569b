// Pi's RPC events to Paseo's stream events, frame by frame, in the shapes Pi 0.84.2 emits
// (its agent loop and docs/rpc.md); paseo.test.ts checks the same mapping on the real Pi.

import assert from "node:assert/strict";
import { test } from "node:test";

import { PiToPaseo, toolDetail, toPiPrompt, type AgentStreamEvent } from "../src/paseo/index.js";

const assistant = (stopReason: string, extra: Record<string, unknown> = {}) => ({ role: "assistant", stopReason, ...extra });

function run(frames: Array<Record<string, unknown>>, turnId = "t1"): AgentStreamEvent[] {
  const m = new PiToPaseo("pi-sandboxed", () => "sess-1");
  m.begin(turnId);
  return frames.flatMap((f) => m.map(f as { type: string }));
}

test("a text turn: thread, one turn_started for Pi's several turns, deltas, completed with usage", () => {
  const events = run([
    { type: "agent_start" },
    { type: "turn_start" },
    { type: "message_start", message: { role: "assistant" } },
    { type: "message_update", message: { role: "assistant" }, assistantMessageEvent: { type: "thinking_delta", delta: "hmm" } },
    { type: "message_update", message: { role: "assistant" }, assistantMessageEvent: { type: "text_delta", delta: "hel" } },
    { type: "message_update", assistantMessageEvent: { type: "text_delta", delta: "lo" } },
    { type: "message_update", message: { role: "user" }, assistantMessageEvent: { type: "text_delta", delta: "not mine" } },
    { type: "message_end", message: assistant("stop", { usage: { input: 10, output: 3, cacheRead: 2, cost: { total: 0.5 } } }) },
    { type: "turn_end" },
    { type: "turn_start" },
    { type: "agent_end", messages: [], willRetry: false },
    { type: "agent_settled" },
    { type: "extension_ui_request", id: "x", method: "setStatus" },
  ]);
  const p = { provider: "pi-sandboxed", turnId: "t1" };
  assert.deepEqual(events, [
    { type: "thread_started", provider: "pi-sandboxed", sessionId: "sess-1" },
    { type: "turn_started", ...p },
    { type: "timeline", ...p, item: { type: "reasoning", text: "hmm" } },
    { type: "timeline", ...p, item: { type: "assistant_message", text: "hel" } },
    { type: "timeline", ...p, item: { type: "assistant_message", text: "lo" } },
    { type: "turn_completed", ...p, usage: { inputTokens: 10, cachedInputTokens: 2, outputTokens: 3, totalCostUsd: 0.5 } },
  ]);
});

test("tool executions: running, updated, completed or failed, with Paseo's detail", () => {
  const events = run([
    { type: "tool_execution_start", toolCallId: "c1", toolName: "write", args: { path: "A.md", content: "a" } },
    { type: "tool_execution_end", toolCallId: "c1", toolName: "write", result: { content: [{ type: "text", text: "Wrote 1 bytes" }] }, isError: false },
    { type: "tool_execution_start", toolCallId: "c2", toolName: "bash", args: { command: "ls" } },
    { type: "tool_execution_update", toolCallId: "c2", toolName: "bash", args: { command: "ls" }, partialResult: { content: [{ type: "text", text: "a" }] } },
    { type: "tool_execution_end", toolCallId: "c2", toolName: "bash", result: { content: [{ type: "text", text: "denied" }] }, isError: true },
  ]);
  const items = events.map((e) => (e.type === "timeline" ? e.item : e));
  assert.deepEqual(items, [
    { type: "tool_call", callId: "c1", name: "write", detail: { type: "write", filePath: "A.md", content: "a" }, status: "running", error: null },
    { type: "tool_call", callId: "c1", name: "write", detail: { type: "write", filePath: "A.md", content: "a" }, status: "completed", error: null },
    { type: "tool_call", callId: "c2", name: "bash", detail: { type: "shell", command: "ls" }, status: "running", error: null },
    { type: "tool_call", callId: "c2", name: "bash", detail: { type: "shell", command: "ls", output: "a" }, status: "running", error: null },
    { type: "tool_call", callId: "c2", name: "bash", detail: { type: "shell", command: "ls", output: "denied" }, status: "failed", error: "denied" },
  ]);
});

test("an aborted turn is canceled, an errored one failed, a retried one goes on", () => {
  const aborted = run([{ type: "message_end", message: assistant("aborted") }, { type: "agent_end" }]);
  assert.deepEqual(aborted, [{ type: "turn_canceled", provider: "pi-sandboxed", turnId: "t1", reason: "interrupted" }]);
  const failed = run([{ type: "message_end", message: assistant("error", { errorMessage: "401 Unauthorized" }) }, { type: "agent_end" }]);
  assert.deepEqual(failed, [{ type: "turn_failed", provider: "pi-sandboxed", turnId: "t1", error: "401 Unauthorized" }]);
  const retried = run([{ type: "message_end", message: assistant("error") }, { type: "agent_end", willRetry: true }]);
  assert.deepEqual(retried, []);
});

test("compaction, and a turn the sandbox ended", () => {
  const m = new PiToPaseo("p", () => "s");
  m.begin("t9");
  assert.deepEqual(m.map({ type: "compaction_start", reason: "threshold" }), [{ type: "timeline", provider: "p", turnId: "t9", item: { type: "compaction", status: "loading", trigger: "auto" } }]);
  assert.deepEqual(m.map({ type: "compaction_end" }), [{ type: "timeline", provider: "p", turnId: "t9", item: { type: "compaction", status: "completed" } }]);
  assert.deepEqual(m.fail("the sandbox was ended at its wallSeconds limit", "wallSeconds"), [
    { type: "turn_failed", provider: "p", turnId: "t9", error: "the sandbox was ended at its wallSeconds limit", code: "wallSeconds" },
  ]);
  assert.deepEqual(m.fail("again", "x"), [], "a turn fails once");
});

test("tool details of Pi's built-in tools", () => {
  assert.deepEqual(toolDetail("read", { path: "a.ts", offset: 3 }, { content: [{ type: "text", text: "x" }] }), { type: "read", filePath: "a.ts", content: "x", offset: 3 });
  assert.deepEqual(toolDetail("edit", { path: "a.ts", edits: [{ oldText: "a", newText: "b" }] }, null), { type: "edit", filePath: "a.ts", oldString: "a", newString: "b" });
  assert.deepEqual(toolDetail("grep", { pattern: "foo" }, null), { type: "search", query: "foo", toolName: "grep" });
  assert.deepEqual(toolDetail("paseo_paseo_ping", { a: 1 }, { content: [] }), { type: "unknown", input: { a: 1 }, output: { content: [] } });
});

test("Paseo's prompt blocks become Pi's prompt", () => {
  assert.deepEqual(toPiPrompt("hi"), { message: "hi", images: [] });
  assert.deepEqual(
    toPiPrompt([
      { type: "text", text: "a" },
      { type: "image", data: "AAAA", mimeType: "image/png" },
      { type: "text", text: "b" },
    ]),
    { message: "a\n\nb", images: [{ type: "image", data: "AAAA", mimeType: "image/png" }] },
  );
});
