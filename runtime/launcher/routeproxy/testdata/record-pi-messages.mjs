// Records the request bodies Pi's own pi-messages client sends
// (node record-pi-messages.mjs <pi-ai dist> <out dir>): pi-ai's stream() against a
// local stand-in answering in pi-messages SSE (serialized assistant-message
// events and a terminal done); a first turn (tools, image, reasoning) and a
// second with thinking, a tool call and its result replayed, a third with
// temperature and tool choice.
import http from "node:http";
import fs from "node:fs";
const dist = process.argv[2], outDir = process.argv[3];
const { stream } = await import(dist + "/api/pi-messages.js");
let T = null; try { T = await import(dist + "/utils/transcript.js"); } catch {}
const reqs = [];
const usage = { input: 1, output: 1, cacheRead: 0, cacheWrite: 0, totalTokens: 2, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };
const srv = http.createServer((req, res) => { let b = ""; req.on("data", d => b += d); req.on("end", () => {
  reqs.push({ url: req.url, h: req.headers, body: b });
  res.writeHead(200, { "content-type": "text/event-stream" });
  for (const e of [{ type: "start" }, { type: "text_start", contentIndex: 0 }, { type: "text_delta", contentIndex: 0, delta: "hi" },
    { type: "text_end", contentIndex: 0, content: "hi" }, { type: "done", reason: "stop", usage, responseId: "r1" }])
    res.write(`data: ${JSON.stringify(e)}\n\n`);
  res.end(); }); });
await new Promise(r => srv.listen(0, "127.0.0.1", r));
const model = { id: "radius-large", name: "m", api: "pi-messages", provider: "radius", baseUrl: `http://127.0.0.1:${srv.address().port}/v1`, reasoning: true, input: ["text", "image"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 100000, maxTokens: 8000 };
const tools = [{ name: "read", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } }];
const img = { type: "image", data: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==", mimeType: "image/png" };
const mk = (messages) => { const c = { systemPrompt: "You are Pi, a coding agent.", messages, tools }; return T?.normalizeContext ? T.normalizeContext(c) : c; };
async function run(ctx, opts) { let last; for await (const e of stream(model, ctx, opts)) last = e; if (last.type !== "done") throw new Error(last.error?.errorMessage); return last.message; }
const msgs = [{ role: "user", content: [{ type: "text", text: "Read a.txt and describe the picture." }, img], timestamp: 1 }];
const a = await run(mk(msgs), { apiKey: "placeholder", reasoning: "high", maxTokens: 16000, sessionId: "pi-session-id", cacheRetention: "long" });
msgs.push({ ...a, content: [{ type: "thinking", thinking: "I will read it.", thinkingSignature: "sig1" }, { type: "text", text: "Let me read it." }, { type: "toolCall", id: "abcDEF123", name: "read", arguments: { path: "a.txt" } }], stopReason: "toolUse" });
msgs.push({ role: "toolResult", toolCallId: "abcDEF123", toolName: "read", content: [{ type: "text", text: "hello" }, img], isError: false, timestamp: 2 });
await run(mk(msgs), { apiKey: "placeholder", reasoning: "high", maxTokens: 16000, sessionId: "pi-session-id" });
msgs.push({ role: "toolResult", toolCallId: "abcDEF123", toolName: "read", content: [{ type: "text", text: "no such file" }], isError: true, timestamp: 3 });
msgs.push({ role: "user", content: "Thanks.", timestamp: 4 });
await run(mk(msgs), { apiKey: "placeholder", temperature: 0.2, toolChoice: "auto", sessionId: "pi-session-id" });
srv.close();
fs.mkdirSync(outDir, { recursive: true });
reqs.forEach((r, i) => fs.writeFileSync(`${outDir}/${model.id}.turn-${i + 1}.json`, JSON.stringify(JSON.parse(r.body), null, 1) + "\n"));
console.log(JSON.stringify(reqs.map(r => [r.method, r.url, r.h.authorization, r.h.accept])));
