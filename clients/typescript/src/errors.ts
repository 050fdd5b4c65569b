// The supervisor's error answers, typed. The codes are runtime/supervisor/rpcerr's
// (docs/supervisor.md, "Error codes"); test/codes.test.ts holds this list to that table.
// Callers branch on `code` (and, for "refused", on each diagnostic's code and path),
// never on `message`.

/** Every error code of protocol v1, in the order docs/supervisor.md lists them. */
export const ERROR_CODES = [
  "malformed",
  "unknown-op",
  "forbidden",
  "not-found",
  "refused",
  "unavailable",
  "fenced",
  "state",
  "out-of-order",
  "busy",
  "quota",
  "internal",
  "sandbox-unavailable",
  "input-pending",
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * The launcher's preflight codes, one per check, in the order docs/launcher.md ("Preflight
 * codes") lists them: an "unavailable" (or "sandbox-unavailable") error the preflight caused
 * carries one diagnostic per failed check, with its code and the path `preflight.<check>`.
 * test/unit/codes.test.ts holds this list to that table.
 */
export const PREFLIGHT_CODES = [
  "PP-PREFLIGHT-ROOT",
  "PP-PREFLIGHT-KERNEL",
  "PP-PREFLIGHT-RUNSC-STATIC",
  "PP-PREFLIGHT-RUNSC-DIGEST",
  "PP-PREFLIGHT-CGROUP",
  "PP-PREFLIGHT-NFTABLES",
  "PP-PREFLIGHT-BUNDLE-DIGESTS",
  "PP-PREFLIGHT-BUNDLE-HOOKS",
  "PP-PREFLIGHT-BUNDLE-PINS",
  "PP-PREFLIGHT-IMAGE-EROFS",
  "PP-PREFLIGHT-BUNDLE-VALID",
] as const;

export type PreflightCode = (typeof PREFLIGHT_CODES)[number];

/**
 * The launcher's launch-step codes, in the order docs/launcher.md ("Launch codes") lists them: an
 * "unavailable" (or "sandbox-unavailable") error a launch step refused after preflight carries one
 * diagnostic with its code and the path `launch.<step>`. test/unit/codes.test.ts holds this list
 * to that table.
 */
export const LAUNCH_CODES = [
  "PP-LAUNCH-BUNDLE",
  "PP-LAUNCH-SECRET",
  "PP-LAUNCH-RESOLVE",
  "PP-LAUNCH-ID",
  "PP-LAUNCH-AUTHFILE-IN-USE",
  "PP-LAUNCH-STATE-DIR",
  "PP-LAUNCH-HIBERNATE-PATH",
  "PP-LAUNCH-WAKE",
  "PP-LAUNCH-HOST",
] as const;

export type LaunchCode = (typeof LAUNCH_CODES)[number];

/**
 * One diagnostic: a stable PP-* code and the path that caused it (a compiler's fact path,
 * `preflight.<check>` for a failed preflight check, whose code is one of PREFLIGHT_CODES, or
 * `launch.<step>` for a launch step's refusal, whose code is one of LAUNCH_CODES or, for a
 * pin staging refused at `launch.bind`, a PP-PATH-* code).
 */
export interface Diagnostic {
  code: string;
  path: string;
  message: string;
}

/** An error as the supervisor sends it. */
export interface WireError {
  code: ErrorCode;
  message: string;
  diagnostics?: Diagnostic[];
  startFresh?: boolean;
}

/** A typed refusal from the supervisor (of a request, or of the connection: busy). */
export class SupervisorError extends Error {
  override readonly name = "SupervisorError";
  readonly code: ErrorCode;
  /**
   * For "refused": every diagnostic the compiler gave, sorted by fact path. For "unavailable"
   * and "sandbox-unavailable": each failed preflight check (PREFLIGHT_CODES), or the launch step
   * that refused (LAUNCH_CODES).
   * Empty otherwise.
   */
  readonly diagnostics: readonly Diagnostic[];
  /** For "sandbox-unavailable": delete the sandbox and create it again (its session log resumes it). */
  readonly startFresh: boolean;

  constructor(e: WireError) {
    super(`${e.code}: ${e.message}`);
    this.code = e.code;
    this.diagnostics = Object.freeze([...(e.diagnostics ?? [])]);
    this.startFresh = e.startFresh === true;
  }
}

/** The connection to the supervisor is gone (or never came up) and the call's fate is unknown. */
export class ConnectionError extends Error {
  override readonly name = "ConnectionError";
}

/**
 * A call got no answer within its timeout. The call's fate is unknown (the supervisor may
 * have applied it); the connection stays open and usable, and the late answer, if any, is
 * dropped. Retry only what is safe to repeat (a write with the same input id).
 */
export class TimeoutError extends Error {
  override readonly name = "TimeoutError";
  readonly code = "timeout";
  constructor(
    readonly op: string,
    readonly timeoutMs: number,
  ) {
    super(`${op}: no answer from the supervisor in ${timeoutMs} ms`);
  }
}

/** Another attachment took the sandbox over; this one stopped rather than fight it. */
export class SupersededError extends Error {
  override readonly name = "SupersededError";
}

/** A response or event that is not protocol v1 (a bug on one side; never retried). */
export class ProtocolError extends Error {
  override readonly name = "ProtocolError";
}

export function isErrorCode(s: unknown): s is ErrorCode {
  return typeof s === "string" && (ERROR_CODES as readonly string[]).includes(s);
}
