// The part of Paseo's provider interface this provider implements, written here as
// structural types (TypeScript matches by shape) so the package needs no Paseo code. The
// interface is Paseo's `agent/agent-sdk-types.ts` (getpaseo/paseo, packages/server/src/server/)
// as of commit PASEO_COMMIT; only the members a provider implements or emits are declared,
// narrowed to what a sandboxed Pi produces. Paseo itself is AGPL-3.0 and not vendored.

/** The upstream commit these shapes were read from. */
export const PASEO_COMMIT = "f3de568969b27f7b0702d96f458c41a28a7dd2f5";

export type AgentProvider = string;
export type AgentMetadata = Record<string, unknown>;

export interface AgentCapabilityFlags {
  supportsStreaming: boolean;
  supportsSessionPersistence: boolean;
  supportsDynamicModes: boolean;
  supportsMcpServers: boolean;
  supportsReasoningStream: boolean;
  supportsToolInvocations: boolean;
}

export interface AgentMode {
  id: string;
  label: string;
  description?: string;
}

export interface AgentSelectOption {
  id: string;
  label: string;
  description?: string;
  isDefault?: boolean;
}

export interface AgentModelDefinition {
  provider: AgentProvider;
  id: string;
  label: string;
  description?: string;
  isDefault?: boolean;
  metadata?: AgentMetadata;
  thinkingOptions?: AgentSelectOption[];
  defaultThinkingOptionId?: string;
}

export interface AgentPersistenceHandle {
  provider: AgentProvider;
  sessionId: string;
  nativeHandle?: string;
  metadata?: AgentMetadata;
}

export type AgentPromptContentBlock = { type: "text"; text: string } | { type: "image"; data: string; mimeType: string } | { type: string; [k: string]: unknown };
export type AgentPromptInput = string | AgentPromptContentBlock[];

export interface AgentRunOptions {
  outputSchema?: unknown;
  resumeFrom?: AgentPersistenceHandle;
  maxThinkingTokens?: number;
}

export interface AgentUsage {
  inputTokens?: number;
  cachedInputTokens?: number;
  outputTokens?: number;
  totalCostUsd?: number;
  contextWindowMaxTokens?: number;
  contextWindowUsedTokens?: number;
}

export type ToolCallDetail =
  | { type: "shell"; command: string; cwd?: string; output?: string; exitCode?: number | null }
  | { type: "read"; filePath: string; content?: string; offset?: number; limit?: number }
  | { type: "edit"; filePath: string; oldString?: string; newString?: string; unifiedDiff?: string }
  | { type: "write"; filePath: string; content?: string }
  | { type: "search"; query: string; toolName?: "search" | "grep" | "glob" | "web_search"; content?: string }
  | { type: "unknown"; input: unknown | null; output: unknown | null };

export interface ToolCallTimelineItem {
  [key: string]: unknown;
  type: "tool_call";
  callId: string;
  name: string;
  detail: ToolCallDetail;
  status: "running" | "completed" | "failed" | "canceled";
  error: unknown;
}

export type AgentTimelineItem =
  | { type: "user_message"; text: string; messageId?: string }
  | { type: "assistant_message"; text: string }
  | { type: "reasoning"; text: string }
  | ToolCallTimelineItem
  | { type: "error"; message: string }
  | { [key: string]: unknown; type: "compaction"; status: "loading" | "completed"; trigger?: "auto" | "manual" };

export interface AgentRuntimeInfo {
  provider: AgentProvider;
  sessionId: string | null;
  model?: string | null;
  thinkingOptionId?: string | null;
  modeId?: string | null;
  extra?: AgentMetadata;
}

export type AgentStreamEvent =
  | { type: "thread_started"; sessionId: string; provider: AgentProvider }
  | { type: "turn_started"; provider: AgentProvider; turnId?: string }
  | { type: "turn_completed"; provider: AgentProvider; usage?: AgentUsage; turnId?: string }
  | { type: "usage_updated"; provider: AgentProvider; usage: AgentUsage; turnId?: string }
  | { type: "turn_failed"; provider: AgentProvider; error: string; code?: string; diagnostic?: string; turnId?: string }
  | { type: "turn_canceled"; provider: AgentProvider; reason: string; turnId?: string }
  | { type: "timeline"; item: AgentTimelineItem; provider: AgentProvider; turnId?: string };

export interface AgentRunResult {
  sessionId: string;
  finalText: string;
  usage?: AgentUsage;
  timeline: AgentTimelineItem[];
  canceled?: boolean;
}

export interface AgentSlashCommand {
  name: string;
  description: string;
  argumentHint: string;
}

/** What a session is created from (the members this provider reads). */
export interface AgentSessionConfig {
  provider: AgentProvider;
  cwd: string;
  systemPrompt?: string;
  model?: string;
  thinkingOptionId?: string;
  title?: string | null;
  [key: string]: unknown;
}

export interface AgentLaunchContext {
  env?: Record<string, string>;
}

/** Pi asks for no permissions: these are never produced, only typed for the interface. */
export interface AgentPermissionRequest {
  id: string;
  provider: AgentProvider;
  name: string;
  kind: string;
}
export type AgentPermissionResponse = { behavior: "allow" | "deny"; [key: string]: unknown };

export interface AgentSession {
  readonly provider: AgentProvider;
  readonly id: string | null;
  readonly capabilities: AgentCapabilityFlags;
  run(prompt: AgentPromptInput, options?: AgentRunOptions): Promise<AgentRunResult>;
  startTurn(prompt: AgentPromptInput, options?: AgentRunOptions): Promise<{ turnId: string }>;
  subscribe(callback: (event: AgentStreamEvent) => void): () => void;
  streamHistory(): AsyncGenerator<AgentStreamEvent>;
  getRuntimeInfo(): Promise<AgentRuntimeInfo>;
  getAvailableModes(): Promise<AgentMode[]>;
  getCurrentMode(): Promise<string | null>;
  setMode(modeId: string): Promise<void>;
  getPendingPermissions(): AgentPermissionRequest[];
  respondToPermission(requestId: string, response: AgentPermissionResponse): Promise<void>;
  describePersistence(): AgentPersistenceHandle | null;
  interrupt(): Promise<void>;
  close(): Promise<void>;
  listCommands?(): Promise<AgentSlashCommand[]>;
  setModel?(modelId: string | null): Promise<void>;
  setThinkingOption?(thinkingOptionId: string | null): Promise<void>;
}

export interface AgentClient {
  readonly provider: AgentProvider;
  readonly capabilities: AgentCapabilityFlags;
  createSession(config: AgentSessionConfig, launchContext?: AgentLaunchContext): Promise<AgentSession>;
  resumeSession(handle: AgentPersistenceHandle, overrides?: Partial<AgentSessionConfig>, launchContext?: AgentLaunchContext): Promise<AgentSession>;
  listModels(options: { cwd: string; force: boolean }): Promise<AgentModelDefinition[]>;
  isAvailable(): Promise<boolean>;
  getDiagnostic?(): Promise<{ diagnostic: string }>;
}
