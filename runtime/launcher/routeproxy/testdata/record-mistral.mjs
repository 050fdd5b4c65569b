// Records the request bodies Pi's own mistral-conversations client sends
// (node record-mistral.mjs <pi-ai dist> <out dir>): pi-ai's stream() against a
// local stand-in answering in chat-completion SSE; a first turn (tools, image,
// reasoning effort) and a second with thinking, a tool call and its result replayed.
import http from "node:http";
import fs from "node:fs";
const dist = process.argv[2], outDir = process.argv[3];
const { stream } = await import(dist + "/api/mistral-conversations.js");
let T = null; try { T = await import(dist + "/utils/transcript.js"); } catch {}
const reqs = [];
const srv = http.createServer((req, res) => { let b = ""; req.on("data", d => b += d); req.on("end", () => {
  reqs.push({ url: req.url, h: req.headers, body: b });
  res.writeHead(200, { "content-type": "text/event-stream" });
  res.write(`data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", model: "m", created: 1, choices: [{ index: 0, delta: { role: "assistant", content: "hi" }, finish_reason: null }] })}\n\n`);
  res.write(`data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", model: "m", created: 1, choices: [{ index: 0, delta: { content: "" }, finish_reason: "stop" }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } })}\n\n`);
  res.write("data: [DONE]\n\n");
  res.end(); }); });
await new Promise(r => srv.listen(0, "127.0.0.1", r));
const model = { id: "mistral-medium-3.5", name: "m", api: "mistral-conversations", provider: "mistral", baseUrl: `http://127.0.0.1:${srv.address().port}`, reasoning: true, input: ["text", "image"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 100000, maxTokens: 8000 };
const tools = [{ name: "read", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } }];
const img = { type: "image", data: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==", mimeType: "image/png" };
const mk = (messages) => { const c = { systemPrompt: "You are Pi, a coding agent.", messages, tools }; return T?.normalizeContext ? T.normalizeContext(c) : c; };
async function run(ctx, opts) { let last; for await (const e of stream(model, ctx, opts)) last = e; if (last.type !== "done") throw new Error(last.error?.errorMessage); return last.message; }
const msgs = [{ role: "user", content: [{ type: "text", text: "Read a.txt and describe the picture." }, img], timestamp: 1 }];
const a = await run(mk(msgs), { apiKey: "placeholder", reasoningEffort: "high", maxTokens: 16000, sessionId: "pi-session-id" });
msgs.push({ ...a, content: [{ type: "thinking", thinking: "I will read it." }, { type: "text", text: "Let me read it." }, { type: "toolCall", id: "abcDEF123", name: "read", arguments: { path: "a.txt" } }], stopReason: "toolUse" });
msgs.push({ role: "toolResult", toolCallId: "abcDEF123", toolName: "read", content: [{ type: "text", text: "hello" }, img], isError: false, timestamp: 2 });
await run(mk(msgs), { apiKey: "placeholder", reasoningEffort: "high", maxTokens: 16000, sessionId: "pi-session-id" });
msgs.push({ role: "toolResult", toolCallId: "abcDEF123", toolName: "read", content: [{ type: "text", text: "no such file" }], isError: true, timestamp: 3 });
msgs.push({ role: "user", content: "Thanks.", timestamp: 4 });
await run(mk(msgs), { apiKey: "placeholder", temperature: 0.2, toolChoice: "auto", sessionId: "pi-session-id" });
srv.close();
fs.mkdirSync(outDir, { recursive: true });
reqs.forEach((r, i) => fs.writeFileSync(`${outDir}/${model.id}.turn-${i + 1}.json`, JSON.stringify(JSON.parse(r.body), null, 1) + "\n"));
console.log(JSON.stringify(reqs.map(r => [r.url, r.h.authorization, r.h["x-affinity"]])));
