// Pi's answers are untrusted data: any process in the sandbox can write to Pi's stdout, so
// what a daemon persists or hands on (the session id, the session file it will pass back
// as `--session`) is checked here, bounded and by shape, before anyone sees it.

/** Pi's thinking levels (Pi 0.84 and 1.x: up to `max`; a model supports a subset). */
export const THINKING_LEVELS = ["off", "minimal", "low", "medium", "high", "xhigh", "max"] as const;
export type ThinkingLevel = (typeof THINKING_LEVELS)[number];

export function isThinkingLevel(s: unknown): s is ThinkingLevel {
  return typeof s === "string" && (THINKING_LEVELS as readonly string[]).includes(s);
}

export const MAX_SESSION_ID_LENGTH = 128;
export const MAX_SESSION_FILE_LENGTH = 4096;

/** What in one of Pi's answers failed its check. Match `code`, never the message. */
export type PiDataCode = "invalid-session-id" | "invalid-session-file" | "invalid-state" | "invalid-response";

export class PiDataError extends Error {
  override readonly name = "PiDataError";
  constructor(
    readonly code: PiDataCode,
    /** The field, e.g. `sessionFile` (never its value: it is the sandbox's data). */
    readonly field: string,
    message: string,
  ) {
    super(`${field}: ${message}`);
  }
}

// Pi's session ids are UUIDs; this admits any short token of the same alphabet.
const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]*$/;

/** A session id: 1 to 128 characters of [A-Za-z0-9._:-], starting alphanumeric. */
export function checkSessionId(v: unknown): string {
  if (typeof v !== "string") throw new PiDataError("invalid-session-id", "sessionId", "not a string");
  if (v.length === 0 || v.length > MAX_SESSION_ID_LENGTH) {
    throw new PiDataError("invalid-session-id", "sessionId", `length ${v.length}, want 1 to ${MAX_SESSION_ID_LENGTH}`);
  }
  if (!SESSION_ID.test(v)) throw new PiDataError("invalid-session-id", "sessionId", "a character outside [A-Za-z0-9._:-]");
  return v;
}

/**
 * A session file: an absolute, clean path (no empty, `.` or `..` segment, no trailing
 * slash), at most 4096 UTF-8 bytes, with no NUL, no control character (C0, DEL, C1) and no
 * line or paragraph separator. It is where the sandbox's Pi says its log is: a path as
 * Pi sees it, which a daemon maps through its own facts, never opens as given.
 */
export function checkSessionFile(v: unknown): string {
  const bad = (why: string) => new PiDataError("invalid-session-file", "sessionFile", why);
  if (typeof v !== "string") throw bad("not a string");
  const bytes = Buffer.byteLength(v, "utf8");
  if (bytes === 0 || bytes > MAX_SESSION_FILE_LENGTH) throw bad(`${bytes} bytes, want 1 to ${MAX_SESSION_FILE_LENGTH}`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/.test(v)) throw bad("a NUL or control character");
  if (Buffer.from(v, "utf8").toString("utf8") !== v) throw bad("a lone surrogate");
  if (!v.startsWith("/")) throw bad("not absolute");
  if (v === "/") throw bad("the root");
  for (const seg of v.slice(1).split("/")) {
    if (seg === "" || seg === "." || seg === "..") throw bad("an empty, . or .. segment");
  }
  return v;
}

/** The model of a session, as get_state names it. */
export interface PiModelRef {
  provider: string;
  id: string;
}

/** Pi's get_state, checked: the fields a daemon acts on, each of its type. */
export interface PiState {
  sessionId: string;
  /** Absent when Pi runs without a session file (--no-session). */
  sessionFile: string | undefined;
  /** Absent when no model is selected (Pi 1.x omits it). */
  model: PiModelRef | undefined;
  thinkingLevel: ThinkingLevel | undefined;
  isStreaming: boolean;
  isCompacting: boolean;
  messageCount: number;
  pendingMessageCount: number;
}

const MAX_NAME = 256;

function shortString(v: unknown): v is string {
  return typeof v === "string" && v.length > 0 && v.length <= MAX_NAME && !/[\u0000-\u001f\u007f]/.test(v);
}

function count(v: unknown, field: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) throw new PiDataError("invalid-state", field, "not a count");
  return v;
}

/** get_state's data, checked; throws PiDataError naming the first field that fails. */
export function parseState(data: unknown): PiState {
  if (data === null || typeof data !== "object" || Array.isArray(data)) throw new PiDataError("invalid-state", "data", "not an object");
  const d = data as Record<string, unknown>;
  const flag = (field: string): boolean => {
    const v = d[field];
    if (v === undefined) return false;
    if (typeof v !== "boolean") throw new PiDataError("invalid-state", field, "not a boolean");
    return v;
  };
  let model: PiModelRef | undefined;
  if (d.model !== undefined && d.model !== null) {
    const m = d.model as Record<string, unknown>;
    if (typeof m !== "object" || !shortString(m.provider) || !shortString(m.id)) throw new PiDataError("invalid-state", "model", "not a provider and id");
    model = { provider: m.provider, id: m.id };
  }
  if (d.thinkingLevel !== undefined && !isThinkingLevel(d.thinkingLevel)) throw new PiDataError("invalid-state", "thinkingLevel", "not a thinking level");
  return {
    sessionId: checkSessionId(d.sessionId),
    sessionFile: d.sessionFile === undefined ? undefined : checkSessionFile(d.sessionFile),
    model,
    thinkingLevel: d.thinkingLevel as ThinkingLevel | undefined,
    isStreaming: flag("isStreaming"),
    isCompacting: flag("isCompacting"),
    messageCount: count(d.messageCount ?? 0, "messageCount"),
    pendingMessageCount: count(d.pendingMessageCount ?? 0, "pendingMessageCount"),
  };
}
