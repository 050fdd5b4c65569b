// node image/pi/bundle-adapter.mjs ESBUILD ADAPTERDIR
//
// Bundles pi-mcp-adapter (ADAPTERDIR: the installed package) with its
// dependencies into ADAPTERDIR/index.paseo.ts, with esbuild (ESBUILD: the
// path of the pinned esbuild package), and points the package's Pi
// manifest ("pi".extensions) at it, so Pi's extension loader reads one file
// instead of the adapter's ~60 TypeScript modules and the ~300 files of its
// dependencies (zod, ajv, the MCP SDK, ...): docs/image.md, "The adapter
// bundle".
//
// Why these choices:
//  - The file is named .ts although it holds plain JavaScript: jiti imports
//    an ESM .js or .mjs file natively, where Pi's virtual modules do not
//    reach, and the adapter would get second copies of Pi's packages. A .ts
//    file jiti transpiles, resolving Pi's packages through the loader's
//    virtualModules to the instances the Pi bundle runs.
//  - Pi's packages (the loader's VIRTUAL_MODULES: typebox, @sinclair/typebox,
//    @earendil-works/*, @mariozechner/*) stay imports, for that reason.
//  - open (a browser for an OAuth flow; it runs a script beside its own
//    file) and recheck (native binaries beside its own file) stay imports
//    and load from node_modules when used.
//  - The bundle sits in the adapter's own directory: the adapter finds its
//    assets (skills/, the UI bridge, worker scripts) relative to its file.
//
// The output depends only on the inputs (esbuild is deterministic; paths in
// it are relative to ADAPTERDIR).
import { createRequire } from "node:module";
import * as fs from "node:fs";
import * as path from "node:path";
import * as ascii from "./ascii.mjs";

const [esbuildDir, adapterDir] = process.argv.slice(2);
if (!esbuildDir || !adapterDir) {
	console.error("usage: bundle-adapter.mjs ESBUILD_PACKAGE_DIR ADAPTER_PACKAGE_DIR");
	process.exit(2);
}
const esbuild = createRequire(path.join(esbuildDir, "package.json"))(esbuildDir);
const dir = path.resolve(adapterDir);
const manifestPath = path.join(dir, "package.json");
const manifest = JSON.parse(fs.readFileSync(manifestPath, "utf8"));
const entries = manifest.pi?.extensions;
if (JSON.stringify(entries) !== JSON.stringify(["./index.ts"])) {
	throw new Error(`pi-mcp-adapter's pi.extensions is ${JSON.stringify(entries)}, not ["./index.ts"]: a new adapter needs the bundle looked at again`);
}
const out = "index.paseo.ts";
const result = await esbuild.build({
	absWorkingDir: dir,
	entryPoints: ["index.ts"],
	outfile: out,
	bundle: true,
	platform: "node",
	format: "esm",
	target: "node22",
	external: ["typebox", "typebox/*", "@sinclair/typebox", "@sinclair/typebox/*", "@earendil-works/*", "@mariozechner/*", "open", "recheck"],
	// No comments, so the file is ASCII (ascii.mjs); the licences go to
	// index.paseo.ts.LEGAL.txt.
	minifyWhitespace: true,
	legalComments: "external",
	logLevel: "warning",
	metafile: true,
});
manifest.pi.extensions = [`./${out}`];
fs.writeFileSync(manifestPath, JSON.stringify(manifest, null, 2) + "\n");
ascii.check([path.join(dir, out)]);
const o = result.metafile.outputs[out];
const external = [...new Set(o.imports.filter((i) => i.external && !i.path.startsWith("node:")).map((i) => i.path))].sort();
console.log(`bundled ${Object.keys(result.metafile.inputs).length} modules into ${out}, ${o.bytes} bytes; left as imports: ${external.join(" ")}`);
