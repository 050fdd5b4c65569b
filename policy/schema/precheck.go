package schema

import (
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
)

// factsPrecheck looks at raw facts for things the schema would only call
// "invalid" but that deserve their own code: secret values and requests for
// authority the compiler never grants.
func factsPrecheck(raw any, l *diag.List) {
	authorityPrecheck(raw, l)
	markerPrecheck(raw, l)
	walk(raw, "", func(p string, key string, v any) {
		s, ok := v.(string)
		if !ok {
			return
		}
		if isPathField(p) && !(p == "launch.session" && s == "none") {
			if code, msg := pathform.Check(s); code != "" {
				l.Addf(code, p, "%s", msg)
				return
			}
		}
		if reason := secretLike(key, s); reason != "" {
			l.Addf(diag.SecretInFacts, p, "looks like a secret value (%s); facts carry only references such as secretRef", reason)
		}
	})
}

// secretMarker opens a secret placeholder (bundle.SecretMarker; compiler
// tests hold the two equal), which compilers before the model route wrote
// for the launcher to fill.
const secretMarker = "@@paseo-secret:"

// markerPrecheck refuses the placeholder marker in any input string, keys
// included: a marker in a model id or a path would otherwise reach argv
// or a mount, and a launcher that substituted it would put a secret
// there. The launcher refuses the marker anywhere in a bundle too.
func markerPrecheck(raw any, l *diag.List) {
	walk(raw, "", func(p string, key string, v any) {
		if strings.Contains(key, secretMarker) {
			l.Addf(diag.SecretMarker, p, "a field name holds the secret placeholder marker %q; only the compiler writes placeholders", secretMarker)
		}
		if s, ok := v.(string); ok && strings.Contains(s, secretMarker) {
			l.Addf(diag.SecretMarker, p, "holds the secret placeholder marker %q; only the compiler writes placeholders, where it puts a secret", secretMarker)
		}
	})
}

// registryPrecheck: the operator's registry gets the same authority and
// marker checks as the facts.
func registryPrecheck(raw any, l *diag.List) {
	authorityPrecheck(raw, l)
	markerPrecheck(raw, l)
}

// pathFields are the facts that name paths; their form is checked here,
// before the schema, so each problem gets its PP-PATH-* code.
var pathFields = map[string]bool{
	"workspace.cwd": true, "workspace.git.gitdir": true, "workspace.git.commondir": true,
	"credential.authFile": true, "state.agentDir": true, "state.sessionDir": true,
	"state.cacheDir": true, "state.gitStore": true, "launch.extension": true, "launch.mcpConfig": true, "launch.session": true,
}

func isPathField(p string) bool {
	if strings.HasPrefix(p, "workspace.git.alternates[") {
		return true
	}
	return pathFields[p]
}

// authorityPrecheck refuses, with precise codes, requests for authority no
// input may ask for: host networking, directfs, uid 0, capabilities.
func authorityPrecheck(raw any, l *diag.List) {
	walk(raw, "", func(p string, key string, v any) {
		switch key {
		case "directfs":
			if b, ok := v.(bool); !ok || b {
				l.Addf(diag.DirectFS, p, "runsc --directfs is never granted: it lets the Sentry open host files directly")
			}
		case "capabilities":
			if list, ok := v.([]any); !ok || len(list) > 0 {
				l.Addf(diag.Capability, p, "the agent runs with empty capability sets; no capability can be granted")
			}
		case "uid", "gid":
			if n, ok := v.(int64); ok && n == 0 {
				l.Addf(diag.RootUID, p, "the agent never runs as root")
			}
			if f, ok := v.(float64); ok && f == 0 {
				l.Addf(diag.RootUID, p, "the agent never runs as root")
			}
		case "mode", "network":
			if s, ok := v.(string); ok && s == "host" && (key == "network" || strings.HasSuffix(p, "network.mode")) {
				l.Addf(diag.HostNetwork, p, "host networking shares the host's network stack; only none and sandbox are allowed")
			}
		}
	})
}

// joinPath appends a field name to a fact path.
func joinPath(parent, field string) string {
	if parent == "" {
		return field
	}
	return parent + "." + field
}

// walk visits every field of a decoded JSON-like value in sorted order.
func walk(v any, p string, visit func(path, key string, v any)) {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			child := joinPath(p, k)
			visit(child, k, x[k])
			walk(x[k], child, visit)
		}
	case []any:
		for i, e := range x {
			child := p + "[" + strconv.Itoa(i) + "]"
			visit(child, "", e)
			walk(e, child, visit)
		}
	}
}

var (
	secretPrefixes = []string{
		"sk-", "sk_live_", "sk_test_", "ghp_", "gho_", "ghs_", "ghu_", "github_pat_",
		"glpat-", "xoxb-", "xoxp-", "xoxa-", "AKIA", "ASIA", "AIza", "ya29.",
		"-----BEGIN", "Bearer ", "bearer ", "Basic ",
	}
	jwtLike       = regexp.MustCompile(`^eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`)
	secretParams  = []string{"key", "api_key", "apikey", "api-key", "token", "access_token", "secret", "password", "sig", "signature"}
	tokenAlphabet = regexp.MustCompile(`^[A-Za-z0-9_+=]{32,}$`)
)

// secretLike returns why s looks like a credential value, or "". It never
// returns any part of s, so the reason is safe to print.
func secretLike(key, s string) string {
	for _, p := range secretPrefixes {
		if strings.HasPrefix(s, p) {
			return "known credential prefix"
		}
	}
	if jwtLike.MatchString(s) {
		return "JSON web token"
	}
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			if u.User != nil {
				return "URL with user information"
			}
			for name := range u.Query() {
				for _, sp := range secretParams {
					if strings.EqualFold(name, sp) {
						return "URL query parameter " + sp
					}
				}
			}
		}
		return ""
	}
	// Long mixed-case runs with no word separators (base64- or hex-like):
	// identifiers, model ids and paths in facts are short or contain '-',
	// '.' or '/'.
	if tokenAlphabet.MatchString(s) && hasClasses(s) {
		return "long random-looking token"
	}
	return ""
}

func hasClasses(s string) bool {
	var lower, upper, digit bool
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= '0' && r <= '9':
			digit = true
		}
	}
	return lower && upper && digit
}
