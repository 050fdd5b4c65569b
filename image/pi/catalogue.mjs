// node image/pi/catalogue.mjs PI_AI_DIR
//
// Prints Pi's built-in model catalogue as JSON: for each provider and model
// id that the installed @earendil-works/pi-ai (PI_AI_DIR) ships, the
// provider API Pi speaks to it (models.json's "api"). The compiler embeds
// this file (policy/compiler/pi-catalogue.json) and takes a stock model's
// API from it, so api-key facts for a built-in provider need no model.api;
// the Pi contract suite (test/picontract) checks the embedded copy against
// the image's Pi, and image/build.sh writes the image's own copy
// (docs/image.md, "Pi's model catalogue").
//
// Only what the route needs: the API. Keys are sorted and the output ends
// in a newline, so the same Pi gives the same bytes.
import * as fs from "node:fs";
import * as path from "node:path";
import { pathToFileURL } from "node:url";

const dir = process.argv[2];
if (!dir) {
	console.error("usage: catalogue.mjs PI_AI_PACKAGE_DIR");
	process.exit(2);
}
const pkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
if (pkg.name !== "@earendil-works/pi-ai") throw new Error(`${dir} is ${pkg.name}, not @earendil-works/pi-ai`);
const { MODELS } = await import(pathToFileURL(path.join(dir, "dist/models.generated.js")).href);
if (!MODELS || typeof MODELS !== "object") throw new Error("pi-ai's dist/models.generated.js exports no MODELS: a new Pi needs this script looked at again");
const models = {};
for (const provider of Object.keys(MODELS).sort()) {
	const out = {};
	for (const id of Object.keys(MODELS[provider]).sort()) {
		const m = MODELS[provider][id];
		if (m.provider !== provider || m.id !== id || typeof m.api !== "string" || !m.api) {
			throw new Error(`MODELS.${provider}[${JSON.stringify(id)}] is not {provider, id, api} as expected: a new Pi needs this script looked at again`);
		}
		out[id] = m.api;
	}
	models[provider] = out;
}
process.stdout.write(JSON.stringify({ pi: pkg.version, models }, null, 1) + "\n");
