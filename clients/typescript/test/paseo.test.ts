// The Paseo provider against the real supervisor and the real Pi in gVisor (world.ts): the
// AgentClient/AgentSession a Paseo daemon would register, and its event mapping on the
// frames the real Pi sends.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, test } from "node:test";

import { SupervisorError } from "../src/index.js";
import { SandboxedPiAgentClient, type AgentSession, type AgentStreamEvent } from "../src/paseo/index.js";
import { until, world } from "./world.js";

const w = world();
const T = { timeout: 180_000 };
const config = { provider: "pi-sandboxed", cwd: "/srv/paseo/workspace/proj-feature" };

function client(onClose: "delete" | "detach" = "delete"): SandboxedPiAgentClient {
  return new SandboxedPiAgentClient({ socketPath: w.socket, deployment: w.deployment, facts: () => w.facts, mcpToken: w.mcpToken, onClose });
}

const open: Array<{ sandbox: string }> = [];
afterEach(async () => {
  // Whatever a test left (a failure, a detached session) is deleted.
  const c = client();
  for (const { sandbox } of open.splice(0)) {
    const s = await c.resumeSession({ provider: "pi-sandboxed", sessionId: "x", metadata: { sandbox } }).catch((e: unknown) => {
      if (e instanceof SupervisorError || e instanceof Error) return undefined;
      throw e;
    });
    await s?.close();
  }
});

function record(s: AgentSession): AgentStreamEvent[] {
  const events: AgentStreamEvent[] = [];
  s.subscribe((e) => events.push(e));
  return events;
}

test("the provider: available, a turn through run(), Paseo's events in order", T, async () => {
  const c = client();
  assert.equal(await c.isAvailable(), true);
  assert.equal(await new SandboxedPiAgentClient({ socketPath: "/nonexistent/sock", deployment: "x", facts: () => ({}) }).isAvailable(), false);
  const s = await c.createSession(config);
  open.push({ sandbox: s.sandbox });
  const events = record(s);
  assert.ok(s.id, "Pi's session id");

  const r = await s.run("hello");
  assert.equal(r.finalText, w.turnText);
  assert.equal(r.sessionId, s.id);
  const types = events.map((e) => e.type);
  assert.equal(types[0], "thread_started");
  assert.equal(types[1], "turn_started");
  assert.equal(types.at(-1), "turn_completed");
  assert.equal(types.filter((t) => t === "turn_started").length, 1);
  const turnIds = new Set(events.filter((e) => "turnId" in e).map((e) => (e as { turnId?: string }).turnId));
  assert.equal(turnIds.size, 1, "every event of the turn carries its id");
  const done = events.at(-1);
  assert.ok(done?.type === "turn_completed" && (done.usage?.outputTokens ?? 0) > 0, "usage from Pi's message");

  const info = await s.getRuntimeInfo();
  assert.equal(info.model, "fake/fake-1");
  const handle = s.describePersistence();
  assert.equal(handle?.metadata?.sandbox, s.sandbox);
  assert.ok(handle?.nativeHandle?.endsWith(".jsonl"), "Pi's session log");
  await s.close();
});

test("a tool call: the real Pi's write runs in the sandbox, mapped to a tool_call timeline", T, async () => {
  const s = await client().createSession(config);
  open.push({ sandbox: s.sandbox });
  const events = record(s);
  const r = await s.run(`${w.tool.prefix} write ${w.tool.file}`);
  assert.equal(r.finalText, w.tool.text);
  const calls = r.timeline.filter((i) => i.type === "tool_call");
  assert.deepEqual(
    calls.map((c) => [c.status, c.name, c.detail]),
    [
      ["running", "write", { type: "write", filePath: w.tool.file, content: w.tool.content }],
      ["completed", "write", { type: "write", filePath: w.tool.file, content: w.tool.content }],
    ],
  );
  assert.equal(readFileSync(join(w.workspace, w.tool.file), "utf8"), w.tool.content, "the file as the host sees it");
  assert.equal(events.filter((e) => e.type === "turn_completed").length, 1);
  await s.close();
});

test("interrupt cancels the turn under way", T, async () => {
  const s = await client().createSession(config);
  open.push({ sandbox: s.sandbox });
  const events = record(s);
  const { turnId } = await s.startTurn("hello");
  await until("streaming", () => events.some((e) => e.type === "timeline" && e.item.type === "assistant_message"), 60_000);
  await s.interrupt();
  await until("the turn's end", () => events.some((e) => e.type === "turn_canceled" || e.type === "turn_completed"), 60_000);
  assert.deepEqual(events.at(-1), { type: "turn_canceled", provider: "pi-sandboxed", turnId, reason: "interrupted" });
  await s.close();
});

test("resumeSession: a daemon restart reattaches to the same sandbox and Pi", T, async () => {
  const first = await client("detach").createSession(config);
  open.push({ sandbox: first.sandbox });
  await first.run("hello");
  const handle = first.describePersistence();
  assert.ok(handle);
  await first.close(); // detach: the daemon goes away, the sandbox runs on

  const s = await client().resumeSession(handle);
  assert.equal(s.sandbox, first.sandbox);
  assert.equal(s.id, first.id, "the same Pi session");
  assert.equal((await s.run("again")).finalText, w.turnText);
  const history: string[] = [];
  for await (const e of s.streamHistory()) if (e.type === "timeline") history.push(e.item.type);
  assert.deepEqual(history, ["user_message", "assistant_message", "user_message", "assistant_message"]);
  await s.close();
});

test("a sandbox that ends mid-turn fails the turn with its code", T, async () => {
  const s = await client().createSession(config);
  open.push({ sandbox: s.sandbox });
  const events = record(s);
  const { turnId } = await s.startTurn("hello");
  await until("streaming", () => events.some((e) => e.type === "timeline"), 60_000);
  await s.pi.stream.signal("KILL");
  await until("the turn's end", () => events.some((e) => e.type === "turn_failed"), 60_000);
  const failed = events.find((e) => e.type === "turn_failed");
  assert.deepEqual(failed && { ...failed, error: undefined }, { type: "turn_failed", provider: "pi-sandboxed", turnId, code: "sandbox-exited", error: undefined });
  await s.close();
});
