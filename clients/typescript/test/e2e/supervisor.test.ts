// The package against the real supervisor (paseo-policy supervise, as root) and the real Pi
// in gVisor with the fake model: see world.ts. The tests run in order, one sandbox each.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, test } from "node:test";

import { PiError, PiSession, SandboxStream, SupervisorConnection, SupervisorError, assistantText, type PiEvent } from "../../src/index.js";
import { supervisorPid, until, world } from "./world.js";

const w = world();
const base = { socketPath: w.socket, deployment: w.deployment, mcpToken: w.mcpToken };

// Every sandbox a test made is deleted when it ends, failed or not, so a failure leaves
// nothing running (and no connection holding the test process open).
const made: PiSession[] = [];
afterEach(async () => {
  for (const s of made.splice(0)) {
    await s.delete().catch((e: unknown) => {
      if (!(e instanceof SupervisorError && e.code === "not-found")) throw e;
    });
    s.close();
  }
});

function track<T extends { session: PiSession }>(r: T): T {
  made.push(r.session);
  return r;
}

const T = { timeout: 180_000 };

async function list(): Promise<string[]> {
  const c = await SupervisorConnection.connect(w.socket);
  try {
    return (await c.list()).map((i) => i.sandbox);
  } finally {
    c.close();
  }
}

test("a turn: prompt, Pi's events through agent_settled, exit as typed data", T, async () => {
  const { info, session } = track(await PiSession.create({ ...base, facts: w.facts }));
  assert.equal(info.status, "running");
  assert.equal(info.profile, "pi-session");
  assert.ok((await list()).includes(info.sandbox));
  const state = await session.getState();
  assert.equal(state.isStreaming, false);
  // The real Pi's session id and file pass the checks a daemon relies on before persisting them.
  assert.match(state.sessionId, /^[0-9a-f-]{36}$/);
  assert.ok(state.sessionFile?.startsWith("/") && state.sessionFile.endsWith(".jsonl"), state.sessionFile);

  const turn = await session.turn("hello");
  assert.equal(turn.text, w.turnText);
  assert.equal(turn.events.filter((e) => e.type === "agent_settled").length, 1);
  assert.equal(turn.events.filter((e) => e.type === "agent_start").length, 1);
  assert.equal(turn.events.at(-1)?.type, "agent_settled");

  // stdin closed: Pi exits 0, and the exit arrives as data.
  await session.closeInput();
  const exit = await session.exit;
  assert.equal(exit.exitCode, 0);
  assert.equal(exit.limit, undefined);
  const ended = await session.stream.inspect();
  assert.equal(ended.status, "exited");
  await session.delete();
  assert.ok(!(await list()).includes(info.sandbox));
});

test("a tool call: the real Pi's write runs in the sandbox and lands in the host workspace", T, async () => {
  const { session } = track(await PiSession.create({ ...base, facts: w.facts }));
  const turn = await session.turn(`${w.tool.prefix} write ${w.tool.file}`);
  assert.equal(turn.text, w.tool.text);
  const tools = turn.events.filter((e) => e.type === "tool_execution_start" || e.type === "tool_execution_end");
  assert.deepEqual(
    tools.map((e) => [e.type, e.toolName, e.type === "tool_execution_end" ? e.isError : undefined]),
    [
      ["tool_execution_start", "write", undefined],
      ["tool_execution_end", "write", false],
    ],
  );
  assert.equal(readFileSync(join(w.workspace, w.tool.file), "utf8"), w.tool.content, "the file as the host sees it");
  // The session tree has the turn: get_entries, typed and checked.
  const { entries, leafId } = await session.getEntries();
  assert.ok(entries.length >= 4, `${entries.length} entries`);
  assert.equal(leafId, entries.at(-1)?.id);
  // The supervisor's gitImport over the wire: this world's client is root, and the import runs
  // only as a daemon's uid, so the answer is a typed state error, never an import as root.
  await assert.rejects(session.importGit(), (e: unknown) => e instanceof SupervisorError && e.code === "state" && /root/.test(e.message));
  await session.delete();
});

test("steer, then interrupt (clear_queue, then abort answered once Pi is idle)", T, async () => {
  const { session } = track(await PiSession.create({ ...base, facts: w.facts, commandTimeoutMs: 60_000 }));
  const events: PiEvent[] = [];
  const sub = session.events();
  const collected = (async () => {
    for await (const e of sub) {
      events.push(e);
      if (e.type === "agent_settled") return;
    }
  })();
  assert.equal((await session.prompt("stream")).success, true);
  await until("streaming", () => events.some((e) => e.type === "message_update"), 60_000);
  assert.equal(await session.steer("and then stop"), "accepted");
  await session.interrupt();
  // abort answered only once the session was idle: the turn had settled, nothing streams.
  const state = await session.getState();
  assert.equal(state.isStreaming, false);
  await collected;
  assert.equal(events.filter((e) => e.type === "agent_settled").length, 1);
  const aborted = events.find((e) => e.type === "message_end" && (e.message as { stopReason?: string } | undefined)?.stopReason === "aborted");
  assert.ok(aborted, "the aborted assistant message");
  await session.setThinkingLevel("max");
  assert.ok((await session.getState()).thinkingLevel, "a level the model supports");
  await session.delete();
});

test("a sandbox killed mid-turn: the turn fails, what waited is rejected, the exit is data", T, async () => {
  const { session } = track(await PiSession.create({ ...base, facts: w.facts }));
  const events: PiEvent[] = [];
  const sub = session.events();
  void (async () => {
    for await (const e of sub) events.push(e);
  })().catch(() => {});
  const turn = session.turn("stream");
  await until("streaming", () => events.some((e) => e.type === "message_update"), 60_000);
  await session.stream.signal("KILL");
  await assert.rejects(turn, (e: unknown) => e instanceof PiError);
  const exit = await session.exit;
  assert.notEqual(exit.exitCode, 0);
  assert.equal(session.isEnded, true);
  await session.delete();
});

test("a refused facts set: every PP-* code and fact path arrives as data", T, async () => {
  const before = await list();
  const c = await SupervisorConnection.connect(w.socket);
  try {
    await assert.rejects(c.createSandbox(w.deployment, w.refused.facts, { mcpToken: w.mcpToken }), (e: unknown) => {
      assert.ok(e instanceof SupervisorError, String(e));
      assert.equal(e.code, "refused");
      assert.deepEqual(e.diagnostics, w.refused.diagnostics);
      assert.ok(e.diagnostics.length >= 3);
      assert.ok(!JSON.stringify(e.diagnostics).includes(w.refused.secret) && !e.message.includes(w.refused.secret));
      return true;
    });
    // A malformed MCP token is refused by code, naming no value.
    const bad = "tok-secret-7q space";
    await assert.rejects(c.createSandbox(w.deployment, w.facts, { mcpToken: bad }), (e: unknown) => {
      assert.ok(e instanceof SupervisorError && e.code === "malformed", String(e));
      assert.ok(!e.message.includes("7q"));
      return true;
    });
    await assert.rejects(c.inspect("pp-0000000000000000"), (e: unknown) => e instanceof SupervisorError && e.code === "not-found");
    await assert.rejects(c.createSandbox("docker-official", w.facts), (e: unknown) => e instanceof SupervisorError && e.code === "forbidden");
  } finally {
    c.close();
  }
  assert.deepEqual(await list(), before);
});

test("dropped connections and a supervisor SIGKILL mid-turn: the turn arrives whole, once", T, async () => {
  let reattaches = 0;
  const { info, session } = track(
    await PiSession.create({
      ...base,
      facts: w.facts,
      onReattach: () => reattaches++,
    }),
  );
  const events: PiEvent[] = [];
  const sub = session.events();
  const collected = (async () => {
    for await (const e of sub) {
      events.push(e);
      if (e.type === "agent_settled") return;
    }
  })();
  const r = await session.prompt("stream");
  assert.equal(r.success, true);
  const deltas = () => events.filter((e) => e.type === "message_update").length;
  await until("streaming", () => deltas() > 0, 60_000);

  // Two dropped connections, each after more output.
  for (let i = 0; i < 2; i++) {
    const n = deltas();
    session.stream.dropConnection();
    await until(`output after drop ${i + 1}`, () => deltas() > n, 30_000);
  }
  // The supervisor dies mid-turn (SIGKILL); the harness restarts it, as systemd would.
  const pid = supervisorPid(w);
  const n = deltas();
  process.kill(pid, "SIGKILL");
  await collected;
  assert.ok(deltas() >= n);
  assert.notEqual(supervisorPid(w), pid, "a new supervisor runs");
  assert.ok(reattaches >= 3, `reattached ${reattaches} times`);
  assert.equal(assistantText(events), w.turnText, "the assistant text across the reattaches");
  assert.equal(events.filter((e) => e.type === "agent_settled").length, 1);
  assert.equal(events.filter((e) => e.type === "agent_start").length, 1);

  // The new supervisor adopted the sandbox; this client is attached through it.
  const again = await session.stream.inspect();
  assert.equal(again.status, "running");
  assert.equal(again.sandbox, info.sandbox);
  assert.equal((await session.turn("again")).text, w.turnText);
  await session.delete();
});

test("replay after reattach: a new client from a persisted cursor gets the rest of the turn", T, async () => {
  // The first client never acknowledges, as a daemon that died before it could.
  const { info, session } = track(await PiSession.create({ ...base, facts: w.facts, autoAck: false }));
  await session.getState();
  const cursor = session.lineCursor;
  await session.prompt("stream");
  session.close(); // the daemon dies right after sending the prompt

  const next = await PiSession.open({ ...base, sandbox: info.sandbox, cursor });
  made.push(next);
  const replayed: PiEvent[] = [];
  for await (const e of next.events()) {
    replayed.push(e);
    if (e.type === "agent_settled") break;
  }
  // The old client's prompt response is replayed as an event, then the whole turn.
  const response = replayed.findIndex((e) => e.type === "response" && e.command === "prompt");
  assert.ok(response >= 0 && response < replayed.findIndex((e) => e.type === "agent_start"), "the prompt's response, then the turn");
  assert.equal(replayed.filter((e) => e.type === "agent_settled").length, 1);
  assert.equal(assistantText(replayed), w.turnText);
  await next.delete();
});

test("hibernate and wake: the session goes on where it stopped", T, async () => {
  const { info, session } = track(await PiSession.create({ ...base, facts: w.facts }));
  assert.equal((await session.turn("one")).text, w.turnText);
  await until("a hibernate the agent is idle for", async () => {
    try {
      const h = await session.stream.hibernate();
      return h.status === "hibernated";
    } catch (e) {
      if (e instanceof SupervisorError && e.code === "input-pending") return false;
      throw e;
    }
  });
  assert.equal((await session.stream.inspect()).status, "hibernated");
  // A prompt wakes it (the write does), and the turn streams on the same attachment.
  assert.equal((await session.turn("two")).text, w.turnText);
  assert.equal((await session.stream.inspect()).status, "running");

  await session.stream.hibernate();
  const woken = await session.stream.wake();
  assert.equal(woken.status, "running");
  // Both turns' user and assistant messages (Pi 1.x also lists its system
  // message, which get_state's messageCount counts).
  const { messages } = await session.call<{ messages: { role: string }[] }>({ type: "get_messages" });
  assert.equal(messages.filter((m) => m.role !== "system").length, 4, "both turns' messages survived two hibernations");
  assert.equal(woken.sandbox, info.sandbox);
  await session.delete();
});

test("the raw ops: attach epochs fence writes, an input id is applied once, signal, delete", T, async () => {
  const c = await SupervisorConnection.connect(w.socket);
  const other = await SupervisorConnection.connect(w.socket);
  let sandbox: string | undefined;
  try {
    const info = await c.createSandbox(w.deployment, w.facts, { mcpToken: w.mcpToken });
    sandbox = info.sandbox;
    const first = await c.attach(sandbox, 0, { mcpToken: w.mcpToken });
    const line = JSON.stringify({ id: "s1", type: "get_state" }) + "\n";
    assert.deepEqual(await c.write(sandbox, first.epoch, "in-1", line), { applied: true });
    assert.deepEqual(await c.write(sandbox, first.epoch, "in-1", line), { applied: false }, "a retried input id");
    // Another attachment takes over: the first epoch is fenced.
    const second = await other.attach(sandbox, 0);
    assert.ok(second.epoch > first.epoch);
    await assert.rejects(c.write(sandbox, first.epoch, "in-2", line), (e: unknown) => e instanceof SupervisorError && e.code === "fenced");
    const events = other.events();
    let seen = "";
    let last = 0;
    for await (const e of events) {
      if (e.event !== "output") continue;
      assert.equal(e.seq, last + 1, "gapless, in order");
      last = e.seq;
      if (e.stream === "stdout") seen += Buffer.from(e.data ?? "", "base64").toString();
      if (seen.includes(`"id":"s1"`)) break;
    }
    assert.equal(seen.split(`"id":"s1"`).length - 1, 1, "the duplicate was not written again");
    assert.deepEqual(await other.ack(sandbox, last), { acked: last });
    await assert.rejects(c.attach(sandbox, 0), (e: unknown) => e instanceof SupervisorError && e.code === "out-of-order");
    assert.deepEqual(await c.signal(sandbox, "TERM"), { signal: "SIGTERM" });
    await until("the sandbox to end", async () => (await c.inspect(sandbox as string)).status === "exited", 30_000);
    assert.deepEqual(await c.delete(sandbox), { deleted: sandbox });
    sandbox = undefined;
  } finally {
    if (sandbox) await c.delete(sandbox).catch(() => {});
    c.close();
    other.close();
  }
});

test("attaching to an unknown sandbox is not-found", T, async () => {
  await assert.rejects(SandboxStream.open({ socketPath: w.socket, sandbox: "pp-ffffffffffffffff" }), (e: unknown) => e instanceof SupervisorError && e.code === "not-found");
});
