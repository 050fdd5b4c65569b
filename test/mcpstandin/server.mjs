// A stand-in of Paseo's agent MCP endpoint, built on the stack Paseo's
// daemon runs it on (express 4's express.json(), the MCP SDK's
// StreamableHTTPServerTransport and McpServer, zod schemas) and wired the
// way the daemon's bootstrap wires /mcp/agents, so the route proxy's tests
// see the daemon's own reading of what the proxy forwards: body-parser's
// charset and BOM handling, JavaScript's last-of-duplicate-keys,
// case-sensitive keys, the SDK's message schemas.
//
// Nothing here runs anything: each tool handler records {tool, arguments,
// callerAgentId} and answers. The runs are read on a second listener, on
// loopback only and never behind the proxy: GET /runs, POST /reset.
//
// Environment: PASEO_STANDIN_TOKEN, the bearer the endpoint accepts.
// Prints one line on stdout once both listeners are up:
// {"mcp":<port>,"control":<port>}. Exits when stdin closes.

import { randomUUID } from "node:crypto";
import http from "node:http";
import express from "express";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const token = process.env.PASEO_STANDIN_TOKEN;
if (!token) {
  process.stderr.write("mcpstandin: PASEO_STANDIN_TOKEN is not set\n");
  process.exit(2);
}

const runs = [];
const rpcError = (code, message) => ({ jsonrpc: "2.0", error: { code, message }, id: null });

// A part of Paseo's catalog, with input schemas of the same shape (required
// fields, trims and bounds where Paseo has them), so a call that reaches a
// handler is one the daemon would run. The reference route's scope holds
// the first four.
const agentId = z.string();
const statuses = z.enum(["initializing", "idle", "running", "error", "closed"]);
const catalog = {
  list_agents: {
    includeArchived: z.boolean().optional().default(false),
    cwd: z.string().optional(),
    sinceHours: z.number().int().positive().max(720).optional().default(48),
    statuses: z.array(statuses).optional(),
    limit: z.number().int().positive().max(200).optional().default(50),
  },
  get_agent_status: { agentId },
  get_agent_activity: { agentId, limit: z.number().optional() },
  wait_for_agent: { agentId },
  create_agent: {
    cwd: z.string().optional(),
    title: z.string().trim().min(1).max(60),
    provider: z.string().min(1),
    thinking: z.string().optional(),
    labels: z.record(z.string(), z.string()).optional(),
    initialPrompt: z.string().trim().min(1),
    background: z.boolean().optional().default(false),
    notifyOnFinish: z.boolean().optional().default(false),
  },
  send_agent_prompt: {
    agentId,
    prompt: z.string(),
    sessionMode: z.string().optional(),
    background: z.boolean().optional().default(false),
  },
  cancel_agent: { agentId },
  archive_agent: { agentId },
  kill_agent: { agentId },
  update_agent: { agentId, name: z.string().optional(), labels: z.record(z.string(), z.string()).optional() },
  list_terminals: { cwd: z.string().optional(), all: z.boolean().optional() },
  create_terminal: { cwd: z.string().optional(), name: z.string().optional() },
  kill_terminal: { terminalId: z.string() },
  capture_terminal: { terminalId: z.string(), start: z.number().optional(), end: z.number().optional() },
  send_terminal_keys: { terminalId: z.string(), keys: z.string(), literal: z.boolean().optional() },
  list_providers: {},
  create_worktree: { cwd: z.string().optional(), branchName: z.string().min(1), baseBranch: z.string().optional() },
  set_agent_mode: { agentId, modeId: z.string() },
  respond_to_permission: { agentId, requestId: z.string(), behavior: z.enum(["allow", "deny"]) },
};

// One McpServer per session, as the daemon creates one per transport.
function agentServer(callerAgentId) {
  const server = new McpServer({ name: "paseo-agent-mcp-standin", version: "1.0.0" });
  for (const [name, inputSchema] of Object.entries(catalog)) {
    server.registerTool(name, { title: name, description: `stand-in of Paseo's ${name}`, inputSchema }, async (args) => {
      runs.push({ tool: name, arguments: args, callerAgentId: callerAgentId ?? null });
      return { content: [{ type: "text", text: `stand-in ran ${name}` }] };
    });
  }
  return server;
}

// The bearer check of Paseo's daemon (auth.ts): the scheme and exactly one
// token after it, compared whole.
function bearer(req, res, next) {
  const [scheme, ...rest] = (req.header("authorization") ?? "").trim().split(/\s+/);
  if (scheme !== "Bearer" || rest.length !== 1 || rest[0] !== token) {
    res.status(401).json({ error: "unauthorized" });
    return;
  }
  next();
}

const transports = new Map();
const app = express();
app.use(bearer);
app.use(express.json());

async function handle(req, res) {
  try {
    const sessionId = req.header("mcp-session-id");
    let transport = sessionId ? transports.get(sessionId) : undefined;
    if (!transport) {
      if (req.method !== "POST") {
        res.status(400).json(rpcError(-32000, "Missing or invalid MCP session"));
        return;
      }
      if (!isInitializeRequest(req.body)) {
        res.status(400).json(rpcError(-32000, "Initialization request expected"));
        return;
      }
      const raw = req.query.callerAgentId;
      const callerAgentId = typeof raw === "string" ? raw : Array.isArray(raw) && typeof raw[0] === "string" ? raw[0] : undefined;
      const t = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => transports.set(id, t),
        onsessionclosed: (id) => transports.delete(id),
        enableDnsRebindingProtection: false,
      });
      t.onclose = () => {
        if (t.sessionId) transports.delete(t.sessionId);
      };
      await agentServer(callerAgentId).connect(t);
      transport = t;
    }
    await transport.handleRequest(req, res, req.body);
  } catch (err) {
    process.stderr.write(`mcpstandin: ${err?.stack ?? err}\n`);
    if (!res.headersSent) res.status(500).json(rpcError(-32603, "Internal MCP server error"));
  }
}
for (const m of ["post", "get", "delete"]) app[m]("/mcp/agents", (req, res) => void handle(req, res));

const control = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/runs") {
    res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(runs));
  } else if (req.method === "POST" && req.url === "/reset") {
    runs.length = 0;
    res.writeHead(204).end();
  } else {
    res.writeHead(404).end();
  }
});

const listen = (server) => new Promise((resolve, reject) => {
  server.once("error", reject);
  server.listen(0, "127.0.0.1", () => resolve(server.address().port));
});
const mcpPort = await listen(http.createServer(app));
const controlPort = await listen(control);
process.stdout.write(JSON.stringify({ mcp: mcpPort, control: controlPort }) + "\n");
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
