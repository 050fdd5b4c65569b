// A sandbox's attachment that survives dropped connections and supervisor restarts: it
// reattaches from the last acknowledged cursor, drops the records the replay repeats, and
// refuses a gap, so its consumer sees every record exactly once and in order.

import { randomUUID } from "node:crypto";

import { MAX_WRITE_BYTES, SupervisorConnection, type ConnectOptions } from "./connection.js";
import { ConnectionError, ProtocolError, SupersededError, SupervisorError } from "./errors.js";
import { AsyncQueue } from "./queue.js";
import { exitOf, type Event, type GitImportResult, type SandboxExit, type SandboxInfo, type Signal, type Stream, type WriteResult } from "./protocol.js";

export interface OutputRecord {
  seq: number;
  stream: Stream;
  data: Buffer;
}

export interface ReconnectOptions {
  /** First pause between attempts (default 50 ms); doubles up to maxDelayMs (default 1 s). */
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Give up (the stream fails with ConnectionError) after this long without a connection (default 120 s). */
  giveUpAfterMs?: number;
}

export interface StreamOptions {
  socketPath: string;
  sandbox: string;
  /** Attach after this record (a cursor the daemon persisted); default 0, everything kept. */
  cursor?: number;
  /** The daemon run's MCP bearer, handed over on every (re)attach. Never logged or echoed. */
  mcpToken?: string;
  reconnect?: ReconnectOptions;
  /** Acknowledge records once the consumer took them (default true); else call ack() yourself. */
  autoAck?: boolean;
  /** A timeout for each call to the supervisor (default none); see SupervisorConnection.call. */
  callTimeoutMs?: number;
  /** Called after every reattach (not the first attach), with the new epoch. */
  onReattach?: (r: { epoch: number; cursor: number }) => void;
}

/** Records queued for the consumer before the stream stops taking more from the connection. */
const MAX_QUEUED = 4096;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A failure a retry may cure: no supervisor listening (a restart), a dropped connection, a cap. */
function transient(e: unknown): boolean {
  return e instanceof ConnectionError || (e instanceof SupervisorError && e.code === "busy");
}

export class SandboxStream {
  readonly sandbox: string;
  private readonly opts: StreamOptions;
  private conn: SupervisorConnection | undefined;
  private epochValue = 0;
  /** The last record handed to the queue (replays up to it are dropped). */
  private delivered: number;
  /** The last record the consumer took. */
  private consumed: number;
  /** The last cursor the supervisor confirmed acknowledged. */
  private ackedValue: number;
  private readonly records = new AsyncQueue<OutputRecord>();
  private attaching: Promise<void> | undefined;
  private closing = false;
  private failure: Error | undefined;
  private ackTimer: NodeJS.Timeout | undefined;
  private drained: (() => void) | undefined;
  private endResolve!: (e: SandboxExit) => void;
  private endReject!: (e: unknown) => void;
  /** Resolves with the sandbox's exit once it ended (and every record was delivered). */
  readonly ended: Promise<SandboxExit>;

  private constructor(opts: StreamOptions) {
    this.opts = opts;
    this.sandbox = opts.sandbox;
    this.delivered = this.consumed = this.ackedValue = opts.cursor ?? 0;
    this.ended = new Promise((res, rej) => {
      this.endResolve = res;
      this.endReject = rej;
    });
    this.ended.catch(() => {}); // a consumer that never looks must not crash the process
    this.records.onTake = () => this.took();
  }

  /** Attaches to the sandbox (retrying the connection as after a drop). */
  static async open(opts: StreamOptions): Promise<SandboxStream> {
    const s = new SandboxStream(opts);
    await s.reattach(false);
    return s;
  }

  private connectOptions(): ConnectOptions {
    return this.opts.callTimeoutMs === undefined ? {} : { callTimeoutMs: this.opts.callTimeoutMs };
  }

  /** The current attachment's epoch (writes are fenced to it). */
  get epoch(): number {
    return this.epochValue;
  }

  /** The last record the consumer took: persist this (or `acked`) to reattach from later. */
  get cursor(): number {
    return this.consumed;
  }

  get acked(): number {
    return this.ackedValue;
  }

  /** Every output record after the cursor, each once, in order; ends when the sandbox ended. */
  output(): AsyncIterableIterator<OutputRecord> {
    return this.records;
  }

  /**
   * Writes to the agent's stdin under the current epoch. The input id makes a retry safe:
   * after a dropped connection or a fenced epoch the write is retried with the same id, and
   * the supervisor applies it once.
   */
  async write(data: Uint8Array | string, inputId: string = randomUUID()): Promise<WriteResult> {
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    let applied = false;
    for (let off = 0, i = 0; off < bytes.length || (off === 0 && i === 0); off += MAX_WRITE_BYTES, i++) {
      const id = bytes.length <= MAX_WRITE_BYTES ? inputId : `${inputId}#${i}`;
      const r = await this.retrying((c) => c.write(this.sandbox, this.epochValue, id, bytes.subarray(off, off + MAX_WRITE_BYTES)));
      applied ||= r.applied;
    }
    return { applied };
  }

  /** Ends the agent's stdin (Pi then exits). */
  async closeInput(): Promise<void> {
    await this.retrying((c) => c.closeInput(this.sandbox, this.epochValue));
  }

  /**
   * Acknowledges records up to cursor (default: every record the consumer has taken from
   * output()); the bridge may then drop them, and a reattach starts after them.
   */
  async ack(cursor: number = this.consumed): Promise<void> {
    if (cursor <= this.ackedValue) return;
    const r = await this.control((c) => c.ack(this.sandbox, cursor));
    this.ackedValue = Math.max(this.ackedValue, r.acked);
  }

  inspect(): Promise<SandboxInfo> {
    return this.control((c) => c.inspect(this.sandbox));
  }

  /** Checkpoints the sandbox; the next write (or wake) restores it, the attachment stays. */
  hibernate(): Promise<SandboxInfo> {
    return this.control((c) => c.hibernate(this.sandbox));
  }

  wake(): Promise<SandboxInfo> {
    return this.control((c) => c.wake(this.sandbox));
  }

  /** Imports the agent's Git work from its store onto the worktree's branch (gitImport). */
  gitImport(): Promise<GitImportResult> {
    return this.control((c) => c.gitImport(this.sandbox));
  }

  signal(sig: Signal): Promise<unknown> {
    return this.control((c) => c.signal(this.sandbox, sig));
  }

  /** Deletes the sandbox (everything it had) and closes this stream. */
  async delete(): Promise<void> {
    await this.control((c) => c.delete(this.sandbox));
    this.close();
  }

  /**
   * Runs an op that needs no epoch: on the attached connection while it lives, else on a
   * connection of its own (after the sandbox ended, or while reattaching), retrying a
   * dropped connection until the give-up deadline.
   */
  private async control<T>(op: (c: SupervisorConnection) => Promise<T>): Promise<T> {
    const r = this.opts.reconnect ?? {};
    const deadline = Date.now() + (r.giveUpAfterMs ?? 120_000);
    let delay = r.initialDelayMs ?? 50;
    for (;;) {
      const live = this.conn && !this.conn.isClosed ? this.conn : undefined;
      let own: SupervisorConnection | undefined;
      try {
        own = live ? undefined : await SupervisorConnection.connect(this.opts.socketPath, this.connectOptions());
        return await op((live ?? own) as SupervisorConnection);
      } catch (e) {
        if (!transient(e) || Date.now() > deadline) throw e;
      } finally {
        own?.close();
      }
      await sleep(delay);
      delay = Math.min(delay * 2, r.maxDelayMs ?? 1000);
    }
  }

  /** Drops this client's attachment; the sandbox runs on in its holder. */
  close(): void {
    this.closing = true;
    this.drained?.();
    clearTimeout(this.ackTimer);
    this.conn?.close();
    this.records.end();
    this.endReject(new ConnectionError("the stream was closed by this client"));
  }

  /** Drops the connection as a crash would; the stream reconnects and reattaches (tests, chaos). */
  dropConnection(): void {
    this.conn?.close();
  }

  private took(): void {
    if (this.drained && this.records.length <= MAX_QUEUED / 2) {
      const d = this.drained;
      this.drained = undefined;
      d();
    }
    // The consumer asks for the next record only after it handled the last one.
    this.consumed = Math.max(this.consumed, this.delivered - this.records.length);
    if (this.opts.autoAck === false || this.ackTimer) return;
    this.ackTimer = setTimeout(() => {
      this.ackTimer = undefined;
      this.ack().catch(() => {}); // a failed ack is retried by the next one
    }, 50);
  }

  /** Runs op on a live, attached connection, reattaching once per connection loss or fence. */
  private async retrying<T>(op: (c: SupervisorConnection) => Promise<T>): Promise<T> {
    const deadline = Date.now() + (this.opts.reconnect?.giveUpAfterMs ?? 120_000);
    for (;;) {
      if (this.failure) throw this.failure;
      if (this.attaching) await this.attaching;
      const c = this.conn;
      if (!c || c.isClosed) {
        await this.reattach(true);
        continue;
      }
      try {
        return await op(c);
      } catch (e) {
        const retry = transient(e) || (e instanceof SupervisorError && e.code === "fenced");
        if (!retry || this.closing || Date.now() > deadline) throw e;
        if (c === this.conn && !c.isClosed && e instanceof SupervisorError) {
          // Fenced on a live connection: another attachment is newer. Do not fight it.
          throw new SupersededError(`sandbox ${this.sandbox}: another attachment is newer (${e.message})`);
        }
        await this.reattach(true);
      }
    }
  }

  /** Connects (with backoff) and attaches from the acknowledged cursor; one at a time. */
  private reattach(again: boolean): Promise<void> {
    if (!this.attaching) {
      this.attaching = this.attachLoop(again).finally(() => (this.attaching = undefined));
    }
    return this.attaching;
  }

  private async attachLoop(again: boolean): Promise<void> {
    const r = this.opts.reconnect ?? {};
    let delay = r.initialDelayMs ?? 50;
    const deadline = Date.now() + (r.giveUpAfterMs ?? 120_000);
    for (let attempt = 0; ; attempt++) {
      if (this.closing) throw new ConnectionError("the stream has ended (the sandbox ended or this client closed it)");
      if (this.conn && !this.conn.isClosed) return; // another caller reattached meanwhile
      let c: SupervisorConnection | undefined;
      try {
        c = await SupervisorConnection.connect(this.opts.socketPath, this.connectOptions());
        // Reattach from what the supervisor was told is acknowledged; a cursor behind its
        // own (an ack whose answer the drop lost) is out-of-order, and everything up to
        // what was delivered is in this client already.
        let att;
        try {
          att = await c.attach(this.sandbox, this.ackedValue, { mcpToken: this.opts.mcpToken });
        } catch (e) {
          if (!(e instanceof SupervisorError && e.code === "out-of-order")) throw e;
          // Acknowledged past what this client was told: by this client (an ack whose
          // answer the drop lost: it has those records) or by an earlier client of the
          // sandbox (it took them). Either way they are not this consumer's to get again.
          const { acked } = await c.inspect(this.sandbox);
          const from = Math.max(this.delivered, acked);
          this.delivered = this.consumed = this.ackedValue = Math.max(this.ackedValue, from);
          att = await c.attach(this.sandbox, from, { mcpToken: this.opts.mcpToken });
        }
        this.conn = c;
        this.epochValue = att.epoch;
        this.pump(c);
        if (again) this.opts.onReattach?.({ epoch: att.epoch, cursor: att.cursor });
        return;
      } catch (e) {
        c?.close();
        if (!transient(e) || Date.now() > deadline) {
          this.fail(e instanceof Error ? e : new Error(String(e)));
          throw e;
        }
        await sleep(delay);
        delay = Math.min(delay * 2, r.maxDelayMs ?? 1000);
      }
    }
  }

  /** Moves one connection's events into the record queue until it ends. */
  private pump(c: SupervisorConnection): void {
    void (async () => {
      let detached = false;
      for await (const e of c.events() as AsyncIterable<Event>) {
        if (e.event === "detached") {
          detached = true;
          break;
        }
        if (e.sandbox !== this.sandbox) continue;
        if (e.seq <= this.delivered) continue; // the replay of what this client has
        if (e.seq !== this.delivered + 1) {
          this.fail(new ProtocolError(`record ${e.seq} after ${this.delivered}: a gap in the replay`));
          c.close();
          return;
        }
        this.delivered = e.seq;
        this.records.push({ seq: e.seq, stream: e.stream, data: Buffer.from(e.data ?? "", "base64") });
        // A slow consumer holds the pump, so the connection stops reading and the records
        // wait in the supervisor's bridge (bounded there, back-pressure on the agent).
        if (this.records.length >= MAX_QUEUED) await new Promise<void>((r) => (this.drained = r));
      }
      if (this.closing || this.failure || c !== this.conn) return;
      if (detached && !c.isClosed) {
        // The attachment ended on a live connection: the sandbox ended (its output closes
        // a moment before its holder records the exit), or a newer attachment superseded
        // this one (the sandbox's epoch moved past ours). Inspect says which.
        try {
          for (const deadline = Date.now() + 30_000; ; await sleep(100)) {
            const info = await c.inspect(this.sandbox);
            if (info.status === "exited" || info.status === "orphaned") {
              this.finish(info);
              return;
            }
            if (info.epoch > this.epochValue) {
              this.fail(new SupersededError(`sandbox ${this.sandbox}: attachment ${info.epoch} superseded this one (${this.epochValue})`));
              return;
            }
            if (Date.now() > deadline) {
              this.fail(new ProtocolError(`sandbox ${this.sandbox}: the attachment ended, but the sandbox neither ended nor was attached again`));
              return;
            }
          }
        } catch (e) {
          if (!(e instanceof ConnectionError)) this.fail(e instanceof Error ? e : new Error(String(e)));
          else this.reattach(true).catch(() => {});
        }
        return;
      }
      // The connection dropped (the supervisor restarted, the network of the host hiccuped):
      // reattach; the replay continues exactly after the last delivered record.
      this.reattach(true).catch(() => {});
    })();
  }

  private finish(info: SandboxInfo): void {
    this.records.end();
    this.conn?.close();
    this.closing = true;
    this.endResolve(exitOf(info));
  }

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    this.drained?.();
    this.conn?.close();
    this.records.end(err);
    this.endReject(err);
  }
}

/** Creates a sandbox and attaches to it: the usual start of an agent. */
export async function createAndAttach(
  opts: Omit<StreamOptions, "sandbox" | "cursor"> & { deployment: string; facts: unknown },
): Promise<{ info: SandboxInfo; stream: SandboxStream }> {
  const c = await SupervisorConnection.connect(opts.socketPath, opts.callTimeoutMs === undefined ? {} : { callTimeoutMs: opts.callTimeoutMs });
  let info: SandboxInfo;
  try {
    info = await c.createSandbox(opts.deployment, opts.facts, { mcpToken: opts.mcpToken });
  } finally {
    c.close();
  }
  const stream = await SandboxStream.open({ ...opts, sandbox: info.sandbox });
  return { info, stream };
}
