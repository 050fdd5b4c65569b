// An extension that reports whether the Pi packages it imports are the
// module instances the running Pi uses (TestPiExtensionSharesPiModules).
// Pi's loader resolves these specifiers for extensions; a second copy of
// any of them (say, the unbundled files beside the bundle) would give an
// extension classes that fail instanceof against Pi's objects and module
// state (registries, settings) that Pi never sees.
//
// Two kinds of evidence, written as JSON to MODULE_PROBE_OUT (default
// .module-probe.json in Pi's cwd) at session_start:
//   - links: instanceof and identity checks that tie each namespace to the
//     running Pi (its SessionManager and ModelRegistry objects) or to a
//     namespace already tied to it;
//   - scripts: for every function each namespace exports, the script V8
//     compiled it from (node:inspector's [[FunctionLocation]]); with a
//     bundled Pi every one must be the script Pi's SessionManager is from.
// A control: the package's unbundled index.js, imported by its path, must
// show up as a second copy, so the check can tell.
import * as fs from "node:fs";
import * as path from "node:path";
import { Session } from "node:inspector/promises";
import * as codingAgent from "@earendil-works/pi-coding-agent";
import * as agentCore from "@earendil-works/pi-agent-core";
import * as tui from "@earendil-works/pi-tui";
import * as ai from "@earendil-works/pi-ai";
import * as aiCompat from "@earendil-works/pi-ai/compat";
import * as aiOauth from "@earendil-works/pi-ai/oauth";
import * as aiProviders from "@earendil-works/pi-ai/providers/all";
import * as typebox from "typebox";
import * as typeboxCompile from "typebox/compile";
import * as typeboxValue from "typebox/value";
import * as legacyAi from "@mariozechner/pi-ai";
import * as legacyCodingAgent from "@mariozechner/pi-coding-agent";

const namespaces = {
	"@earendil-works/pi-coding-agent": codingAgent,
	"@earendil-works/pi-agent-core": agentCore,
	"@earendil-works/pi-tui": tui,
	"@earendil-works/pi-ai": ai,
	"@earendil-works/pi-ai/compat": aiCompat,
	"@earendil-works/pi-ai/oauth": aiOauth,
	"@earendil-works/pi-ai/providers/all": aiProviders,
	typebox: typebox,
	"typebox/compile": typeboxCompile,
	"typebox/value": typeboxValue,
	"@mariozechner/pi-ai": legacyAi,
	"@mariozechner/pi-coding-agent": legacyCodingAgent,
};

function functionsOf(ns) {
	const out = [];
	for (const k of Object.keys(ns)) {
		let v;
		try {
			v = ns[k];
		} catch {
			continue;
		}
		if (typeof v === "function") out.push([k, v]);
	}
	// A second copy has every function elsewhere; a spread of them is
	// enough to see it (and each costs the inspector a few round trips).
	const step = Math.max(1, Math.floor(out.length / 12));
	return out.filter((_, i) => i % step === 0);
}

// The URL of the script each function was compiled from, through one
// in-process inspector session.
async function inspector() {
	const s = new Session();
	s.connect();
	const urls = new Map();
	s.on("Debugger.scriptParsed", (m) => urls.set(m.params.scriptId, m.params.url));
	await s.post("Debugger.enable");
	return {
		async scriptsOf(fns) {
			const out = [];
			for (const fn of fns) {
				globalThis.__moduleProbeFn = fn;
				const { result } = await s.post("Runtime.evaluate", { expression: "globalThis.__moduleProbeFn" });
				const { internalProperties = [] } = await s.post("Runtime.getProperties", { objectId: result.objectId, ownProperties: true });
				const loc = internalProperties.find((p) => p.name === "[[FunctionLocation]]");
				// Bound and native functions have no location of their own.
				out.push(loc ? urls.get(loc.value.value.scriptId) ?? `script ${loc.value.value.scriptId}` : "");
				await s.post("Runtime.releaseObject", { objectId: result.objectId });
			}
			delete globalThis.__moduleProbeFn;
			return out;
		},
		async close() {
			await s.post("Debugger.disable");
			s.disconnect();
		},
	};
}

function protoChain(cls) {
	const out = [];
	for (let p = cls && Object.getPrototypeOf(cls); p && p !== Function.prototype; p = Object.getPrototypeOf(p)) out.push(p);
	return out;
}

export default function (pi) {
	pi.on("session_start", async (_event, ctx) => {
		const report = { links: {}, scripts: {}, control: {}, ms: {} };
		const t0 = performance.now();
		try {
			const sm = ctx.sessionManager;
			const anchor = sm?.constructor;
			report.links["sessionManager instanceof pi-coding-agent SessionManager"] = sm instanceof codingAgent.SessionManager;
			report.links["modelRegistry instanceof pi-coding-agent ModelRegistry"] = ctx.modelRegistry instanceof codingAgent.ModelRegistry;
			report.links["pi-coding-agent BorderedLoader extends pi-tui Container"] = protoChain(codingAgent.BorderedLoader).includes(tui.Container);
			// Pi 0.x's pi-agent-core re-exports pi-ai's uuidv7; 1.x's re-exports
			// nothing of pi-ai (its functions' scripts are checked below).
			if ("uuidv7" in agentCore) report.links["pi-agent-core uuidv7 is pi-ai's"] = agentCore.uuidv7 === ai.uuidv7;
			report.links["pi-ai Type is typebox's"] = ai.Type === typebox.Type;
			report.links["pi-ai getApiProvider is pi-ai/compat's"] = ai.getApiProvider === aiCompat.getApiProvider;
			report.links["@mariozechner/pi-ai is @earendil-works/pi-ai"] = legacyAi.getApiProvider === ai.getApiProvider;
			report.links["@mariozechner/pi-coding-agent is @earendil-works/pi-coding-agent"] = legacyCodingAgent.SessionManager === codingAgent.SessionManager;

			const insp = await inspector();
			const scriptsOf = insp.scriptsOf;
			const [anchorScript] = await scriptsOf([anchor]);
			report.anchor = anchorScript;
			for (const [spec, ns] of Object.entries(namespaces)) {
				const fns = functionsOf(ns);
				const urls = await scriptsOf(fns.map((f) => f[1]));
				const count = {};
				for (const u of urls) if (u) count[u] = (count[u] ?? 0) + 1;
				report.scripts[spec] = { functions: fns.length, from: count };
			}

			report.ms.scripts = Math.round(performance.now() - t0);
			// The control: a second copy, loaded on purpose by its path.
			const stock = path.join(codingAgent.getPackageDir(), "dist", "index.js");
			const second = await import(stock);
			const [secondScript] = await scriptsOf([second.SessionManager]);
			await insp.close();
			report.control = {
				file: stock,
				script: secondScript,
				"sessionManager instanceof its SessionManager": sm instanceof second.SessionManager,
			};
			report.ms.total = Math.round(performance.now() - t0);
		} catch (err) {
			report.error = String(err?.stack ?? err);
		}
		const out = process.env.MODULE_PROBE_OUT || path.join(ctx.cwd, ".module-probe.json");
		fs.writeFileSync(out, JSON.stringify(report, null, 2) + "\n");
	});
}
