// One connection to the supervisor's socket: JSON lines, requests answered by id, pushed
// events (after an attach) delivered in order. No retries here: SandboxStream reconnects.

import net from "node:net";

import { ConnectionError, ProtocolError, SupervisorError, TimeoutError, isErrorCode, type WireError } from "./errors.js";
import { LineSplitter, LineTooLongError } from "./lines.js";
import { AsyncQueue } from "./queue.js";
import {
  PROTOCOL_VERSION,
  type AckResult,
  type AttachResult,
  type CloseInputResult,
  type DeleteResult,
  type Event,
  type GitImportResult,
  type Request,
  type Response,
  type SandboxInfo,
  type Signal,
  type SignalResult,
  type WriteResult,
} from "./protocol.js";

/** The largest write frame the supervisor takes is 1 MiB; data is base64 in it. */
export const MAX_WRITE_BYTES = 512 * 1024;

/** Events buffered before the connection stops reading (the supervisor's bridge keeps the rest). */
const HIGH_WATER = 4096;
const LOW_WATER = 1024;

/** The longest line taken from the supervisor (its answers and events are far smaller). */
const MAX_LINE_BYTES = 16 * 1024 * 1024;

export interface ConnectOptions {
  /** Give up connecting after this long (default 10 s). */
  timeoutMs?: number;
  /**
   * A call that gets no answer in this long rejects with TimeoutError (default: calls wait
   * as long as the connection lives). The connection stays usable; see TimeoutError.
   */
  callTimeoutMs?: number;
}

export interface CallOptions {
  /** This call's timeout (default the connection's callTimeoutMs). */
  timeoutMs?: number;
}

interface Pending {
  resolve: (r: unknown) => void;
  reject: (e: unknown) => void;
  timer?: NodeJS.Timeout;
}

export class SupervisorConnection {
  private readonly socket: net.Socket;
  private readonly lines = new LineSplitter(MAX_LINE_BYTES);
  private readonly callTimeoutMs: number | undefined;
  private n = 0;
  private readonly pending = new Map<string, Pending>();
  private readonly queue = new AsyncQueue<Event>();
  private closedWith: Error | undefined;
  private refusal: Error | undefined;
  /** Resolves when the connection has ended, with why (undefined: closed by this side). */
  readonly closed: Promise<Error | undefined>;

  private constructor(socket: net.Socket, callTimeoutMs: number | undefined) {
    this.socket = socket;
    this.callTimeoutMs = callTimeoutMs;
    this.queue.onTake = (length) => {
      if (length <= LOW_WATER && this.socket.isPaused()) this.socket.resume();
    };
    let done!: (e: Error | undefined) => void;
    this.closed = new Promise((r) => (done = r));
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", (err) => {
      this.closedWith ??= new ConnectionError(`supervisor connection: ${err.message}`);
    });
    socket.on("close", () => {
      const why = this.refusal ?? this.closedWith ?? new ConnectionError("the supervisor closed the connection");
      this.closedWith = why;
      for (const p of this.pending.values()) {
        clearTimeout(p.timer);
        p.reject(why);
      }
      this.pending.clear();
      this.queue.end();
      done(why);
    });
  }

  /** Connects to the supervisor's socket (a pathname Unix socket, docs/supervisor.md). */
  static connect(path: string, opts: ConnectOptions = {}): Promise<SupervisorConnection> {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new ConnectionError(`connecting to ${path}: timed out`));
      }, opts.timeoutMs ?? 10_000);
      socket.once("connect", () => {
        clearTimeout(timer);
        socket.removeAllListeners("error");
        resolve(new SupervisorConnection(socket, opts.callTimeoutMs));
      });
      socket.once("error", (err: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        reject(Object.assign(new ConnectionError(`connecting to ${path}: ${err.code ?? err.message}`), { errno: err.code }));
      });
    });
  }

  /** The events this connection carries (output records and detached), in order; ends with it. */
  events(): AsyncIterableIterator<Event> {
    return this.queue;
  }

  /** Drops the connection (an attachment on it ends; the sandbox runs on). */
  close(): void {
    this.closedWith ??= new ConnectionError("the connection was closed by this client");
    this.socket.destroy();
  }

  get isClosed(): boolean {
    return this.closedWith !== undefined;
  }

  private onData(chunk: Buffer): void {
    let lines: string[];
    try {
      lines = this.lines.push(chunk);
    } catch (e) {
      if (!(e instanceof LineTooLongError)) throw e;
      this.closedWith ??= new ProtocolError(`the supervisor sent ${e.message}`);
      this.socket.destroy();
      return;
    }
    for (const line of lines) {
      if (this.closedWith) return;
      if (line !== "") this.onLine(line);
    }
  }

  private onLine(line: string): void {
    let frame: Record<string, unknown>;
    try {
      frame = JSON.parse(line) as Record<string, unknown>;
    } catch {
      frame = null as unknown as Record<string, unknown>;
    }
    if (frame === null || typeof frame !== "object" || Array.isArray(frame)) {
      this.closedWith ??= new ProtocolError("the supervisor sent a line that is not a JSON object");
      this.socket.destroy();
      return;
    }
    if (typeof frame.event === "string") {
      this.queue.push(frame as unknown as Event);
      if (this.queue.length >= HIGH_WATER) this.socket.pause();
      return;
    }
    const r = frame as unknown as Response;
    const p = this.pending.get(r.id);
    if (!p) {
      // A response to no request is the supervisor refusing the connection (busy, a frame it
      // could not read) before it closes it.
      if (r.id === "" && r.error) this.refusal = toError(r.error);
      return;
    }
    this.pending.delete(r.id);
    clearTimeout(p.timer);
    if (r.ok) p.resolve(r.result);
    else p.reject(r.error ? toError(r.error) : new ProtocolError("the supervisor refused without an error"));
  }

  /**
   * Sends one request and resolves with its result, or rejects with a SupervisorError (the
   * supervisor's refusal), a ConnectionError (the connection ended first) or a TimeoutError
   * (no answer within the call's timeout: the connection stays usable, the late answer is
   * dropped, the call's fate is unknown).
   */
  call<T>(req: Request, opts: CallOptions = {}): Promise<T> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    const id = `ts${++this.n}`;
    const frame = JSON.stringify({ v: PROTOCOL_VERSION, id, ...req }) + "\n";
    const timeoutMs = opts.timeoutMs ?? this.callTimeoutMs;
    return new Promise<T>((resolve, reject) => {
      const p: Pending = { resolve: resolve as (r: unknown) => void, reject };
      if (timeoutMs !== undefined) {
        p.timer = setTimeout(() => {
          if (this.pending.get(id) !== p) return;
          this.pending.delete(id);
          reject(new TimeoutError(req.op, timeoutMs));
        }, timeoutMs);
      }
      this.pending.set(id, p);
      this.socket.write(frame);
    });
  }

  createSandbox(deployment: string, facts: unknown, opts: { mcpToken?: string } = {}): Promise<SandboxInfo> {
    return this.call({ op: "createSandbox", deployment, facts, ...token(opts.mcpToken) });
  }

  /** Makes this connection the sandbox's attachment from cursor (records after it are replayed). */
  attach(sandbox: string, cursor: number, opts: { mcpToken?: string } = {}): Promise<AttachResult> {
    return this.call({ op: "attach", sandbox, cursor, ...token(opts.mcpToken) });
  }

  write(sandbox: string, epoch: number, inputId: string, data: Uint8Array | string): Promise<WriteResult> {
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    if (bytes.length > MAX_WRITE_BYTES) {
      return Promise.reject(new RangeError(`write of ${bytes.length} bytes: at most ${MAX_WRITE_BYTES} a frame`));
    }
    return this.call({ op: "write", sandbox, epoch, inputId, data: bytes.toString("base64") });
  }

  ack(sandbox: string, cursor: number): Promise<AckResult> {
    return this.call({ op: "ack", sandbox, cursor });
  }

  closeInput(sandbox: string, epoch: number): Promise<CloseInputResult> {
    return this.call({ op: "closeInput", sandbox, epoch });
  }

  signal(sandbox: string, signal: Signal): Promise<SignalResult> {
    return this.call({ op: "signal", sandbox, signal });
  }

  inspect(sandbox: string): Promise<SandboxInfo> {
    return this.call({ op: "inspect", sandbox });
  }

  list(): Promise<SandboxInfo[]> {
    return this.call({ op: "list" });
  }

  delete(sandbox: string): Promise<DeleteResult> {
    return this.call({ op: "delete", sandbox });
  }

  hibernate(sandbox: string): Promise<SandboxInfo> {
    return this.call({ op: "hibernate", sandbox });
  }

  wake(sandbox: string): Promise<SandboxInfo> {
    return this.call({ op: "wake", sandbox });
  }

  /** Imports the sandbox's Git work onto the worktree's branch (the supervisor runs it as this daemon). */
  gitImport(sandbox: string): Promise<GitImportResult> {
    return this.call({ op: "gitImport", sandbox });
  }
}

function token(t: string | undefined): { mcpToken?: string } {
  return t === undefined ? {} : { mcpToken: t };
}

function toError(e: WireError): SupervisorError | ProtocolError {
  if (!isErrorCode(e.code)) return new ProtocolError(`the supervisor answered an unknown error code ${JSON.stringify(e.code)}`);
  return new SupervisorError(e);
}
