// The shapes of protocol v1 (docs/supervisor.md, "Protocol (version 1)";
// runtime/supervisor/protocol.go). Sequence numbers, cursors and epochs are uint64 on the
// wire and numbers here: exact up to 2^53, which no sandbox's output reaches.

import type { Diagnostic, WireError } from "./errors.js";

export const PROTOCOL_VERSION = 1;

export type Op =
  | "createSandbox"
  | "attach"
  | "write"
  | "ack"
  | "closeInput"
  | "signal"
  | "inspect"
  | "list"
  | "delete"
  | "hibernate"
  | "wake"
  | "gitImport";

/** A request frame; `v` and `id` are filled in by the connection. */
export interface Request {
  op: Op;
  deployment?: string;
  facts?: unknown;
  sandbox?: string;
  cursor?: number;
  epoch?: number;
  inputId?: string;
  /** base64 */
  data?: string;
  signal?: Signal;
  mcpToken?: string;
}

export interface Response<T = unknown> {
  v: 1;
  id: string;
  ok: boolean;
  result?: T;
  error?: WireError;
}

export type Signal = "TERM" | "INT" | "HUP" | "KILL";

export type Status = "running" | "running-unattached" | "exited" | "orphaned" | "hibernated";

/** The limit the launcher ended a sandbox at, by its name in the facts (limits.<name>). */
export type Limit = "wallSeconds" | "outputBytes" | "memoryBytes";

export interface RouteStats {
  forwarded: number;
  refused: number;
  outOfScope?: number;
  filtered?: number;
  refusedConns?: number;
  cut?: number;
}

/** What inspect, list, wake, hibernate and createSandbox answer. */
export interface SandboxInfo {
  sandbox: string;
  deployment: string;
  agent: string;
  profile: string;
  status: Status;
  exitCode?: number;
  reason?: string;
  limit?: Limit;
  epoch: number;
  nextSeq: number;
  acked: number;
  outputPaused: boolean;
  packets?: Record<string, number>;
  routes?: Record<string, RouteStats>;
  /** Once exited, when the plan granted the native search: its server's counters. */
  search?: SearchStats;
}

/** What the native search's server did (grant search workspace). */
export interface SearchStats {
  answered: number;
  fallback: number;
  refused: number;
}

export interface AttachResult {
  epoch: number;
  cursor: number;
}

export interface WriteResult {
  /** false: an input id already applied (a retry); nothing was written again. */
  applied: boolean;
}

export interface AckResult {
  acked: number;
}

export interface CloseInputResult {
  closed: boolean;
}

export interface SignalResult {
  signal: string;
}

export interface DeleteResult {
  deleted: string;
}

/** One ref a Git import moved; `old` is absent for a ref it created. */
export interface RefUpdate {
  ref: string;
  old?: string;
  new: string;
}

/**
 * What gitImport answers (docs/supervisor.md, "gitImport"): the agent's Git work brought from
 * its store onto the worktree's branch and its own namespace, run by the supervisor as this
 * daemon's uid. `diagnostics` non-empty: refused (PP-GIT-IMPORT-*), no ref written. `ignored`:
 * refs of the store outside the grant, never written. `base` is the branch's value the next
 * import moves it from.
 */
export interface GitImportResult {
  branch: string;
  base: string;
  updated: RefUpdate[];
  ignored?: Diagnostic[];
  diagnostics?: Diagnostic[];
}

export type Stream = "stdout" | "stderr";

export interface OutputEvent {
  v: 1;
  event: "output";
  sandbox: string;
  seq: number;
  stream: Stream;
  /** base64 */
  data?: string;
}

export interface DetachedEvent {
  v: 1;
  event: "detached";
  sandbox: string;
  reason?: string;
}

export type Event = OutputEvent | DetachedEvent;

/** A sandbox's end, as typed data (inspect of an exited sandbox). */
export interface SandboxExit {
  sandbox: string;
  /** undefined when the sandbox ended with its holder (its output is lost). */
  exitCode: number | undefined;
  /** Set when the launcher ended it at a limit; match this, not `reason`. */
  limit: Limit | undefined;
  /** For people. */
  reason: string | undefined;
  packets: Record<string, number>;
  routes: Record<string, RouteStats>;
}

export function exitOf(info: SandboxInfo): SandboxExit {
  return {
    sandbox: info.sandbox,
    exitCode: info.exitCode,
    limit: info.limit,
    reason: info.reason,
    packets: info.packets ?? {},
    routes: info.routes ?? {},
  };
}
