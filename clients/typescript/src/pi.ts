// A Pi RPC session (`pi --mode rpc`, Pi 0.84 and 1.x) over a sandbox's stream: JSONL
// framing on LF, commands answered by id, every other frame an event. The supervisor and
// its bridge only move bytes (docs/supervisor.md, "The bridge"); this is where Pi's
// framing lives on the daemon's side.
//
// Everything Pi's stdout carries is untrusted data: any process in the sandbox can write
// to it. So a response resolves only a command this session sent and still waits for
// (same id, same command name), a frame that is not a JSON object with a string `type` is
// ignored and counted, a line has a maximum size, and what a daemon persists (the session
// id and file) is checked (pistate.ts) before the caller sees it.

import { randomBytes } from "node:crypto";
import { StringDecoder } from "node:string_decoder";

import { DEFAULT_MAX_LINE_BYTES, LineSplitter, LineTooLongError } from "./lines.js";
import { PiDataError, isThinkingLevel, parseState, type PiState, type ThinkingLevel } from "./pistate.js";
import type { GitImportResult, SandboxExit, SandboxInfo } from "./protocol.js";
import { AsyncQueue } from "./queue.js";
import { SandboxStream, createAndAttach, type OutputRecord, type StreamOptions } from "./sandbox.js";

/** An image in a prompt or a steer, as Pi takes it. */
export interface PiImage {
  type: "image";
  data: string;
  mimeType: string;
}

/** A Pi RPC command; `id` is assigned by the session. */
export type PiCommand =
  | { type: "prompt"; message: string; images?: PiImage[]; streamingBehavior?: "steer" | "followUp" }
  | { type: "steer"; message: string; images?: PiImage[] }
  | { type: "follow_up"; message: string; images?: PiImage[] }
  | { type: "abort" }
  | { type: "clear_queue" }
  | { type: "get_state" }
  | { type: "get_entries"; since?: string }
  | { type: "get_commands" }
  | { type: "get_available_models" }
  | { type: "get_available_thinking_levels" }
  | { type: "get_messages" }
  | { type: "get_session_stats" }
  | { type: "set_model"; provider: string; modelId: string }
  | { type: "set_thinking_level"; level: ThinkingLevel }
  | { type: "compact"; customInstructions?: string }
  | { type: "bash"; command: string; excludeFromContext?: boolean }
  | { type: "new_session" }
  | { type: "switch_session"; sessionPath: string }
  | { type: string; [k: string]: unknown };

/** Pi's answer to a command. */
export interface PiResponse<T = unknown> {
  type: "response";
  id: string;
  command: string;
  success: boolean;
  data?: T;
  /** At most MAX_ERROR_LENGTH characters of Pi's error. */
  error?: string;
}

/** A Pi event (every frame that is not a response to this session's command). */
export interface PiEvent {
  type: string;
  [k: string]: unknown;
}

/** What a turn produced: its events from the prompt's response to agent_settled. */
export interface TurnResult {
  response: PiResponse;
  events: PiEvent[];
  /** The assistant's text: the concatenated text deltas of the turn. */
  text: string;
}

/** What clear_queue took out of Pi's queues (the messages not yet delivered). */
export interface ClearedQueue {
  steering: string[];
  followUp: string[];
}

/** One entry of Pi's session tree (get_entries); the rest of its fields as Pi sent them. */
export interface PiEntry {
  type: string;
  id: string;
  parentId: string | null;
  [k: string]: unknown;
}

/** The frames a session read, by what became of them. */
export interface PiFrameStats {
  lines: number;
  events: number;
  responses: number;
  ignored: {
    /** Lines that are not JSON. */
    notJson: number;
    /** JSON that is not an object with a string `type` (null, an array, a number...). */
    notFrame: number;
    /** Responses with this session's id prefix that no command waits for, or that name another command. */
    response: number;
  };
}

/** Pi answered a command with success: false. */
export class PiError extends Error {
  override readonly name = "PiError";
  constructor(
    readonly command: string,
    message: string,
  ) {
    super(`${command}: ${message}`);
  }
}

/** A command got no answer within its timeout; the session goes on (a late answer is dropped). */
export class PiTimeoutError extends Error {
  override readonly name = "PiTimeoutError";
  readonly code = "timeout";
  constructor(
    readonly command: string,
    readonly timeoutMs: number,
  ) {
    super(`${command}: no answer from Pi in ${timeoutMs} ms`);
  }
}

/** The session ended before the command was answered (the sandbox ended, the stream failed). */
export class PiSessionEndedError extends Error {
  override readonly name = "PiSessionEndedError";
}

export const MAX_ERROR_LENGTH = 4096;
const MAX_BACKLOG = 100_000;
const UNKNOWN_STEER = "Unknown command: steer";
const UNKNOWN_CLEAR_QUEUE = "Unknown command: clear_queue";

/** What PiSession reads and writes: a SandboxStream, or a stand-in in tests. */
export interface PiTransport {
  readonly sandbox: string;
  /** The record after which output() starts. */
  readonly cursor: number;
  readonly ended: Promise<SandboxExit>;
  output(): AsyncIterableIterator<OutputRecord>;
  write(data: Uint8Array | string, inputId: string): Promise<unknown>;
  ack(cursor: number): Promise<void>;
  closeInput(): Promise<void>;
  close(): void;
  delete(): Promise<void>;
  /** The supervisor's gitImport for this sandbox (SandboxStream has it). */
  gitImport?(): Promise<GitImportResult>;
}

export interface PiOptions {
  /** The largest line taken (default 32 MiB); a longer one ends the session with LineTooLongError. */
  maxLineBytes?: number;
  /** A default timeout for commands' answers (default none). Never applied to abort. */
  commandTimeoutMs?: number;
  /** Acknowledge whole lines as they are read (default true). */
  autoAck?: boolean;
}

export interface PiSessionOptions extends StreamOptions, PiOptions {}

interface Waiter {
  command: string;
  resolve: (r: PiResponse) => void;
  reject: (e: unknown) => void;
  timer?: NodeJS.Timeout;
}

export class PiSession<S extends PiTransport = SandboxStream> {
  readonly stream: S;
  /** A prefix per session: a response with it is this session's, matched or dropped. */
  private readonly prefix = `ts-${randomBytes(4).toString("hex")}`;
  private n = 0;
  private readonly splitter: LineSplitter;
  private readonly stderrDecoder = new StringDecoder("utf8");
  private readonly waiting = new Map<string, Waiter>();
  private readonly subscribers = new Set<AsyncQueue<PiEvent>>();
  private lineEnd: number;
  private stderrTail = "";
  /** Events that arrived before anyone subscribed (bounded), for the first subscription. */
  private backlog: PiEvent[] = [];
  private backlogOpen = true;
  private ended = false;
  private endErr: unknown;
  private readonly commandTimeoutMs: number | undefined;
  private readonly ackLines: boolean;
  private ackTimer: NodeJS.Timeout | undefined;
  private failSession!: (e: unknown) => void;
  private readonly statsValue: PiFrameStats = { lines: 0, events: 0, responses: 0, ignored: { notJson: 0, notFrame: 0, response: 0 } };
  /**
   * Resolves with the sandbox's exit (Pi's exit code, a limit) once it ended; rejects if
   * the session failed first (a line over the limit, the stream lost).
   */
  readonly exit: Promise<SandboxExit>;

  private constructor(stream: S, opts: PiOptions) {
    this.stream = stream;
    this.splitter = new LineSplitter(opts.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES);
    this.commandTimeoutMs = opts.commandTimeoutMs;
    this.ackLines = opts.autoAck !== false;
    this.lineEnd = stream.cursor;
    const failed = new Promise<never>((_, reject) => (this.failSession = reject));
    failed.catch(() => {});
    this.exit = Promise.race([stream.ended, failed]);
    this.exit.catch(() => {}); // a caller that never looks must not crash the process
    void this.pump();
  }

  /** Creates a sandbox for facts and starts a session on it. */
  static async create(
    opts: Omit<PiSessionOptions, "sandbox" | "cursor"> & { deployment: string; facts: unknown },
  ): Promise<{ info: SandboxInfo; session: PiSession<SandboxStream> }> {
    const { info, stream } = await createAndAttach({ ...opts, autoAck: false });
    return { info, session: new PiSession(stream, opts) };
  }

  /**
   * Attaches to a running sandbox (a daemon after its own restart): records after cursor are
   * replayed, Pi's events among them, then live ones. Resume from `lineCursor` so the first
   * record starts a line. A session acknowledges whole lines only (unless `autoAck` is
   * false), so its `lineCursor` is never behind what the supervisor holds as acknowledged.
   */
  static async open(opts: PiSessionOptions): Promise<PiSession<SandboxStream>> {
    return new PiSession(await SandboxStream.open({ ...opts, autoAck: false }), opts);
  }

  /** A session over any transport whose output starts at a line (a stand-in, an embedding). */
  static over<T extends PiTransport>(transport: T, opts: PiOptions = {}): PiSession<T> {
    return new PiSession(transport, opts);
  }

  get sandbox(): string {
    return this.stream.sandbox;
  }

  /** The last record that ended a line: the cursor to persist for a later open(). */
  get lineCursor(): number {
    return this.lineEnd;
  }

  /** The last 4 KiB of Pi's stderr (for a failure's report). */
  get stderr(): string {
    return this.stderrTail;
  }

  /** How many frames were read, answered, delivered and ignored (a copy). */
  get stats(): PiFrameStats {
    return { ...this.statsValue, ignored: { ...this.statsValue.ignored } };
  }

  /** Whether the session has ended (the sandbox ended, or the session failed). */
  get isEnded(): boolean {
    return this.ended;
  }

  /**
   * Pi's events from now on (responses to this session's commands excepted; responses to
   * commands of an earlier client, replayed, are events). Each call is a subscription of its
   * own; it ends when the session ended. The events that arrived before the first
   * subscription (a replay after open()) go to that subscription unless `backlog` is false.
   */
  events(opts: { backlog?: boolean } = {}): AsyncIterableIterator<PiEvent> {
    const q = new AsyncQueue<PiEvent>();
    if (opts.backlog !== false) {
      for (const e of this.backlog.splice(0)) q.push(e);
    }
    this.backlog = [];
    this.backlogOpen = false;
    const base = q.return.bind(q);
    q.return = () => {
      this.subscribers.delete(q);
      return base();
    };
    if (this.ended) q.end(this.endErr);
    else this.subscribers.add(q);
    return q;
  }

  /**
   * Sends a command and resolves with Pi's response (success or not). `timeoutMs` (default
   * the session's `commandTimeoutMs`, never for abort) bounds the wait for the answer once
   * the command is written: PiTimeoutError, and the session goes on.
   */
  async command<T = unknown>(cmd: PiCommand, opts: { timeoutMs?: number } = {}): Promise<PiResponse<T>> {
    if (this.ended) throw this.endErr ?? new PiSessionEndedError("the session has ended");
    const id = `${this.prefix}-${++this.n}.${randomBytes(3).toString("hex")}`;
    const w: Waiter = { command: cmd.type, resolve: () => {}, reject: () => {} };
    const answer = new Promise<PiResponse>((resolve, reject) => {
      w.resolve = resolve;
      w.reject = reject;
    });
    this.waiting.set(id, w);
    try {
      // The input id is the command's: a write retried after a reconnect is applied once.
      await this.stream.write(JSON.stringify({ ...cmd, id }) + "\n", id);
    } catch (e) {
      this.waiting.delete(id);
      throw e;
    }
    const timeoutMs = opts.timeoutMs ?? (cmd.type === "abort" ? undefined : this.commandTimeoutMs);
    if (timeoutMs !== undefined && this.waiting.get(id) === w) {
      w.timer = setTimeout(() => {
        if (this.waiting.get(id) !== w) return;
        this.waiting.delete(id);
        w.reject(new PiTimeoutError(cmd.type, timeoutMs));
      }, timeoutMs);
    }
    return (await answer) as PiResponse<T>;
  }

  /** Writes a frame Pi answers with no response (extension_ui_response). */
  async send(frame: { type: string; [k: string]: unknown }): Promise<void> {
    if (this.ended) throw this.endErr ?? new PiSessionEndedError("the session has ended");
    const id = `${this.prefix}-${++this.n}.${randomBytes(3).toString("hex")}`;
    await this.stream.write(JSON.stringify(frame) + "\n", id);
  }

  /** A command that must succeed: its data, or a PiError. */
  async call<T = unknown>(cmd: PiCommand, opts: { timeoutMs?: number } = {}): Promise<T> {
    const r = await this.command<T>(cmd, opts);
    if (!r.success) throw new PiError(r.command, r.error ?? "failed");
    return r.data as T;
  }

  prompt(message: string, opts: { images?: PiImage[]; streamingBehavior?: "steer" | "followUp" } = {}): Promise<PiResponse> {
    return this.command({ type: "prompt", message, ...opts });
  }

  /**
   * Steers the turn under way (delivered after the current tool calls). "unavailable":
   * this Pi has no steer command (it answered "Unknown command: steer"); the caller falls
   * back, as Paseo does, to interrupting the turn and prompting again.
   */
  async steer(message: string, images?: PiImage[]): Promise<"accepted" | "unavailable"> {
    const r = await this.command({ type: "steer", message, ...(images?.length ? { images } : {}) });
    if (r.success) return "accepted";
    if (r.error === UNKNOWN_STEER) return "unavailable";
    throw new PiError("steer", r.error ?? "failed");
  }

  /**
   * Empties Pi's steering and follow-up queues, answering what they held; undefined when
   * this Pi has no clear_queue (before Pi 0.84.4).
   */
  async clearQueue(): Promise<ClearedQueue | undefined> {
    const r = await this.command({ type: "clear_queue" });
    if (!r.success) {
      if (r.error === UNKNOWN_CLEAR_QUEUE) return undefined;
      throw new PiError("clear_queue", r.error ?? "failed");
    }
    const d = r.data as Record<string, unknown> | undefined;
    const strings = (v: unknown, field: string): string[] => {
      if (v === undefined) return [];
      if (!Array.isArray(v) || !v.every((s) => typeof s === "string")) throw new PiDataError("invalid-response", field, "not a list of strings");
      return v as string[];
    };
    if (d === undefined || d === null) return { steering: [], followUp: [] };
    if (typeof d !== "object") throw new PiDataError("invalid-response", "data", "not an object");
    return { steering: strings(d.steering, "steering"), followUp: strings(d.followUp, "followUp") };
  }

  /**
   * Aborts the turn under way. Pi answers once the session is idle (the aborted message and
   * agent_settled first), however long that takes, so no default timeout applies.
   */
  abort(opts: { timeoutMs?: number } = {}): Promise<PiResponse> {
    return this.command({ type: "abort" }, opts);
  }

  /** What Paseo does to interrupt: empty the queues (when Pi has clear_queue), then abort. */
  async interrupt(): Promise<void> {
    await this.clearQueue();
    const r = await this.abort();
    if (!r.success) throw new PiError("abort", r.error ?? "failed");
  }

  /** Pi's state, checked (pistate.ts): the session id and file are safe to persist. */
  async getState(): Promise<PiState> {
    return parseState(await this.call({ type: "get_state" }));
  }

  async setThinkingLevel(level: ThinkingLevel): Promise<void> {
    if (!isThinkingLevel(level)) throw new RangeError(`thinking level ${JSON.stringify(level)}: not one of Pi's`);
    await this.call({ type: "set_thinking_level", level });
  }

  /** The session tree's entries (after `since`, an entry id) and the current leaf. */
  async getEntries(since?: string): Promise<{ entries: PiEntry[]; leafId: string | null }> {
    const d = await this.call<Record<string, unknown>>({ type: "get_entries", ...(since === undefined ? {} : { since }) });
    if (d === null || typeof d !== "object" || !Array.isArray(d.entries)) throw new PiDataError("invalid-response", "entries", "not a list");
    for (const e of d.entries as unknown[]) {
      const o = e as Record<string, unknown>;
      if (o === null || typeof o !== "object" || typeof o.type !== "string" || typeof o.id !== "string" || !(o.parentId === null || typeof o.parentId === "string")) {
        throw new PiDataError("invalid-response", "entries", "an entry without a type, id and parentId");
      }
    }
    const leafId = d.leafId ?? null;
    if (leafId !== null && typeof leafId !== "string") throw new PiDataError("invalid-response", "leafId", "not a string or null");
    return { entries: d.entries as PiEntry[], leafId };
  }

  /** Sends a prompt and collects the turn's events up to agent_settled (what Paseo waits for). */
  async turn(message: string): Promise<TurnResult> {
    const sub = this.events({ backlog: false });
    try {
      const response = await this.prompt(message);
      if (!response.success) throw new PiError("prompt", response.error ?? "failed");
      return { response, ...(await untilSettled(sub)) };
    } finally {
      await sub.return?.();
    }
  }

  /** Ends Pi's stdin: Pi exits; `exit` resolves with its exit code. */
  closeInput(): Promise<void> {
    return this.stream.closeInput();
  }

  /** Drops this client's attachment; the sandbox and Pi run on. */
  close(): void {
    clearTimeout(this.ackTimer);
    this.stream.close();
  }

  /**
   * Brings the agent's Git commits from its private store onto the worktree's branch (and
   * refs/heads/<agent>/*, its stash as refs/paseo/<agent>/stash), verified, through the
   * supervisor's gitImport. Call it after a turn (prompt() resolved). A refusal is a result
   * with `diagnostics` (no ref written), not a rejection; the session goes on either way.
   */
  importGit(): Promise<GitImportResult> {
    if (!this.stream.gitImport) return Promise.reject(new Error("this session's transport has no gitImport"));
    return this.stream.gitImport();
  }

  /** Deletes the sandbox. */
  delete(): Promise<void> {
    clearTimeout(this.ackTimer);
    return this.stream.delete();
  }

  private async pump(): Promise<void> {
    let err: unknown;
    try {
      for await (const r of this.stream.output()) {
        if (r.stream === "stderr") {
          this.stderrTail = (this.stderrTail + this.stderrDecoder.write(r.data)).slice(-4096);
          continue;
        }
        for (const line of this.splitter.push(r.data)) this.onLine(line);
        if (this.splitter.buffered === 0) {
          this.lineEnd = r.seq;
          this.scheduleAck();
        }
      }
    } catch (e) {
      err = e;
    }
    this.ended = true;
    this.endErr = err;
    // Before the stream is closed below: exit rejects with why the session failed, not with
    // the stream's "closed by this client".
    if (err !== undefined) this.failSession(err);
    if (err instanceof LineTooLongError) {
      // Stop taking the sandbox's output; the sandbox itself is the caller's (delete()).
      clearTimeout(this.ackTimer);
      this.stream.close();
    }
    const why = err ?? new PiSessionEndedError("the sandbox ended before Pi answered");
    for (const w of this.waiting.values()) {
      clearTimeout(w.timer);
      w.reject(why);
    }
    this.waiting.clear();
    for (const q of this.subscribers) q.end(err);
    this.subscribers.clear();
  }

  private scheduleAck(): void {
    if (!this.ackLines || this.ackTimer) return;
    this.ackTimer = setTimeout(() => {
      this.ackTimer = undefined;
      this.stream.ack(this.lineEnd).catch(() => {}); // the next ack covers a failed one
    }, 50);
  }

  private onLine(line: string): void {
    if (line.length === 0 || /^\s*$/.test(line)) return;
    this.statsValue.lines++;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch {
      this.statsValue.ignored.notJson++;
      return;
    }
    if (v === null || typeof v !== "object" || Array.isArray(v) || typeof (v as PiEvent).type !== "string") {
      this.statsValue.ignored.notFrame++;
      return;
    }
    const frame = v as PiEvent;
    if (frame.type === "response" && typeof frame.id === "string" && frame.id.startsWith(`${this.prefix}-`)) {
      this.onResponse(frame.id, frame);
      return;
    }
    this.statsValue.events++;
    if (this.backlogOpen && this.backlog.length < MAX_BACKLOG) this.backlog.push(frame);
    for (const q of this.subscribers) q.push(frame);
  }

  /** A response carrying this session's prefix: it answers the command waiting for it, or nothing. */
  private onResponse(id: string, frame: PiEvent): void {
    const w = this.waiting.get(id);
    const command = frame.command === undefined ? w?.command : frame.command;
    const error = frame.error;
    if (!w || command !== w.command || typeof frame.success !== "boolean" || (error !== undefined && typeof error !== "string")) {
      this.statsValue.ignored.response++;
      return;
    }
    this.waiting.delete(id);
    clearTimeout(w.timer);
    this.statsValue.responses++;
    const r: PiResponse = { type: "response", id, command: w.command, success: frame.success };
    if ("data" in frame) r.data = frame.data;
    if (typeof error === "string") r.error = error.slice(0, MAX_ERROR_LENGTH);
    w.resolve(r);
  }
}

async function untilSettled(sub: AsyncIterableIterator<PiEvent>): Promise<{ events: PiEvent[]; text: string }> {
  const events: PiEvent[] = [];
  let text = "";
  for await (const e of sub) {
    events.push(e);
    const ame = e.assistantMessageEvent as { type?: string; delta?: string } | undefined;
    if (e.type === "message_update" && ame?.type === "text_delta" && typeof ame.delta === "string") text += ame.delta;
    if (e.type === "agent_settled") return { events, text };
  }
  throw new PiError("prompt", "the sandbox ended before the turn settled");
}

/** The assistant text of a run of events (text deltas). */
export function assistantText(events: readonly PiEvent[]): string {
  let text = "";
  for (const e of events) {
    const ame = e.assistantMessageEvent as { type?: string; delta?: string } | undefined;
    if (e.type === "message_update" && ame?.type === "text_delta" && typeof ame.delta === "string") text += ame.delta;
  }
  return text;
}
