// A stand-in for a sandbox's stream with a scripted Pi behind it: what the session writes
// is parsed and handed to `onCommand`; what the test emits is Pi's stdout (or stderr) as
// output records, in whatever chunks the test chooses. No supervisor, no Pi.

import { AsyncQueue } from "../../src/queue.js";
import type { OutputRecord, PiTransport, SandboxExit } from "../../src/index.js";

export type Frame = { id?: string; type: string; [k: string]: unknown };

export class FakePi implements PiTransport {
  readonly sandbox = "pp-fake";
  readonly cursor = 0;
  readonly ended: Promise<SandboxExit>;
  /** Every frame the session wrote, in order. */
  readonly written: Frame[] = [];
  readonly acks: number[] = [];
  closed = false;
  /** Called with each frame the session writes; answer with respond()/emit(). */
  onCommand: (f: Frame) => void = () => {};
  private seq = 0;
  private readonly records = new AsyncQueue<OutputRecord>();
  private endResolve!: (e: SandboxExit) => void;
  private endReject!: (e: unknown) => void;

  constructor() {
    this.ended = new Promise((res, rej) => {
      this.endResolve = res;
      this.endReject = rej;
    });
    this.ended.catch(() => {});
  }

  output(): AsyncIterableIterator<OutputRecord> {
    return this.records;
  }

  async write(data: Uint8Array | string, _inputId: string): Promise<unknown> {
    const text = typeof data === "string" ? data : Buffer.from(data).toString("utf8");
    for (const line of text.split("\n")) {
      if (line === "") continue;
      const f = JSON.parse(line) as Frame;
      this.written.push(f);
      queueMicrotask(() => this.onCommand(f));
    }
    return { applied: true };
  }

  async ack(cursor: number): Promise<void> {
    this.acks.push(cursor);
  }

  async closeInput(): Promise<void> {
    this.exit(0);
  }

  /** As SandboxStream.close: the output ends and `ended` rejects. */
  close(): void {
    this.closed = true;
    this.records.end();
    this.endReject(new Error("the stream was closed by this client"));
  }

  async delete(): Promise<void> {
    this.close();
  }

  /** One output record of Pi's stdout (or stderr). */
  emit(data: string | Uint8Array, stream: "stdout" | "stderr" = "stdout"): void {
    this.records.push({ seq: ++this.seq, stream, data: typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data) });
  }

  /** A frame as one line. */
  frame(f: unknown): void {
    this.emit(JSON.stringify(f) + "\n");
  }

  /** Pi's answer to f. */
  respond(f: Frame, extra: { success?: boolean; data?: unknown; error?: string } = {}): void {
    this.frame({ type: "response", id: f.id, command: f.type, success: extra.success ?? extra.error === undefined, ...extra });
  }

  exit(code: number): void {
    this.records.end();
    this.endResolve({ sandbox: this.sandbox, exitCode: code, limit: undefined, reason: undefined, packets: {}, routes: {} });
  }
}

/** Resolves after pending microtasks and one macrotask turn (the session's pump has run). */
export function tick(ms = 0): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
