// PiSession against a scripted Pi stream (fakepi.ts): Pi's stdout as untrusted data
// (responses matched to what this session sent, frames that are not objects ignored,
// persisted fields checked, bounded and linear line assembly, UTF-8 across records) and
// the Pi 1.x commands (steer and its fallback, clear_queue, get_entries, thinking levels,
// an abort answered only once Pi is idle).

import assert from "node:assert/strict";
import { test } from "node:test";

import { LineTooLongError, PiDataError, PiError, PiSession, PiTimeoutError, type PiEvent } from "../../src/index.js";
import { FakePi, tick, type Frame } from "./fakepi.js";

function session(opts: Parameters<typeof PiSession.over>[1] = {}): { pi: FakePi; s: PiSession<FakePi> } {
  const pi = new FakePi();
  return { pi, s: PiSession.over(pi, opts) };
}

/** The next n events of a subscription. */
async function take(it: AsyncIterableIterator<PiEvent>, n: number): Promise<PiEvent[]> {
  const out: PiEvent[] = [];
  while (out.length < n) {
    const r = await it.next();
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

const STATE = { sessionId: "0199a5c4-7e0b-7c3e-9a51-3f1b2c4d5e6f", sessionFile: "/srv/paseo/state/pi-agent/sessions/--w--/2026-12-03_x.jsonl", thinkingLevel: "medium", isStreaming: false, isCompacting: false, messageCount: 2, pendingMessageCount: 0, model: { provider: "fake", id: "fake-1", contextWindow: 1000 } };

test("a response resolves only the command it answers: same id, same command; forgeries and repeats are dropped", async () => {
  const { pi, s } = session();
  const events = s.events();
  let sent: Frame | undefined;
  pi.onCommand = (f) => (sent = f);
  const p = s.command({ type: "get_state" });
  await tick();
  assert.ok(sent?.id);
  // Another process in the sandbox writes a response to the waiting id naming another command.
  pi.frame({ type: "response", id: sent.id, command: "prompt", success: true });
  // A response with this session's prefix to an id it never sent.
  pi.frame({ type: "response", id: sent.id.replace(/-\d+\./, "-99."), command: "get_state", success: true, data: {} });
  // One with no boolean success.
  pi.frame({ type: "response", id: sent.id, command: "get_state", success: "yes" });
  await tick();
  let settled = false;
  void p.then(() => (settled = true));
  await tick();
  assert.equal(settled, false, "no forged frame answered the command");
  pi.respond(sent, { data: STATE });
  const r = await p;
  assert.deepEqual(r.data, STATE);
  // The same answer again, after the command was answered: dropped, not an event.
  pi.respond(sent, { data: { sessionId: "other" } });
  // A response of another client (a replay after a reattach) is an event, as are Pi's events.
  pi.frame({ type: "response", id: "req_7", command: "prompt", success: true });
  pi.frame({ type: "agent_start" });
  const got = await take(events, 2);
  assert.deepEqual(
    got.map((e) => [e.type, e.id]),
    [
      ["response", "req_7"],
      ["agent_start", undefined],
    ],
  );
  assert.deepEqual(s.stats.ignored, { notJson: 0, notFrame: 0, response: 4 });
  assert.equal(s.stats.responses, 1);
  assert.equal(s.isEnded, false);
});

test("getState checks the session id and file before the caller sees them", async () => {
  const bad: Array<[string, Record<string, unknown>, string]> = [
    ["relative file", { sessionFile: "sessions/x.jsonl" }, "invalid-session-file"],
    ["NUL in file", { sessionFile: "/srv/a\u0000b.jsonl" }, "invalid-session-file"],
    ["newline in file", { sessionFile: "/srv/a\nb.jsonl" }, "invalid-session-file"],
    ["C1 control in file", { sessionFile: "/srv/a\u009bb.jsonl" }, "invalid-session-file"],
    ["dot-dot in file", { sessionFile: "/srv/paseo/../../etc/shadow" }, "invalid-session-file"],
    ["empty segment in file", { sessionFile: "/srv//x.jsonl" }, "invalid-session-file"],
    ["trailing slash", { sessionFile: "/srv/x/" }, "invalid-session-file"],
    ["lone surrogate in file", { sessionFile: "/srv/\ud800.jsonl" }, "invalid-session-file"],
    ["long file", { sessionFile: "/" + "a".repeat(4096) }, "invalid-session-file"],
    ["file not a string", { sessionFile: ["/srv/x"] }, "invalid-session-file"],
    ["empty id", { sessionId: "" }, "invalid-session-id"],
    ["long id", { sessionId: "a".repeat(129) }, "invalid-session-id"],
    ["id with a slash", { sessionId: "../x" }, "invalid-session-id"],
    ["id with an escape", { sessionId: "a\u001b[2Jb" }, "invalid-session-id"],
    ["id not a string", { sessionId: 7 }, "invalid-session-id"],
    ["missing id", { sessionId: undefined }, "invalid-session-id"],
    ["count not a number", { messageCount: "2" }, "invalid-state"],
    ["unknown thinking level", { thinkingLevel: "ultra" }, "invalid-state"],
  ];
  for (const [name, patch, code] of bad) {
    const { pi, s } = session();
    pi.onCommand = (f) => pi.respond(f, { data: { ...STATE, ...patch } });
    await assert.rejects(s.getState(), (e: unknown) => {
      assert.ok(e instanceof PiDataError, `${name}: ${String(e)}`);
      assert.equal(e.code, code, name);
      return true;
    });
  }
  const { pi, s } = session();
  pi.onCommand = (f) => pi.respond(f, { data: STATE });
  assert.deepEqual(await s.getState(), {
    sessionId: STATE.sessionId,
    sessionFile: STATE.sessionFile,
    model: { provider: "fake", id: "fake-1" },
    thinkingLevel: "medium",
    isStreaming: false,
    isCompacting: false,
    messageCount: 2,
    pendingMessageCount: 0,
  });
  // Pi without a session file (--no-session), without a model (Pi 1.x omits it).
  const { pi: p2, s: s2 } = session();
  p2.onCommand = (f) => p2.respond(f, { data: { sessionId: "abc", isStreaming: true } });
  const st = await s2.getState();
  assert.equal(st.sessionFile, undefined);
  assert.equal(st.model, undefined);
  assert.equal(st.isStreaming, true);
});

test("null, arrays, numbers, strings and objects without a type are ignored frames, counted; the session goes on", async () => {
  const { pi, s } = session();
  const events = s.events();
  for (const line of ["null", "[]", "[1,2]", "42", '"text"', "true", "{}", '{"type":5}', "not json", "{broken"]) pi.emit(line + "\n");
  pi.frame({ type: "agent_start" });
  assert.deepEqual(await take(events, 1), [{ type: "agent_start" }]);
  assert.deepEqual(s.stats.ignored, { notJson: 2, notFrame: 8, response: 0 });
  pi.onCommand = (f) => pi.respond(f, { data: STATE });
  assert.equal((await s.getState()).messageCount, 2, "commands are still answered");
  assert.equal(s.isEnded, false);
});

test("UTF-8 split across records arrives whole, on stdout and on stderr", async () => {
  const { pi, s } = session();
  const events = s.events();
  const text = "héllo → 😀 ✓ 𝄞";
  const bytes = Buffer.from(JSON.stringify({ type: "message_update", assistantMessageEvent: { type: "text_delta", delta: text } }) + "\n", "utf8");
  for (let i = 0; i < bytes.length; i++) pi.emit(bytes.subarray(i, i + 1));
  const [e] = await take(events, 1);
  assert.equal((e?.assistantMessageEvent as { delta: string }).delta, text);
  const err = Buffer.from("warnung: größe 😀\n", "utf8");
  for (let i = 0; i < err.length; i++) pi.emit(err.subarray(i, i + 1), "stderr");
  await tick();
  assert.equal(s.stderr, "warnung: größe 😀\n");
});

test("a multi-MiB line in small chunks assembles in linear work: each byte scanned about once", async () => {
  // Count what the framing scans: every indexOf on a string or a Buffer, by the length it
  // may scan (from its start index to the end). Quadratic assembly rescans the growing
  // line on every chunk: about size²/(2·chunk), 1024 times the size here.
  const size = 8 * 1024 * 1024;
  const chunk = 4096;
  const { pi, s } = session();
  const events = s.events();
  const line = Buffer.from(JSON.stringify({ type: "big", pad: "x".repeat(size) }) + "\n");
  const strIndexOf = String.prototype.indexOf;
  const bufIndexOf = Buffer.prototype.indexOf;
  let scanned = 0;
  String.prototype.indexOf = function (this: string, search: string, from?: number) {
    scanned += this.length - Math.max(0, from ?? 0);
    return strIndexOf.call(this, search, from);
  };
  Buffer.prototype.indexOf = function (this: Buffer, value: string | number | Uint8Array, byteOffset?: number | BufferEncoding, enc?: BufferEncoding) {
    scanned += this.length - (typeof byteOffset === "number" ? Math.max(0, byteOffset) : 0);
    return bufIndexOf.call(this, value, byteOffset as number, enc);
  } as typeof Buffer.prototype.indexOf;
  let got: PiEvent[];
  try {
    for (let off = 0; off < line.length; off += chunk) pi.emit(line.subarray(off, off + chunk));
    got = await take(events, 1);
  } finally {
    String.prototype.indexOf = strIndexOf;
    Buffer.prototype.indexOf = bufIndexOf;
  }
  assert.equal((got[0]?.pad as string).length, size);
  assert.ok(scanned <= 2 * line.length, `scanned ${scanned} for a line of ${line.length} bytes`);
});

test("a line over the limit ends the session cleanly with LineTooLongError", async () => {
  const { pi, s } = session({ maxLineBytes: 1024 });
  const events = s.events();
  let sent: Frame | undefined;
  pi.onCommand = (f) => (sent = f);
  const p = s.command({ type: "get_state" });
  await tick();
  assert.ok(sent);
  pi.frame({ type: "agent_start" });
  // 1025 bytes without a newline, in pieces.
  for (let i = 0; i < 5; i++) pi.emit("y".repeat(205));
  await assert.rejects(p, (e: unknown) => e instanceof LineTooLongError && e.code === "line-too-long");
  assert.deepEqual(await take(events, 1), [{ type: "agent_start" }]);
  await assert.rejects(events.next(), LineTooLongError);
  await assert.rejects(s.exit, LineTooLongError);
  assert.equal(pi.closed, true, "the attachment was dropped");
  assert.equal(s.isEnded, true);
  await assert.rejects(s.command({ type: "get_state" }), LineTooLongError);
  // A line of exactly the limit is taken.
  const { pi: p2, s: s2 } = session({ maxLineBytes: 64 });
  const ev2 = s2.events();
  const f = JSON.stringify({ type: "t", p: "" });
  p2.emit(JSON.stringify({ type: "t", p: "z".repeat(64 - f.length) }) + "\n");
  assert.equal((await take(ev2, 1))[0]?.type, "t");
});

test("steer: accepted; 'Unknown command: steer' is unavailable (the caller falls back); another error throws", async () => {
  const { pi, s } = session();
  const answers: Array<{ success?: boolean; error?: string }> = [{}, { error: "Unknown command: steer" }, { error: "Agent is not streaming" }];
  pi.onCommand = (f) => pi.respond(f, answers.shift() ?? {});
  assert.equal(await s.steer("use the other file", [{ type: "image", data: "aGk=", mimeType: "image/png" }]), "accepted");
  assert.equal(await s.steer("again"), "unavailable");
  await assert.rejects(s.steer("third"), (e: unknown) => e instanceof PiError && e.command === "steer");
  assert.deepEqual(pi.written[0] && { ...pi.written[0], id: undefined }, { type: "steer", message: "use the other file", images: [{ type: "image", data: "aGk=", mimeType: "image/png" }], id: undefined });
  assert.equal(pi.written[1]?.images, undefined);
});

test("clear_queue answers what it cleared; a Pi without it (0.84.2) is undefined; interrupt is clear_queue then abort", async () => {
  const { pi, s } = session();
  pi.onCommand = (f) => {
    if (f.type === "clear_queue") pi.respond(f, { data: { steering: ["a"], followUp: ["b", "c"] } });
    else pi.respond(f);
  };
  assert.deepEqual(await s.clearQueue(), { steering: ["a"], followUp: ["b", "c"] });
  await s.interrupt();
  assert.deepEqual(
    pi.written.map((f) => f.type),
    ["clear_queue", "clear_queue", "abort"],
  );

  const old = session();
  old.pi.onCommand = (f) => (f.type === "clear_queue" ? old.pi.respond(f, { error: "Unknown command: clear_queue" }) : old.pi.respond(f));
  assert.equal(await old.s.clearQueue(), undefined);
  await old.s.interrupt();
  assert.deepEqual(
    old.pi.written.map((f) => f.type),
    ["clear_queue", "clear_queue", "abort"],
  );

  const bad = session();
  bad.pi.onCommand = (f) => bad.pi.respond(f, { data: { steering: [1] } });
  await assert.rejects(bad.s.clearQueue(), (e: unknown) => e instanceof PiDataError && e.code === "invalid-response");
});

test("abort waits for Pi to be idle however long; other commands time out and the session goes on", async () => {
  const { pi, s } = session({ commandTimeoutMs: 50 });
  const events = s.events();
  let abort: Frame | undefined;
  let slow: Frame | undefined;
  pi.onCommand = (f) => {
    if (f.type === "abort") abort = f;
    else if (f.type === "get_messages") slow = f;
    else pi.respond(f, { data: STATE });
  };
  const aborting = s.abort();
  await assert.rejects(s.command({ type: "get_messages" }), (e: unknown) => e instanceof PiTimeoutError && e.command === "get_messages" && e.timeoutMs === 50);
  await tick(200);
  assert.ok(abort && slow);
  // Pi 1.x: the aborted message and agent_settled, then the abort's answer (4 x the timeout later).
  pi.frame({ type: "message_end", message: { role: "assistant", stopReason: "aborted" } });
  pi.frame({ type: "agent_settled" });
  pi.respond(abort);
  assert.equal((await aborting).success, true);
  assert.deepEqual(
    (await take(events, 2)).map((e) => e.type),
    ["message_end", "agent_settled"],
  );
  // The timed-out command's late answer is dropped; the session is usable.
  pi.respond(slow, { data: { messages: [] } });
  assert.equal((await s.getState()).sessionId, STATE.sessionId);
  assert.equal(s.stats.ignored.response, 1);
  // An explicit timeout on abort is the caller's choice.
  pi.onCommand = () => {};
  await assert.rejects(s.abort({ timeoutMs: 20 }), PiTimeoutError);
});

test("thinking levels up to max; get_entries typed and checked", async () => {
  const { pi, s } = session();
  const entries = [
    { type: "message", id: "e1", parentId: null, message: { role: "user" } },
    { type: "message", id: "e2", parentId: "e1", message: { role: "assistant" } },
  ];
  pi.onCommand = (f) => (f.type === "get_entries" ? pi.respond(f, { data: { entries: f.since === "e1" ? entries.slice(1) : entries, leafId: "e2" } }) : pi.respond(f));
  for (const level of ["off", "minimal", "low", "medium", "high", "xhigh", "max"] as const) await s.setThinkingLevel(level);
  assert.deepEqual(
    pi.written.map((f) => f.level),
    ["off", "minimal", "low", "medium", "high", "xhigh", "max"],
  );
  await assert.rejects(s.setThinkingLevel("ultra" as "max"), RangeError);
  assert.deepEqual(await s.getEntries(), { entries, leafId: "e2" });
  assert.deepEqual(await s.getEntries("e1"), { entries: entries.slice(1), leafId: "e2" });
  assert.equal(pi.written.at(-1)?.since, "e1");
  pi.onCommand = (f) => pi.respond(f, { data: { entries: [{ type: "message", parentId: null }], leafId: null } });
  await assert.rejects(s.getEntries(), (e: unknown) => e instanceof PiDataError && e.code === "invalid-response");
});

test("the sandbox's end rejects what waits and ends the subscriptions; exit is its exit", async () => {
  const { pi, s } = session();
  const events = s.events();
  const p = s.command({ type: "get_state" });
  await tick();
  pi.exit(0);
  await assert.rejects(p, /the sandbox ended/);
  assert.equal((await events.next()).done, true);
  assert.equal((await s.exit).exitCode, 0);
  await assert.rejects(s.command({ type: "get_state" }), /has ended/);
});

test("lineCursor is the last record that ended a line; whole lines are acknowledged", async () => {
  const { pi, s } = session();
  const events = s.events();
  pi.emit('{"type":"a"}\n{"type"'); // record 1 ends mid-line
  pi.emit(':"b"}\n'); // record 2 ends the line
  await take(events, 2);
  assert.equal(s.lineCursor, 2);
  await tick(80);
  assert.deepEqual(pi.acks, [2]);
});
