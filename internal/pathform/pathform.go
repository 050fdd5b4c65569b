// Package pathform checks the written form of absolute paths: the lexical
// half of path safety, shared by the schema's prechecks and the resolver.
package pathform

import (
	"path"
	"strings"

	"paseo.dev/paseo-policy/diag"
)

// MaxLen bounds a path; longer ones are refused rather than truncated.
const MaxLen = 4096

// Check checks the form of an absolute path and returns the first
// problem's code and a message, or "" when the path is canonical.
func Check(p string) (diag.Code, string) {
	if len(p) > MaxLen {
		return diag.PathNonCanonical, "path is longer than 4096 bytes"
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return diag.PathControl, "path contains NUL, newline or another control character"
		}
	}
	if !strings.HasPrefix(p, "/") {
		return diag.PathRelative, "path must be absolute"
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return diag.PathDotDot, "path must not contain .."
		}
	}
	if path.Clean(p) != p {
		return diag.PathNonCanonical, "path must be canonical (no //, /./ or trailing slash); want " + path.Clean(p)
	}
	return "", ""
}

// Beneath reports whether p is root or lies below it. Both must be canonical.
func Beneath(root, p string) bool {
	if root == "/" {
		return strings.HasPrefix(p, "/")
	}
	// root+"/" would allocate on every call; the compiler asks this for
	// every bind against every root.
	return p == root || len(p) > len(root) && p[len(root)] == '/' && strings.HasPrefix(p, root)
}

// Rel returns p relative to root ("." for root itself); p must be Beneath root.
func Rel(root, p string) string {
	if p == root {
		return "."
	}
	if root == "/" {
		return p[1:]
	}
	return p[len(root)+1:]
}
