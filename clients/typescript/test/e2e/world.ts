// The world the tests run in: the real supervisor (paseo-policy supervise, as root), the
// real Pi image in gVisor, the fake model on a test host. test/e2e TestTypeScriptClient
// builds it and runs `npm test` with PASEO_TS_WORLD naming this file; without it the
// tests fail (they never skip).

import { readFileSync } from "node:fs";

import type { Diagnostic } from "../../src/index.js";

export interface World {
  socket: string;
  deployment: string;
  facts: unknown;
  mcpToken: string;
  /** The file the harness (standing in for systemd, Restart=always) writes the supervisor's pid to. */
  supervisorPidFile: string;
  /** The assistant text of every scripted turn of the fake model. */
  turnText: string;
  refused: { facts: unknown; diagnostics: Diagnostic[]; secret: string };
  /** The workspace (the facts' workspace.cwd) as the host sees it. */
  workspace: string;
  /** A prompt beginning with tool.prefix makes the fake model call Pi's write tool on tool.file, then answer tool.text. */
  tool: { prefix: string; file: string; content: string; text: string };
}

export function world(): World {
  const p = process.env.PASEO_TS_WORLD;
  if (!p) {
    throw new Error(
      "PASEO_TS_WORLD is not set: these tests run against the real supervisor and Pi; run them through `make e2e-ts` (go test ./test/e2e -run TestTypeScriptClient, as root)",
    );
  }
  return JSON.parse(readFileSync(p, "utf8")) as World;
}

export function supervisorPid(w: World): number {
  return Number(readFileSync(w.supervisorPidFile, "utf8").trim());
}

export async function until(what: string, cond: () => boolean | Promise<boolean>, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
