export * from "./errors.js";
export * from "./protocol.js";
export { SupervisorConnection, MAX_WRITE_BYTES, type ConnectOptions } from "./connection.js";
export { SandboxStream, createAndAttach, type OutputRecord, type ReconnectOptions, type StreamOptions } from "./sandbox.js";
export { PiSession, PiError, assistantText, type PiCommand, type PiEvent, type PiResponse, type PiSessionOptions, type TurnResult } from "./pi.js";
