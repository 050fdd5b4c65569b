export * from "./types.js";
export { PiToPaseo, toolDetail, toUsage, resultText } from "./mapping.js";
export { SandboxedPiAgentClient, SandboxedPiAgentSession, SANDBOXED_PI_CAPABILITIES, toPiPrompt, type SandboxedPiOptions } from "./provider.js";
