// Records the request bodies Pi's own azure-openai-responses client sends
// (node record-azure.mjs <pi-ai dist> <out dir>): pi-ai's stream() against a
// local stand-in answering in Responses SSE; a first turn (tools, image,
// reasoning) and a second with a tool call and its result replayed.
import http from "node:http";
import fs from "node:fs";
const dist = process.argv[2], outDir = process.argv[3];
const { stream } = await import(dist + "/api/azure-openai-responses.js");
let T = null; try { T = await import(dist + "/utils/transcript.js"); } catch {}
const reqs = [];
const srv = http.createServer((req, res) => { let b = ""; req.on("data", d => b += d); req.on("end", () => {
  reqs.push({ url: req.url, key: req.headers["api-key"], body: b });
  res.writeHead(200, { "content-type": "text/event-stream" });
  const ev = (o) => res.write(`event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`);
  ev({ type: "response.created", response: { id: "r1", status: "in_progress", output: [] } });
  ev({ type: "response.output_item.added", output_index: 0, item: { type: "message", id: "m1", role: "assistant", content: [], status: "in_progress" } });
  ev({ type: "response.content_part.added", output_index: 0, content_index: 0, item_id: "m1", part: { type: "output_text", text: "" } });
  ev({ type: "response.output_text.delta", output_index: 0, content_index: 0, item_id: "m1", delta: "hi" });
  ev({ type: "response.output_item.done", output_index: 0, item: { type: "message", id: "m1", role: "assistant", status: "completed", content: [{ type: "output_text", text: "hi", annotations: [] }] } });
  ev({ type: "response.completed", response: { id: "r1", status: "completed", output: [], usage: { input_tokens: 1, output_tokens: 1, total_tokens: 2, input_tokens_details: { cached_tokens: 0 } } } });
  res.end(); }); });
await new Promise(r => srv.listen(0, "127.0.0.1", r));
const model = { id: "gpt-5.4", name: "g", api: "azure-openai-responses", provider: "azure-openai-responses", baseUrl: `http://127.0.0.1:${srv.address().port}/openai/v1`, reasoning: true, input: ["text", "image"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 100000, maxTokens: 8000 };
const tools = [{ name: "read", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } }];
const img = { type: "image", data: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==", mimeType: "image/png" };
const mk = (messages) => { const c = { systemPrompt: "You are Pi, a coding agent.", messages, tools }; return T?.normalizeContext ? T.normalizeContext(c) : c; };
async function run(ctx, opts) { let last; for await (const e of stream(model, ctx, opts)) last = e; if (last.type !== "done") throw new Error(last.error?.errorMessage); return last.message; }
const msgs = [{ role: "user", content: [{ type: "text", text: "Read a.txt and describe the picture." }, img], timestamp: 1 }];
const a = await run(mk(msgs), { apiKey: "placeholder", reasoningEffort: "high", maxTokens: 16000, sessionId: "pi-session-id" });
msgs.push({ ...a, content: [{ type: "text", text: "Let me read it." }, { type: "toolCall", id: "call_1|fc_1", name: "read", arguments: { path: "a.txt" } }], stopReason: "toolUse" });
msgs.push({ role: "toolResult", toolCallId: "call_1|fc_1", toolName: "read", content: [{ type: "text", text: "hello" }, img], isError: false, timestamp: 2 });
await run(mk(msgs), { apiKey: "placeholder", reasoningEffort: "high", maxTokens: 16000, sessionId: "pi-session-id" });
msgs.push({ role: "user", content: "Thanks.", timestamp: 3 });
await run(mk(msgs), { apiKey: "placeholder", temperature: 0.2, sessionId: "pi-session-id" });
srv.close();
fs.mkdirSync(outDir, { recursive: true });
reqs.forEach((r, i) => fs.writeFileSync(`${outDir}/gpt-5.4.turn-${i + 1}.json`, JSON.stringify(JSON.parse(r.body), null, 1) + "\n"));
console.log(JSON.stringify(reqs.map(r => [r.url, r.key])));
