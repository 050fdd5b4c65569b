// LF framing of a byte stream, as Pi frames its RPC (split on "\n" only; a trailing "\r"
// dropped). It works on bytes: a UTF-8 sequence split across chunks is whole by the time
// its line is decoded, since 0x0A never occurs inside one. Each byte is scanned once and a
// line's bytes are copied once (Buffer.concat at its end), so assembly is linear in the
// line's size however it was chunked; a line longer than the limit is an error.

import { TextDecoder } from "node:util";

/** The largest line a session takes by default (a get_messages of a long session). */
export const DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024;

export class LineTooLongError extends Error {
  override readonly name = "LineTooLongError";
  readonly code = "line-too-long";
  constructor(readonly limit: number) {
    super(`a line of more than ${limit} bytes`);
  }
}

export class LineSplitter {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  // fatal: false: a stray invalid byte becomes U+FFFD; the JSON parse decides what it is.
  private readonly decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  constructor(readonly maxLineBytes: number = DEFAULT_MAX_LINE_BYTES) {}

  /** Bytes of the unfinished line held. */
  get buffered(): number {
    return this.pendingBytes;
  }

  /**
   * The lines chunk completes, decoded, in order. Throws LineTooLongError once the line
   * under way exceeds the limit (the splitter is then unusable).
   */
  push(chunk: Uint8Array): string[] {
    const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const lines: string[] = [];
    let start = 0;
    for (;;) {
      const i = buf.indexOf(0x0a, start);
      if (i < 0) break;
      if (this.pendingBytes + (i - start) > this.maxLineBytes) throw new LineTooLongError(this.maxLineBytes);
      let line: Buffer;
      if (this.pendingBytes === 0) {
        line = buf.subarray(start, i);
      } else {
        this.pending.push(buf.subarray(start, i));
        line = Buffer.concat(this.pending, this.pendingBytes + (i - start));
        this.pending = [];
        this.pendingBytes = 0;
      }
      lines.push(this.decode(line));
      start = i + 1;
    }
    if (start < buf.length) {
      const rest = buf.length - start;
      if (this.pendingBytes + rest > this.maxLineBytes) throw new LineTooLongError(this.maxLineBytes);
      // Keep a copy: the caller may reuse its buffer.
      this.pending.push(Buffer.from(buf.subarray(start)));
      this.pendingBytes += rest;
    }
    return lines;
  }

  private decode(line: Buffer): string {
    const end = line.length > 0 && line[line.length - 1] === 0x0d ? line.length - 1 : line.length;
    return this.decoder.decode(line.subarray(0, end));
  }
}
