// The ASCII rule the image's bundles keep (image/pi/bundle.mjs,
// image/pi/bundle-adapter.mjs). V8 keeps a script whose source holds one
// non-ASCII character anywhere as a two-byte string: Node decodes the
// whole file into UTF-16 (a slow path, twice the memory) and the parser
// scans twice the bytes. esbuild escapes non-ASCII characters in strings
// but keeps them in comments and in regular expression literals, so the
// bundlers strip comments (minifyWhitespace; licences go to LEGAL.txt files
// beside the bundle) and escape what regular expressions hold.
import * as fs from "node:fs";

// escape writes every non-ASCII UTF-16 unit of s as \uXXXX. A character
// outside the BMP becomes its surrogate pair, which a regular expression
// reads as that character with or without the u flag, as a string does.
export function escape(s) {
	return s.replace(/[^\x00-\x7f]/g, (u) => "\\u" + u.charCodeAt(0).toString(16).padStart(4, "0"));
}

// check fails the build if any of files holds a non-ASCII byte.
export function check(files) {
	for (const f of files) {
		const n = (fs.readFileSync(f, "latin1").match(/[^\x00-\x7f]/g) || []).length;
		if (n > 0) throw new Error(`${f} has ${n} non-ASCII bytes: V8 would keep it as a two-byte string; a new Pi or adapter needs image/pi/ascii.mjs's escapes looked at again`);
	}
}
