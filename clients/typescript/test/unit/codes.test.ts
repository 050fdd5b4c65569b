// The client's error codes are the protocol's: the table in docs/supervisor.md ("Error
// codes"), which runtime/supervisor/rpcerr's TestCodesDocumented holds to the Go code.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { ERROR_CODES, LAUNCH_CODES, PREFLIGHT_CODES, SupervisorError } from "../../src/index.js";

test("ERROR_CODES is docs/supervisor.md's table, in order", () => {
  const docs = readFileSync(new URL("../../../../../docs/supervisor.md", import.meta.url), "utf8");
  const section = docs.split("\n### Error codes\n")[1];
  assert.ok(section, 'docs/supervisor.md has no "### Error codes" section');
  const codes: string[] = [];
  let inTable = false;
  for (const line of section.split("\n")) {
    if (line.startsWith("|")) {
      inTable = true;
      const m = /^\| `([a-z-]+)` \|/.exec(line);
      if (m?.[1]) codes.push(m[1]);
    } else if (inTable) break;
  }
  assert.deepEqual(codes, [...ERROR_CODES]);
});

test("PREFLIGHT_CODES is docs/launcher.md's preflight table, in order", () => {
  const docs = readFileSync(new URL("../../../../../docs/launcher.md", import.meta.url), "utf8");
  const section = docs.split("\n## Preflight codes\n")[1];
  assert.ok(section, 'docs/launcher.md has no "## Preflight codes" section');
  const codes: string[] = [];
  for (const line of (section.split("\n## ")[0] ?? "").split("\n")) {
    const m = /^\| `(PP-PREFLIGHT-[A-Z-]+)` \|/.exec(line);
    if (m?.[1]) codes.push(m[1]);
  }
  assert.deepEqual(codes, [...PREFLIGHT_CODES]);
});

test("LAUNCH_CODES is docs/launcher.md's launch table, in order", () => {
  const docs = readFileSync(new URL("../../../../../docs/launcher.md", import.meta.url), "utf8");
  const section = docs.split("\n## Launch codes\n")[1];
  assert.ok(section, 'docs/launcher.md has no "## Launch codes" section');
  const codes: string[] = [];
  for (const line of (section.split("\n## ")[0] ?? "").split("\n")) {
    const m = /^\| `(PP-LAUNCH-[A-Z-]+)` \|/.exec(line);
    if (m?.[1]) codes.push(m[1]);
  }
  assert.deepEqual(codes, [...LAUNCH_CODES]);
});

test("SupervisorError carries the wire error's data", () => {
  const e = new SupervisorError({
    code: "refused",
    message: "2 diagnostics",
    diagnostics: [{ code: "PP-PATH-RELATIVE", path: "workspace.cwd", message: "m" }],
  });
  assert.equal(e.code, "refused");
  assert.deepEqual(e.diagnostics, [{ code: "PP-PATH-RELATIVE", path: "workspace.cwd", message: "m" }]);
  assert.equal(e.startFresh, false);
  assert.ok(e instanceof Error);
});
