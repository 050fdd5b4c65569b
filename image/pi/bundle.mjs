// node image/pi/bundle.mjs ESBUILD PKGDIR NODE
//
// Bundles Pi (PKGDIR: the installed @earendil-works/pi-coding-agent) into
// PKGDIR/dist/pi.bundle.js and its chunks, PKGDIR/dist/pi.chunk-<hash>.js,
// with esbuild (ESBUILD: the path of the pinned esbuild package), so a
// start reads a few files instead of ~2,000 modules (docs/image.md, "The Pi
// bundle"). What Pi imports only when it first needs it (a provider's SDK,
// an OAuth flow, a panel) goes to chunks of its own, so a start neither
// parses nor keeps it, as the stock Pi does not; shared code is in chunks
// every entry imports, so there is one instance of every module. The bundle sits in Pi's own dist/
// directory because Pi finds its assets (package.json, themes, the HTML
// export templates, docs) by walking up from its own file; the installed
// tree stays as it is beside it (extensions' own dependencies, assets, the
// stock dist/cli.js).
//
// Changes to what esbuild reads, each found exactly where expected or
// the build fails (a new Pi must be looked at again):
//
//  1. Pi's extension loader gives jiti `alias` paths to Pi's packages on
//     disk (dist/index.js, pi-ai's compat.js, ...) unless it runs as Pi's
//     own bundle, a Bun binary or a Node SEA. From this bundle those files
//     would be second copies of Pi's modules, so the loader takes the
//     embedded branch (usesEmbeddedModules): it passes the module
//     namespaces it already imports (VIRTUAL_MODULES, the same specifiers
//     as the aliases) and jiti's static entry: an extension gets the very
//     instances the bundle runs.
//  2. pi-ai loads its Bedrock provider and  OAuth flows through a
//     variable specifier relative to its own file, which from the bundle
//     would name files that do not exist; they become literal imports that
//     esbuild bundles, still evaluated only when first used.
//  3. photon-node stays external: it reads its wasm relative to its own
//     file (__dirname), so Node loads it from node_modules.
//  4. jiti's static entry (which Pi's loader imports) evaluates all of
//     babel when it is imported, for Bun's compiled binaries; here babel
//     is required when jiti first transforms a file, which with the
//     image's jiti seed is never: the start no longer runs babel's module
//     code (docs/benchmarks.md).
//  5. Three regular expressions in pi-tui and one in the interactive mode's
//     easter egg hold non-ASCII characters; they are escaped, so every output file is ASCII (image/pi/ascii.mjs says
//     why; the build fails if one is not).
//
// (Pi 1.x imports highlight.js's core and 21 languages at the start and the
// rest when first needed, which the 0.84.2 bundle had to patch in.)
//
// The bundle's #! line is NODE (the image's node, and the one option the
// kernel passes it: image/build.sh) instead of Pi's `/usr/bin/env node`, so
// `pi` (a link to the bundle) starts with one exec: under gVisor every exec
// is dear, and env would add one.
//
// Also written: PKGDIR/dist/image-resize-worker.js, the image-resize worker
// Pi starts from its own directory (new URL("./image-resize-worker.js")).
//
// The output depends only on the inputs (esbuild is deterministic, paths in
// it are relative to PKGDIR's node_modules tree).
import { createRequire } from "node:module";
import * as fs from "node:fs";
import * as path from "node:path";
import * as ascii from "./ascii.mjs";

const [esbuildDir, pkgDir, node] = process.argv.slice(2);
if (!esbuildDir || !pkgDir || !node?.startsWith("/")) {
	console.error("usage: bundle.mjs ESBUILD_PACKAGE_DIR PI_PACKAGE_DIR /ABSOLUTE/PATH/OF/NODE");
	process.exit(2);
}
const esbuild = createRequire(path.join(esbuildDir, "package.json"))(esbuildDir);
const pkg = path.resolve(pkgDir);
const modules = path.dirname(path.dirname(pkg)); // .../node_modules

// [file under node_modules, from, to (a string or a function of the
// match), expected count (-1: at least one), what must be gone afterwards]
const patches = [
	[
		"@earendil-works/pi-coding-agent/dist/core/extensions/loader.js",
		/^const usesEmbeddedModules = isBunBinary \|\| isNodeSeaBinary \|\| isBundledNode;$/gm,
		"const usesEmbeddedModules = true;",
		1,
		/usesEmbeddedModules = isBunBinary/g,
	],
	[
		"@earendil-works/pi-ai/dist/api/bedrock-converse-stream.lazy.js",
		/importNodeOnlyApi\("(\.\/[A-Za-z0-9_.-]+)\.ts"\)/g,
		'import("$1.js")',
		1,
		/importNodeOnlyApi\(/g,
	],
	[
		"@earendil-works/pi-ai/dist/auth/oauth/load.js",
		/importOAuthModule\("(\.\/[A-Za-z0-9_.-]+)\.ts"\)/g,
		'import("$1.js")',
		-1,
		/importOAuthModule\(/g,
	],
	[
		"jiti/lib/jiti-static.mjs",
		/^import _babelTransform from "\.\.\/dist\/babel\.cjs";$|transform: _babelTransform \}/gm,
		(m) => (m.startsWith("import") ? "" : 'transform: (o) => require("../dist/babel.cjs")(o) }'),
		2,
		/_babelTransform/g,
	],
	[
		"@earendil-works/pi-tui/dist/components/markdown.js",
		/\[_\^=\+\*\/<>\(\)\[\\\]\|±≤≥≠≈∈→⇒∞∫∑√-\]/g,
		ascii.escape,
		1,
		/\|±≤≥/g,
	],
	[
		"@earendil-works/pi-coding-agent/dist/modes/interactive/components/easter-egg-3d.js",
		/\/\^\[\.,:;'`\\-_·\]\$\//g,
		ascii.escape,
		1,
		/_·\]/g,
	],
	[
		"@earendil-works/pi-tui/dist/latex.js",
		/\[\\p\{L\}\\p\{N\}√\\u\{f0000\}\]|\[A-Z\*∗\]/g,
		ascii.escape,
		2,
		/\\p\{N\}√|\*∗/g,
	],
];
const patchFiles = new Map(patches.map((p) => [path.join(modules, p[0]), p]));
const seen = new Set();
const patch = {
	name: "paseo-pi-patches",
	setup(build) {
		build.onLoad({ filter: /\.m?js$/ }, (args) => {
			const p = patchFiles.get(args.path);
			if (!p) return undefined;
			const [name, from, to, want, gone] = p;
			const src = fs.readFileSync(args.path, "utf8");
			const n = (src.match(from) || []).length;
			const out = src.replace(from, to);
			const left = (out.match(gone) || []).length;
			if ((want > 0 && n !== want) || (want < 0 && n < 1) || left !== 0) {
				throw new Error(`${name}: expected ${want < 0 ? "at least 1" : want} match(es) of ${from}, found ${n} (${left} left over): a new Pi needs this patch looked at again`);
			}
			seen.add(name);
			return { contents: out, loader: "js" };
		});
	},
};

const result = await esbuild.build({
	absWorkingDir: pkg,
	entryPoints: { "pi.bundle": "dist/cli.js", "image-resize-worker": "dist/utils/image-resize-worker.js" },
	outdir: "dist",
	bundle: true,
	platform: "node",
	format: "esm",
	target: "node22",
	external: ["@silvia-odwyer/photon-node"],
	// CommonJS modules in the bundle require Node's built-ins; an ESM file
	// has no require of its own.
	banner: {
		js: 'import { createRequire as __paseoCreateRequire } from "node:module";\nconst require = __paseoCreateRequire(import.meta.url);',
	},
	// No comments (ascii.mjs); the licences go to <file>.LEGAL.txt.
	minifyWhitespace: true,
	legalComments: "external",
	logLevel: "warning",
	metafile: true,
	splitting: true,
	chunkNames: "pi.chunk-[hash]",
	plugins: [patch],
});
for (const p of patches) {
	if (!seen.has(p[0])) throw new Error(`${p[0]} was not part of the bundle: a new Pi needs the patches looked at again`);
}
const entry = path.join(pkg, "dist/pi.bundle.js");
const stockHashbang = "#!/usr/bin/env node\n";
const code = fs.readFileSync(entry, "utf8");
if (!code.startsWith(stockHashbang)) throw new Error(`dist/pi.bundle.js does not start with ${JSON.stringify(stockHashbang)}: a new Pi needs the #! line looked at again`);
fs.writeFileSync(entry, `#!${node}\n` + code.slice(stockHashbang.length));
const outs = Object.entries(result.metafile.outputs);
ascii.check(outs.filter(([o]) => o.endsWith(".js")).map(([o]) => path.join(pkg, o)));
const bytes = outs.reduce((n, [, o]) => n + o.bytes, 0);
const main = result.metafile.outputs["dist/pi.bundle.js"];
console.log(`bundled ${Object.keys(result.metafile.inputs).length} modules into ${outs.length} files, ${bytes} bytes (dist/pi.bundle.js ${main.bytes})`);
