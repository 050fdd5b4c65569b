// SupervisorConnection against a scripted supervisor on a Unix socket of the test's own:
// the call timeout (a typed TimeoutError; the connection stays usable and drops the late
// answer) and frames that are not JSON objects (a ProtocolError, never a crash).

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import { ProtocolError, SupervisorConnection, SupervisorError, TimeoutError, type GitImportResult } from "../../src/index.js";

const dir = mkdtempSync(join(tmpdir(), "ts-conn-"));
after(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;

/** A supervisor that hands each request to handle, with a way to answer it. */
async function server(handle: (req: Record<string, unknown>, answer: (frame: unknown) => void, raw: (line: string) => void) => void): Promise<{ path: string; close: () => void }> {
  const path = join(dir, `s${++n}.sock`);
  const conns = new Set<net.Socket>();
  const srv = net.createServer((c) => {
    conns.add(c);
    let buf = "";
    c.setEncoding("utf8");
    c.on("data", (d: string) => {
      buf += d;
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const req = JSON.parse(buf.slice(0, i)) as Record<string, unknown>;
        buf = buf.slice(i + 1);
        handle(req, (frame) => c.write(JSON.stringify(frame) + "\n"), (line) => c.write(line + "\n"));
      }
    });
    c.on("error", () => {});
  });
  await new Promise<void>((r) => srv.listen(path, r));
  return {
    path,
    close: () => {
      for (const c of conns) c.destroy();
      srv.close();
    },
  };
}

test("a call with no answer rejects with TimeoutError; the connection stays usable and drops the late answer", async () => {
  const held: Array<() => void> = [];
  const s = await server((req, answer) => {
    const ok = () => answer({ v: 1, id: req.id, ok: true, result: req.op === "list" ? [] : { sandbox: "pp-1", status: "running" } });
    if (req.op === "inspect") held.push(ok);
    else ok();
  });
  const c = await SupervisorConnection.connect(s.path, { callTimeoutMs: 100 });
  try {
    const started = Date.now();
    await assert.rejects(c.inspect("pp-1"), (e: unknown) => {
      assert.ok(e instanceof TimeoutError, String(e));
      assert.equal(e.code, "timeout");
      assert.equal(e.op, "inspect");
      assert.equal(e.timeoutMs, 100);
      return true;
    });
    assert.ok(Date.now() - started >= 90);
    assert.deepEqual(await c.list(), [], "the connection answers the next call");
    held.shift()?.(); // the late answer: dropped
    assert.deepEqual(await c.list(), []);
    assert.equal(c.isClosed, false);
    // A call's own timeout overrides the connection's.
    await assert.rejects(c.call({ op: "inspect", sandbox: "pp-1" }, { timeoutMs: 10 }), TimeoutError);
  } finally {
    c.close();
    s.close();
  }
  // Without a timeout a call waits (here: until the connection ends).
  const s2 = await server(() => {});
  const c2 = await SupervisorConnection.connect(s2.path);
  const p = c2.inspect("pp-1");
  await new Promise((r) => setTimeout(r, 150));
  s2.close();
  await assert.rejects(p, (e: unknown) => !(e instanceof TimeoutError));
  c2.close();
});

test("a frame that is not a JSON object ends the connection with a ProtocolError", async () => {
  for (const line of ["null", "[1]", "7", "not json"]) {
    const s = await server((_req, _answer, raw) => raw(line));
    const c = await SupervisorConnection.connect(s.path);
    await assert.rejects(c.list(), (e: unknown) => e instanceof ProtocolError);
    assert.ok((await c.closed) instanceof ProtocolError, line);
    s.close();
  }
});

test("gitImport asks for the sandbox's import and answers the typed result; a refusal is data, a state error a SupervisorError", async () => {
  const seen: Array<Record<string, unknown>> = [];
  const s = await server((req, answer) => {
    seen.push(req);
    if (req.sandbox === "pp-none") {
      answer({ v: 1, id: req.id, ok: false, error: { code: "state", message: "sandbox pp-none has no Git store to import from" } });
      return;
    }
    const moved = req.sandbox === "pp-moved";
    answer({
      v: 1, id: req.id, ok: true,
      result: moved
        ? { branch: "refs/heads/agent", base: "b1", updated: [], diagnostics: [{ code: "PP-GIT-IMPORT-MOVED", path: "refs/heads/agent", message: "moved since" }] }
        : { branch: "refs/heads/agent", base: "b2", updated: [{ ref: "refs/heads/agent", old: "b1", new: "b2" }],
          ignored: [{ code: "PP-GIT-IMPORT-REF", path: "store/\"refs/heads/main\"", message: "outside the grant" }] },
    });
  });
  const c = await SupervisorConnection.connect(s.path, { callTimeoutMs: 5_000 });
  try {
    const r: GitImportResult = await c.gitImport("pp-1");
    assert.deepEqual(seen[0], { v: 1, id: seen[0]!.id, op: "gitImport", sandbox: "pp-1" });
    assert.equal(r.base, "b2");
    assert.deepEqual(r.updated, [{ ref: "refs/heads/agent", old: "b1", new: "b2" }]);
    assert.equal(r.ignored?.[0]?.code, "PP-GIT-IMPORT-REF");
    assert.equal(r.diagnostics, undefined);
    const m = await c.gitImport("pp-moved");
    assert.deepEqual(m.updated, []);
    assert.equal(m.diagnostics?.[0]?.code, "PP-GIT-IMPORT-MOVED");
    await assert.rejects(c.gitImport("pp-none"), (e: unknown) => e instanceof SupervisorError && e.code === "state");
  } finally {
    c.close();
    s.close();
  }
});
