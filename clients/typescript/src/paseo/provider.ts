// A Paseo provider that runs Pi sandboxed: an AgentClient/AgentSession (types.ts) over a
// PiSession, so Paseo's agent manager drives a Pi in gVisor under the compiled policy
// instead of Pi in its own process. The daemon keeps what it alone knows: the trusted
// facts of each launch (its `facts` callback) and its MCP token.

import { randomUUID } from "node:crypto";

import { ConnectionError, SupervisorError } from "../errors.js";
import { SupervisorConnection } from "../connection.js";
import { PiSession, type PiEvent } from "../pi.js";
import type { SandboxExit } from "../protocol.js";
import { PiToPaseo, toolDetail } from "./mapping.js";
import type {
  AgentCapabilityFlags,
  AgentClient,
  AgentLaunchContext,
  AgentMode,
  AgentModelDefinition,
  AgentPermissionRequest,
  AgentPersistenceHandle,
  AgentPromptInput,
  AgentRunResult,
  AgentRuntimeInfo,
  AgentSession,
  AgentSessionConfig,
  AgentSlashCommand,
  AgentStreamEvent,
  AgentTimelineItem,
  AgentUsage,
} from "./types.js";

export const SANDBOXED_PI_CAPABILITIES: AgentCapabilityFlags = {
  supportsStreaming: true,
  supportsSessionPersistence: true,
  supportsDynamicModes: false,
  // MCP reaches the sandbox only through the compiled private route (facts.mcp), never
  // from a session's config.
  supportsMcpServers: false,
  supportsReasoningStream: true,
  supportsToolInvocations: true,
};

export interface SandboxedPiOptions {
  /** The supervisor's socket (docs/supervisor.md), e.g. /run/paseo-sandbox/supervisor.sock. */
  socketPath: string;
  /** The registry's deployment this daemon is bound to. */
  deployment: string;
  /**
   * The trusted facts for a session (docs/facts.md): the daemon's own knowledge of the cwd,
   * its state dirs, the model and MCP route. On a resume whose sandbox is gone, `resume`
   * names Pi's session log: set `launch.session` to it.
   */
  facts(config: AgentSessionConfig, resume?: { sessionFile: string }): unknown | Promise<unknown>;
  /** This daemon run's MCP bearer (handed to the sandbox's route proxy on create and attach). */
  mcpToken?: string;
  /** The models to offer (the registry's model endpoint decides what is reachable). */
  models?: AgentModelDefinition[];
  /** The provider id Paseo registers (default "pi-sandboxed"). */
  provider?: string;
  /** close(): "delete" (default) ends the sandbox; "detach" leaves it for a later resume. */
  onClose?: "delete" | "detach";
}

interface PiState {
  sessionId?: string;
  sessionFile?: string;
  thinkingLevel?: string;
  model?: { provider?: string; id?: string } | null;
}

export class SandboxedPiAgentClient implements AgentClient {
  readonly provider: string;
  readonly capabilities = SANDBOXED_PI_CAPABILITIES;
  private readonly opts: SandboxedPiOptions;

  constructor(opts: SandboxedPiOptions) {
    this.opts = opts;
    this.provider = opts.provider ?? "pi-sandboxed";
  }

  async createSession(config: AgentSessionConfig, _launch?: AgentLaunchContext): Promise<SandboxedPiAgentSession> {
    const facts = await this.opts.facts(config);
    const { session } = await PiSession.create({ socketPath: this.opts.socketPath, deployment: this.opts.deployment, facts, mcpToken: this.opts.mcpToken });
    return SandboxedPiAgentSession.start(this.provider, session, config, this.opts);
  }

  /**
   * Reattaches to the handle's sandbox from its cursor (a daemon restart: the rest of a turn
   * under way arrives as events); when the sandbox is gone, starts a new one that resumes
   * Pi's session log (`facts(config, {sessionFile})`).
   */
  async resumeSession(handle: AgentPersistenceHandle, overrides?: Partial<AgentSessionConfig>, _launch?: AgentLaunchContext): Promise<SandboxedPiAgentSession> {
    const config: AgentSessionConfig = { provider: this.provider, cwd: "", ...overrides };
    const sandbox = typeof handle.metadata?.sandbox === "string" ? handle.metadata.sandbox : undefined;
    const cursor = typeof handle.metadata?.cursor === "number" ? handle.metadata.cursor : 0;
    if (sandbox) {
      try {
        const session = await PiSession.open({ socketPath: this.opts.socketPath, sandbox, cursor, mcpToken: this.opts.mcpToken });
        return await SandboxedPiAgentSession.start(this.provider, session, config, this.opts);
      } catch (e) {
        if (!(e instanceof SupervisorError && (e.code === "not-found" || e.code === "state"))) throw e;
      }
    }
    if (!handle.nativeHandle) throw new Error(`cannot resume ${handle.sessionId}: its sandbox is gone and no session log is known`);
    const facts = await this.opts.facts(config, { sessionFile: handle.nativeHandle });
    const { session } = await PiSession.create({ socketPath: this.opts.socketPath, deployment: this.opts.deployment, facts, mcpToken: this.opts.mcpToken });
    return SandboxedPiAgentSession.start(this.provider, session, config, this.opts);
  }

  async listModels(_o: { cwd: string; force: boolean }): Promise<AgentModelDefinition[]> {
    return this.opts.models ?? [];
  }

  /** Whether the supervisor answers on its socket (for this peer). */
  async isAvailable(): Promise<boolean> {
    try {
      const c = await SupervisorConnection.connect(this.opts.socketPath, { timeoutMs: 2000 });
      try {
        await c.list();
        return true;
      } finally {
        c.close();
      }
    } catch (e) {
      if (e instanceof ConnectionError || e instanceof SupervisorError) return false;
      throw e;
    }
  }

  async getDiagnostic(): Promise<{ diagnostic: string }> {
    return { diagnostic: (await this.isAvailable()) ? `supervisor at ${this.opts.socketPath} answers` : `no supervisor answers at ${this.opts.socketPath}` };
  }
}

export class SandboxedPiAgentSession implements AgentSession {
  readonly provider: string;
  readonly capabilities = SANDBOXED_PI_CAPABILITIES;
  readonly pi: PiSession;
  private readonly opts: SandboxedPiOptions;
  private readonly config: AgentSessionConfig;
  private readonly mapper: PiToPaseo;
  private readonly subscribers = new Set<(e: AgentStreamEvent) => void>();
  private state: PiState;
  private closed = false;

  private constructor(provider: string, pi: PiSession, config: AgentSessionConfig, opts: SandboxedPiOptions, state: PiState) {
    this.provider = provider;
    this.pi = pi;
    this.config = config;
    this.opts = opts;
    this.state = state;
    this.mapper = new PiToPaseo(provider, () => this.state.sessionId ?? "");
    void this.pump();
  }

  static async start(provider: string, pi: PiSession, config: AgentSessionConfig, opts: SandboxedPiOptions): Promise<SandboxedPiAgentSession> {
    // Subscribe first: a reattach's replay reaches the mapper (get_state's answer is no event).
    const s = new SandboxedPiAgentSession(provider, pi, config, opts, {});
    s.state = await pi.getState<PiState>();
    if (config.model) await s.setModel(config.model);
    if (config.thinkingOptionId) await s.setThinkingOption(config.thinkingOptionId);
    return s;
  }

  get id(): string | null {
    return this.state.sessionId ?? null;
  }

  /** The sandbox the session runs in. */
  get sandbox(): string {
    return this.pi.sandbox;
  }

  subscribe(callback: (event: AgentStreamEvent) => void): () => void {
    this.subscribers.add(callback);
    return () => this.subscribers.delete(callback);
  }

  private emit(events: AgentStreamEvent[]): void {
    for (const e of events) for (const s of this.subscribers) s(e);
  }

  private async pump(): Promise<void> {
    try {
      for await (const e of this.pi.events()) this.emit(this.mapper.map(e));
    } catch {
      // The stream failed (superseded, gave up reconnecting): a turn under way fails below.
    }
    // A turn under way when the output ended fails, saying why: Pi's exit, a limit, or a
    // stream this client lost.
    let exit: SandboxExit | undefined;
    try {
      exit = await this.pi.exit;
    } catch {
      exit = undefined;
    }
    if (!exit) {
      this.emit(this.mapper.fail("the sandbox's stream ended", "sandbox-stream-ended"));
      return;
    }
    const why = exit.limit ? `the sandbox was ended at its ${exit.limit} limit` : `Pi exited (code ${exit.exitCode ?? "unknown"})`;
    this.emit(this.mapper.fail(why, exit.limit ?? "sandbox-exited"));
  }

  async startTurn(prompt: AgentPromptInput, _options?: unknown): Promise<{ turnId: string }> {
    if (this.mapper.activeTurn !== undefined) throw new Error("a turn is already running");
    const turnId = randomUUID();
    this.mapper.begin(turnId);
    const { message, images } = toPiPrompt(prompt);
    const r = await this.pi.command({ type: "prompt", message, ...(images.length > 0 ? { images } : {}) });
    if (!r.success) {
      this.emit(this.mapper.fail(r.error ?? "Pi refused the prompt", "prompt-refused"));
      throw new Error(`prompt: ${r.error ?? "refused"}`);
    }
    return { turnId };
  }

  async run(prompt: AgentPromptInput, options?: unknown): Promise<AgentRunResult> {
    const timeline: AgentTimelineItem[] = [];
    let turnId: string | undefined;
    const early: AgentStreamEvent[] = [];
    let settle!: (e: AgentStreamEvent) => void;
    const done = new Promise<AgentStreamEvent>((r) => (settle = r));
    const off = this.subscribe((e) => {
      if (turnId === undefined) {
        early.push(e);
        return;
      }
      take(e);
    });
    const take = (e: AgentStreamEvent) => {
      if ("turnId" in e && e.turnId !== turnId) return;
      if (e.type === "timeline") timeline.push(e.item);
      if (e.type === "turn_completed" || e.type === "turn_failed" || e.type === "turn_canceled") settle(e);
    };
    try {
      turnId = (await this.startTurn(prompt, options)).turnId;
      early.splice(0).forEach(take);
      const end = await done;
      if (end.type === "turn_failed") throw new Error(`turn failed: ${end.error}`);
      const usage: AgentUsage | undefined = end.type === "turn_completed" ? end.usage : undefined;
      return {
        sessionId: this.state.sessionId ?? "",
        finalText: timeline.map((i) => (i.type === "assistant_message" ? i.text : "")).join(""),
        timeline,
        ...(usage ? { usage } : {}),
        ...(end.type === "turn_canceled" ? { canceled: true } : {}),
      };
    } finally {
      off();
    }
  }

  /** The conversation so far, from Pi's messages, as timeline events. */
  async *streamHistory(): AsyncGenerator<AgentStreamEvent> {
    const { messages } = await this.pi.call<{ messages: Array<Record<string, unknown>> }>({ type: "get_messages" });
    const provider = this.provider;
    for (const m of messages) {
      const content = typeof m.content === "string" ? [{ type: "text", text: m.content }] : Array.isArray(m.content) ? (m.content as Array<Record<string, unknown>>) : [];
      if (m.role === "user") {
        const text = content.filter((c) => c.type === "text").map((c) => String(c.text)).join("\n\n");
        yield { type: "timeline", provider, item: { type: "user_message", text } };
      } else if (m.role === "assistant") {
        for (const c of content) {
          if (c.type === "text") yield { type: "timeline", provider, item: { type: "assistant_message", text: String(c.text) } };
          if (c.type === "thinking") yield { type: "timeline", provider, item: { type: "reasoning", text: String(c.thinking) } };
          if (c.type === "toolCall") {
            const name = String(c.name);
            yield { type: "timeline", provider, item: { type: "tool_call", callId: String(c.id), name, detail: toolDetail(name, c.arguments, null), status: "completed", error: null } };
          }
        }
      }
    }
  }

  async getRuntimeInfo(): Promise<AgentRuntimeInfo> {
    this.state = await this.pi.getState<PiState>();
    const m = this.state.model;
    return {
      provider: this.provider,
      sessionId: this.state.sessionId ?? null,
      model: m?.provider && m.id ? `${m.provider}/${m.id}` : null,
      thinkingOptionId: this.state.thinkingLevel ?? null,
      modeId: null,
      extra: { sandbox: this.pi.sandbox },
    };
  }

  // Pi has no modes and asks for no permissions: the sandbox is the control.
  async getAvailableModes(): Promise<AgentMode[]> {
    return [];
  }
  async getCurrentMode(): Promise<string | null> {
    return null;
  }
  async setMode(modeId: string): Promise<void> {
    throw new Error(`Pi has no modes (asked for ${modeId})`);
  }
  getPendingPermissions(): AgentPermissionRequest[] {
    return [];
  }
  async respondToPermission(requestId: string): Promise<void> {
    throw new Error(`no pending permission ${requestId}: Pi asks for none`);
  }

  /** The sandbox and the cursor to reattach from, and Pi's session log to resume from. */
  describePersistence(): AgentPersistenceHandle | null {
    if (!this.state.sessionId) return null;
    return {
      provider: this.provider,
      sessionId: this.state.sessionId,
      ...(this.state.sessionFile ? { nativeHandle: this.state.sessionFile } : {}),
      metadata: { sandbox: this.pi.sandbox, cursor: this.pi.lineCursor },
    };
  }

  async interrupt(): Promise<void> {
    await this.pi.abort();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if ((this.opts.onClose ?? "delete") === "detach") {
      this.pi.close();
      return;
    }
    await this.pi.delete();
  }

  async listCommands(): Promise<AgentSlashCommand[]> {
    const { commands } = await this.pi.call<{ commands: Array<{ name: string; description?: string }> }>({ type: "get_commands" });
    return commands.map((c) => ({ name: c.name, description: c.description ?? "", argumentHint: "" }));
  }

  /** "provider/id" (Pi's own form). */
  async setModel(modelId: string | null): Promise<void> {
    if (!modelId) return;
    const i = modelId.indexOf("/");
    if (i <= 0) throw new Error(`model ${modelId}: want provider/id`);
    await this.pi.call({ type: "set_model", provider: modelId.slice(0, i), modelId: modelId.slice(i + 1) });
  }

  async setThinkingOption(thinkingOptionId: string | null): Promise<void> {
    if (!thinkingOptionId) return;
    await this.pi.call({ type: "set_thinking_level", level: thinkingOptionId });
  }
}

/** Paseo's prompt input as Pi's prompt: the text blocks joined, images as Pi's image content. */
export function toPiPrompt(prompt: AgentPromptInput): { message: string; images: Array<{ type: "image"; data: string; mimeType: string }> } {
  if (typeof prompt === "string") return { message: prompt, images: [] };
  const texts: string[] = [];
  const images: Array<{ type: "image"; data: string; mimeType: string }> = [];
  for (const b of prompt) {
    if (b.type === "text" && typeof b.text === "string") texts.push(b.text);
    else if (b.type === "image" && typeof b.data === "string" && typeof b.mimeType === "string") images.push({ type: "image", data: b.data, mimeType: b.mimeType });
  }
  return { message: texts.join("\n\n"), images };
}

export type { PiEvent };
