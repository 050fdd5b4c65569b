// Records the request bodies Pi's own google-generative-ai client sends
// (node record-google.mjs <pi-ai dist> <out dir>): pi-ai's stream() against a
// local stand-in answering in Google's SSE; two models (a thinking budget, a
// thinking level), tool calls, an image, an error result, a follow-up prompt.
import http from "node:http";
import fs from "node:fs";
const dist = process.argv[2], outDir = process.argv[3];
const { stream } = await import(dist + "/api/google-generative-ai.js");
let T = null;
try { T = await import(dist + "/utils/transcript.js"); } catch {}
const reqs = [];
const answers = [];
const srv = http.createServer((req, res) => {
  let b = ""; req.on("data", d => b += d); req.on("end", () => {
    reqs.push({ url: req.url, headers: req.headers, body: b });
    res.writeHead(200, { "content-type": "text/event-stream" });
    const a = answers.shift();
    for (const c of a) res.write("data: " + JSON.stringify(c) + "\r\n\r\n");
    res.end();
  });
});
await new Promise(r => srv.listen(0, "127.0.0.1", r));
const base = `http://127.0.0.1:${srv.address().port}/v1beta`;
const usage = { promptTokenCount: 5, candidatesTokenCount: 3, totalTokenCount: 8 };
const call = (name, args, sig) => ({ candidates: [{ content: { role: "model", parts: [{ text: "Let me look.", thought: true, thoughtSignature: "c2lnLXRoaW5r" }, { functionCall: { name, args }, ...(sig && { thoughtSignature: sig }) }] }, finishReason: "STOP" }], usageMetadata: usage, responseId: "resp-1" });
const text = (t) => ({ candidates: [{ content: { role: "model", parts: [{ text: t }] }, finishReason: "STOP" }], usageMetadata: usage });
const tools = [
  { name: "read", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" }, mode: { const: "utf8" } }, required: ["path"] } },
  { name: "bash", description: "Run a command", parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] } },
];
const img = { type: "image", data: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==", mimeType: "image/png" };
function mkctx(messages) {
  const c = { systemPrompt: "You are Pi, a coding agent.", messages, tools };
  return T?.normalizeContext ? T.normalizeContext(c) : c;
}
async function run(model, ctx, opts) { const s = stream(model, ctx, opts); let last; for await (const e of s) last = e; if (last.type !== "done") throw new Error(last.error?.errorMessage); return last.message; }
const cost = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 };
for (const id of ["gemini-2.5-flash", "gemini-3-pro-preview"]) {
  const model = { id, name: id, api: "google-generative-ai", provider: "google", baseUrl: base, reasoning: true, input: ["text", "image"], cost, contextWindow: 1000000, maxTokens: 65536 };
  const msgs = [{ role: "user", content: [{ type: "text", text: "Read a.txt and describe the picture." }, img], timestamp: 1 }];
  answers.push([call("read", { path: "a.txt" }, "c2lnLWNhbGw=")]);
  const thinking = id.startsWith("gemini-3") ? { enabled: true, level: "high" } : { enabled: true, budgetTokens: 8192 };
  msgs.push(await run(model, mkctx(msgs), { apiKey: "placeholder", thinking, maxTokens: 16000 }));
  const tc = msgs.at(-1).content.find(b => b.type === "toolCall");
  msgs.push({ role: "toolResult", toolCallId: tc.id, toolName: tc.name, content: [{ type: "text", text: "hello" }, img], isError: false, timestamp: 2 });
  answers.push([call("bash", { command: "false" })]);
  msgs.push(await run(model, mkctx(msgs), { apiKey: "placeholder", thinking, maxTokens: 16000 }));
  const tc2 = msgs.at(-1).content.find(b => b.type === "toolCall");
  msgs.push({ role: "toolResult", toolCallId: tc2.id, toolName: tc2.name, content: [{ type: "text", text: "exit 1" }], isError: true, timestamp: 3 });
  answers.push([text("Done: a.txt says hello."), text("")].slice(0, 1));
  msgs.push(await run(model, mkctx(msgs), { apiKey: "placeholder", thinking: { enabled: false }, temperature: 0.3 }));
  msgs.push({ role: "user", content: "Thanks.", timestamp: 4 });
  answers.push([text("You're welcome.")]);
  await run(model, mkctx(msgs), { apiKey: "placeholder" });
}
srv.close();
fs.mkdirSync(outDir, { recursive: true });
reqs.forEach((r, i) => fs.writeFileSync(`${outDir}/turn-${i + 1}.json`, JSON.stringify(JSON.parse(r.body), null, 1) + "\n"));
console.log(JSON.stringify(reqs.map(r => [r.url, r.headers["x-goog-api-key"], r.headers["x-goog-api-client"]])));
