export * from "./errors.js";
export * from "./protocol.js";
export { SupervisorConnection, MAX_WRITE_BYTES, type CallOptions, type ConnectOptions } from "./connection.js";
export { SandboxStream, createAndAttach, type OutputRecord, type ReconnectOptions, type StreamOptions } from "./sandbox.js";
export { LineSplitter, LineTooLongError, DEFAULT_MAX_LINE_BYTES } from "./lines.js";
export {
  THINKING_LEVELS,
  MAX_SESSION_FILE_LENGTH,
  MAX_SESSION_ID_LENGTH,
  PiDataError,
  checkSessionFile,
  checkSessionId,
  isThinkingLevel,
  parseState,
  type PiDataCode,
  type PiModelRef,
  type PiState,
  type ThinkingLevel,
} from "./pistate.js";
export {
  PiSession,
  PiError,
  PiSessionEndedError,
  PiTimeoutError,
  MAX_ERROR_LENGTH,
  assistantText,
  type ClearedQueue,
  type PiCommand,
  type PiEntry,
  type PiEvent,
  type PiFrameStats,
  type PiImage,
  type PiOptions,
  type PiResponse,
  type PiSessionOptions,
  type PiTransport,
  type TurnResult,
} from "./pi.js";
