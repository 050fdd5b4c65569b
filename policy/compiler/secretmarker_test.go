package compiler

import (
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/schema"
)

// The schema refuses the secret placeholder marker (bundle.SecretMarker,
// which the launcher refuses anywhere in a bundle) in every input string.
func TestSecretMarkerRefusedInFacts(t *testing.T) {
	for _, field := range []string{`"model":{"id":"fake-1%s"}`, `"workspace":{"cwd":"/srv/paseo/workspace/proj-feature/%s"}`,
		`"model":{"baseURL":"https://llm.example.test:8443/v1/%s"}`} {
		_, in, res := caseInputs(t, "host-pi-session-api-key")
		marked := strings.Replace(field, "%s", bundle.SecretPlaceholder("alice/fake-llm"), 1)
		in.Facts = schema.Input{Name: "facts.json", Data: patched(t, "../../testdata/base/facts.json", []byte("{"+marked+"}"))}
		r, diags := Compile(in, Options{Resolver: res})
		if r != nil {
			t.Errorf("%s: compiled", marked)
		}
		if !slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == diag.SecretMarker }) {
			t.Errorf("%s: want %s, got %v", marked, diag.SecretMarker, diags)
		}
	}
}
