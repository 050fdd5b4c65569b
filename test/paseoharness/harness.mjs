// A stand-in for Paseo's daemon side of its Pi provider, built from what
// Paseo's source does (packages/server/src/server/agent/providers/pi/:
// runtime.ts buildPiLaunch, cli-runtime.ts PiCliRuntime, agent.ts
// createSession/resumeSession/listModels/detectMcpAdapter and
// createPiMcpConfigFile): the argv it builds, the generated MCP config in a
// temp dir, the environment (the daemon's whole environment with the
// provider env over it), stdio pipes, LF-framed JSON with req_N ids,
// responses by id and everything else an event, and close = stdin.end(),
// SIGTERM, SIGKILL after 2 s. Written for this repository's tests; no code
// of Paseo's is copied.
//
// Usage: node harness.mjs <scenario> <json options>. It prints one JSON
// line per step on stdout ({"step":...}) for the Go test to read.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [scenario, rawOpts] = process.argv.slice(2);
const opts = JSON.parse(rawOpts);
const report = (step, data = {}) => process.stdout.write(JSON.stringify({ step, ...data }) + "\n");

// buildPiLaunch's rules: the command (mode replace), then --mode rpc unless
// present, --model, --thinking, --session, --append-system-prompt (trimmed,
// when not empty), --mcp-config.
function buildArgv(command, s) {
  const argv = [...command];
  const hasRpc = argv.some((a, i) => (a === "--mode" && argv[i + 1] === "rpc") || a === "--mode=rpc");
  if (!hasRpc) argv.push("--mode", "rpc");
  if (s.model) argv.push("--model", s.model);
  if (s.thinking) argv.push("--thinking", s.thinking);
  if (s.session) argv.push("--session", s.session);
  const sp = s.systemPrompt?.trim();
  if (sp) argv.push("--append-system-prompt", sp);
  if (s.mcpConfigPath) argv.push("--mcp-config", s.mcpConfigPath);
  return argv;
}

// createPiMcpConfigFile: a fresh temp dir, mcp.json with Paseo's server.
function writeMcpConfig(servers) {
  const dir = mkdtempSync(join(tmpdir(), "paseo-pi-mcp-"));
  const path = join(dir, "mcp.json");
  const mcpServers = {};
  for (const [name, s] of Object.entries(servers)) {
    mcpServers[name] = { url: s.url, headers: s.headers, auth: false, oauth: false };
  }
  writeFileSync(path, `${JSON.stringify({ mcpServers }, null, 2)}\n`, "utf8");
  return { path, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

class Session {
  constructor(launch) {
    const [cmd, ...args] = launch.argv;
    this.started = Date.now();
    this.child = spawn(cmd, args, {
      cwd: launch.cwd,
      env: launch.env ? { ...process.env, ...launch.env } : process.env,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.pending = new Map();
    // strays: response frames for an id this process did not send or no
    // longer waits for, or for another command than the one it sent
    // (PiCliRuntime ignores them; the tests count them).
    this.strays = [];
    this.events = [];
    this.waiters = [];
    this.next = 1;
    this.stdout = "";
    this.stderr = "";
    this.exited = new Promise((resolve) => {
      this.child.on("exit", (code, signal) => {
        this.exit = { code, signal };
        for (const p of this.pending.values()) p.reject(new Error(`exited ${code} ${signal}\n${this.stderr}`));
        this.pending.clear();
        resolve(this.exit);
      });
    });
    this.child.stdout.on("data", (chunk) => {
      this.stdout += chunk.toString();
      for (;;) {
        const i = this.stdout.indexOf("\n");
        if (i === -1) break;
        const line = this.stdout.slice(0, i).replace(/\r$/, "");
        this.stdout = this.stdout.slice(i + 1);
        if (line.trim()) this.line(line);
      }
    });
    this.child.stderr.on("data", (c) => { this.stderr += c.toString(); });
    this.child.on("error", () => {});
    // A write after the command exited fails with EPIPE: the exit handler
    // above rejects what waits, so the scenario reports an error instead of
    // the harness dying on an unhandled stream error.
    this.child.stdin.on("error", () => {});
  }
  line(line) {
    let m;
    try { m = JSON.parse(line); } catch { return; } // non-JSON lines are logged and ignored
    if (!m || typeof m !== "object" || Array.isArray(m)) return;
    if (m.type === "response") {
      const p = m.id && this.pending.get(m.id);
      if (!p || (m.command && m.command !== p.command)) { this.strays.push(line); if (!p) return; }
      this.pending.delete(m.id);
      clearTimeout(p.timer);
      m.success ? p.resolve(m.data) : p.reject(new Error(m.error ?? `${m.command} failed`));
      return;
    }
    this.events.push(m);
    for (const w of [...this.waiters]) if (w.test(m)) { this.waiters.splice(this.waiters.indexOf(w), 1); w.resolve(m); }
  }
  request(command, timeoutMs = 30_000) {
    const id = `req_${this.next++}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { this.pending.delete(id); reject(new Error(`timeout ${command.type}\n${this.stderr}`)); }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer, command: command.type });
      this.child.stdin.write(`${JSON.stringify({ ...command, id })}\n`);
    });
  }
  waitEvent(test, timeoutMs = 120_000) {
    const hit = this.events.find(test);
    if (hit) return Promise.resolve(hit);
    return new Promise((resolve, reject) => {
      const w = { test, resolve };
      this.waiters.push(w);
      setTimeout(() => reject(new Error(`no such event in ${timeoutMs} ms\n${this.stderr}`)), timeoutMs);
    });
  }
  // PiCliRuntimeSession.close: end stdin, SIGTERM, SIGKILL after 2 s.
  async close() {
    try { this.child.stdin.end(); } catch {}
    if (this.exit) return this.exit;
    this.child.kill("SIGTERM");
    const t = setTimeout(() => this.child.kill("SIGKILL"), 2_000);
    const e = await this.exited;
    clearTimeout(t);
    return e;
  }
}

const text = (events) => events
  .filter((e) => e.type === "message_update" && e.assistantMessageEvent?.type === "text_delta")
  .map((e) => e.assistantMessageEvent.delta).join("");

function launch(extra = {}) {
  let mcp = null;
  if (opts.mcpServers) mcp = writeMcpConfig(opts.mcpServers);
  const argv = buildArgv(opts.command, {
    model: opts.model, thinking: opts.thinking ?? "medium", session: opts.session,
    systemPrompt: opts.systemPrompt, mcpConfigPath: mcp?.path, ...extra,
  });
  return { s: new Session({ argv, cwd: opts.cwd, env: opts.providerEnv }), mcp };
}

async function main() {
  switch (scenario) {
    case "turn": {
      const { s, mcp } = launch();
      const state = await s.request({ type: "get_state" }, 60_000);
      const startMs = Date.now() - s.started;
      report("started", { ms: startMs, sessionFile: state.sessionFile });
      await s.request({ type: "prompt", message: opts.prompt });
      await s.waitEvent((e) => e.type === "agent_settled");
      const after = await s.request({ type: "get_state" });
      const exit = await s.close();
      mcp?.cleanup();
      report("done", { events: s.events, text: text(s.events), sessionFile: after.sessionFile, exit, stderr: s.stderr, ms: startMs });
      break;
    }
    case "turns": {
      // One session, several turns: after each turn's agent_settled it
      // reports "settled" (the turn's events, stderr so far) and, with
      // opts.gate, waits for the file <gate>.<n> before the next prompt,
      // so the test can look at the host (and change it) between turns.
      const { s, mcp } = launch();
      await s.request({ type: "get_state" }, 60_000);
      for (const [n, prompt] of opts.prompts.entries()) {
        const start = s.events.length;
        await s.request({ type: "prompt", message: prompt });
        await s.waitEvent((e) => e.type === "agent_settled" && s.events.indexOf(e) >= start);
        report("settled", { n, events: s.events.slice(start), text: text(s.events.slice(start)), stderr: s.stderr });
        if (opts.gate) while (!existsSync(`${opts.gate}.${n}`)) await new Promise((res) => setTimeout(res, 100));
      }
      const exit = await s.close();
      mcp?.cleanup();
      report("done", { exit, stderr: s.stderr });
      break;
    }
    case "bash-env": {
      // Pi's own bash RPC command: what the Pi process's environment holds.
      const { s, mcp } = launch();
      const state = await s.request({ type: "get_state" }, 60_000);
      const startMs = Date.now() - s.started;
      report("started", { pid: s.child.pid, provider: state.model?.provider, ms: startMs });
      const r = await s.request({ type: "bash", command: "env; tr '\\0' '\\n' </proc/self/environ" }, 60_000)
        .catch((e) => ({ output: "", error: String(e.message) }));
      await new Promise((res) => setTimeout(res, 1_000));
      const exit = await s.close();
      mcp?.cleanup();
      report("done", { text: r.output ?? JSON.stringify(r), exit, stderr: s.stderr, ms: startMs });
      break;
    }
    case "refused": {
      const { s } = launch();
      const r = await s.request({ type: "get_state" }, 30_000).then(() => "answered", (e) => "failed");
      const exit = await s.exited;
      report("done", { request: r, exit, stderr: s.stderr });
      break;
    }
    case "streaming": {
      // A turn that the test kills (this process's whole tree) mid-way.
      const { s } = launch();
      const state = await s.request({ type: "get_state" }, 60_000);
      report("started", { sessionFile: state.sessionFile });
      await s.request({ type: "prompt", message: opts.prompt });
      let n = 0;
      await s.waitEvent((e) => e.type === "message_update" && e.assistantMessageEvent?.type === "text_delta" && ++n >= (opts.deltas ?? 5));
      // A command Pi answers only after the kill (its bash RPC command
      // answers when the command ends): the answer waits in the sandbox's
      // output for the respawn, with an id the new daemon numbers again.
      if (opts.lateCommand) {
        s.request({ type: "bash", command: opts.lateCommand }, 120_000).catch(() => {});
        await new Promise((res) => setTimeout(res, 1_000));
      }
      // Stop the command, then read what it already wrote: the text
      // reported is then all this daemon got before the kill (a delta read
      // between the report and the test's SIGKILL would be counted
      // nowhere, and a slow machine made the test see a gap that was not
      // there).
      process.kill(s.child.pid, "SIGSTOP");
      await new Promise((res) => setTimeout(res, 500));
      report("streaming", { text: text(s.events), next: s.next });
      await new Promise(() => {}); // until killed
      break;
    }
    case "resume": {
      // resumeSession: the same argv with --session, then get_state; the
      // rest of the turn arrives as events.
      const { s, mcp } = launch();
      await s.request({ type: "get_state" }, 60_000);
      // Requests up to the killed daemon's last id, as a new daemon's own
      // numbering reaches it (PiCliRuntime numbers from req_1 again).
      while (s.next < (opts.untilId ?? 0)) await s.request({ type: "get_state" }, 60_000);
      await s.waitEvent((e) => e.type === "agent_settled");
      if (opts.settleMs) await new Promise((res) => setTimeout(res, opts.settleMs));
      const exit = await s.close();
      mcp?.cleanup();
      report("done", { events: s.events, text: text(s.events), exit, stderr: s.stderr, strays: s.strays });
      break;
    }
    case "probe": {
      // listModels / isAvailable: `pi --mode rpc` in a cwd, one request,
      // close; detectMcpAdapter: get_commands.
      const t0 = Date.now();
      const s = new Session({ argv: buildArgv(opts.command, {}), cwd: opts.cwd, env: opts.providerEnv });
      const models = await s.request({ type: "get_available_models" }, 60_000);
      const t1 = Date.now();
      const exit = await s.close();
      const t2 = Date.now();
      report("done", { models: models.models, answerMs: t1 - t0, totalMs: t2 - t0, exit, stderr: s.stderr });
      break;
    }
    default:
      throw new Error(`unknown scenario ${scenario}`);
  }
  await exitAfterFlush(0);
}

// exitAfterFlush exits once stdout has taken every report: a pipe the
// reader drains slowly takes a large report (a turn's events) in parts,
// and process.exit would drop the rest (the test then saw the "done"
// line cut off and the harness gone, exit 0).
function exitAfterFlush(code) {
  return new Promise(() => process.stdout.write("", () => process.exit(code)));
}

main().catch((e) => { report("error", { message: String(e?.stack ?? e) }); return exitAfterFlush(1); });
