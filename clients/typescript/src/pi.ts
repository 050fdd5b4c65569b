// A Pi RPC session (`pi --mode rpc`, Pi 0.84.2) over a sandbox's stream: JSONL framing on
// LF, commands answered by id, every other frame an event. The supervisor and its bridge
// only move bytes (docs/supervisor.md, "The bridge"); this is where Pi's framing lives on
// the daemon's side, as Paseo's own Pi transport frames it.

import { randomUUID } from "node:crypto";

import type { SandboxExit, SandboxInfo } from "./protocol.js";
import { AsyncQueue } from "./queue.js";
import { SandboxStream, createAndAttach, type StreamOptions } from "./sandbox.js";

/** A Pi RPC command; `id` is assigned by the session. */
export type PiCommand =
  | { type: "prompt"; message: string; images?: unknown[]; streamingBehavior?: "steer" | "followUp" }
  | { type: "steer"; message: string }
  | { type: "follow_up"; message: string }
  | { type: "abort" }
  | { type: "get_state" }
  | { type: "get_commands" }
  | { type: "get_available_models" }
  | { type: "get_messages" }
  | { type: "get_session_stats" }
  | { type: "set_model"; provider: string; modelId: string }
  | { type: "set_thinking_level"; level: string }
  | { type: "compact"; customInstructions?: string }
  | { type: "bash"; command: string }
  | { type: "new_session" }
  | { type: "switch_session"; sessionPath: string }
  | { type: string; [k: string]: unknown };

/** Pi's answer to a command. */
export interface PiResponse<T = unknown> {
  type: "response";
  id?: string;
  command: string;
  success: boolean;
  data?: T;
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

export class PiError extends Error {
  override readonly name = "PiError";
  constructor(
    readonly command: string,
    message: string,
  ) {
    super(`${command}: ${message}`);
  }
}

interface Waiter {
  resolve: (r: PiResponse) => void;
  reject: (e: unknown) => void;
}

export interface PiSessionOptions extends StreamOptions {}

export class PiSession {
  readonly stream: SandboxStream;
  private readonly prefix = `ts-${randomUUID().slice(0, 8)}`;
  private n = 0;
  private partial = "";
  private readonly waiting = new Map<string, Waiter>();
  private readonly subscribers = new Set<AsyncQueue<PiEvent>>();
  private lineEnd: number;
  private stderrTail = "";
  /** Events that arrived before anyone subscribed (bounded), for the first subscription. */
  private backlog: PiEvent[] = [];
  private backlogOpen = true;
  private ended = false;
  private endErr: unknown;
  /** Resolves with the sandbox's exit (Pi's exit code, a limit) once it ended. */
  readonly exit: Promise<SandboxExit>;

  private readonly ackLines: boolean;
  private ackTimer: NodeJS.Timeout | undefined;

  private constructor(stream: SandboxStream, ackLines: boolean) {
    this.stream = stream;
    this.ackLines = ackLines;
    this.lineEnd = stream.cursor;
    this.exit = stream.ended;
    void this.pump();
  }

  /** Creates a sandbox for facts and starts a session on it. */
  static async create(opts: Omit<PiSessionOptions, "sandbox" | "cursor"> & { deployment: string; facts: unknown }): Promise<{ info: SandboxInfo; session: PiSession }> {
    const { info, stream } = await createAndAttach({ ...opts, autoAck: false });
    return { info, session: new PiSession(stream, opts.autoAck !== false) };
  }

  /**
   * Attaches to a running sandbox (a daemon after its own restart): records after cursor are
   * replayed, Pi's events among them, then live ones. Resume from `lineCursor` so the first
   * record starts a line. A session acknowledges whole lines only (unless `autoAck` is
   * false), so its `lineCursor` is never behind what the supervisor holds as acknowledged.
   */
  static async open(opts: PiSessionOptions): Promise<PiSession> {
    return new PiSession(await SandboxStream.open({ ...opts, autoAck: false }), opts.autoAck !== false);
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

  /**
   * Pi's events from now on (responses to this session's commands excepted; responses to
   * commands of an earlier client, replayed, are events). Each call is a subscription of its
   * own; it ends when the sandbox ended. The events that arrived before the first
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

  /** Sends a command and resolves with Pi's response (success or not). */
  async command<T = unknown>(cmd: PiCommand): Promise<PiResponse<T>> {
    const id = `${this.prefix}-${++this.n}`;
    const answer = new Promise<PiResponse>((resolve, reject) => this.waiting.set(id, { resolve, reject }));
    try {
      // The input id is the command's: a write retried after a reconnect is applied once.
      await this.stream.write(JSON.stringify({ ...cmd, id }) + "\n", id);
    } catch (e) {
      this.waiting.delete(id);
      throw e;
    }
    return (await answer) as PiResponse<T>;
  }

  /** A command that must succeed: its data, or a PiError. */
  async call<T = unknown>(cmd: PiCommand): Promise<T> {
    const r = await this.command<T>(cmd);
    if (!r.success) throw new PiError(r.command, r.error ?? "failed");
    return r.data as T;
  }

  prompt(message: string): Promise<PiResponse> {
    return this.command({ type: "prompt", message });
  }

  abort(): Promise<PiResponse> {
    return this.command({ type: "abort" });
  }

  getState<T = Record<string, unknown>>(): Promise<T> {
    return this.call<T>({ type: "get_state" });
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
          this.stderrTail = (this.stderrTail + r.data.toString("utf8")).slice(-4096);
          continue;
        }
        this.partial += r.data.toString("utf8");
        let i: number;
        while ((i = this.partial.indexOf("\n")) >= 0) {
          const line = this.partial.slice(0, i);
          this.partial = this.partial.slice(i + 1);
          this.onLine(line);
        }
        if (this.partial === "") {
          this.lineEnd = r.seq;
          this.scheduleAck();
        }
      }
    } catch (e) {
      err = e;
    }
    const why = err ?? new PiError("session", "the sandbox ended before Pi answered");
    for (const w of this.waiting.values()) w.reject(why);
    this.waiting.clear();
    for (const q of this.subscribers) q.end(err);
    this.ended = true;
    this.endErr = err;
  }

  private scheduleAck(): void {
    if (!this.ackLines || this.ackTimer) return;
    this.ackTimer = setTimeout(() => {
      this.ackTimer = undefined;
      this.stream.ack(this.lineEnd).catch(() => {}); // the next ack covers a failed one
    }, 50);
  }

  private onLine(line: string): void {
    if (line.trim() === "") return;
    let frame: PiEvent;
    try {
      frame = JSON.parse(line) as PiEvent;
    } catch {
      frame = { type: "invalid_line", line };
    }
    if (frame.type === "response" && typeof frame.id === "string") {
      const w = this.waiting.get(frame.id);
      if (w) {
        this.waiting.delete(frame.id);
        w.resolve(frame as unknown as PiResponse);
        return;
      }
    }
    if (this.backlogOpen && this.backlog.length < 100_000) this.backlog.push(frame);
    for (const q of this.subscribers) q.push(frame);
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
