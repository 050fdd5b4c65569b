package compiler

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The registry narrows the profile's MCP scope and never widens it: a
// list left out keeps the profile's, an empty one keeps nothing, a name
// the profile lacks is not granted.
func TestNarrowNeverWidens(t *testing.T) {
	profile := []string{"a", "b", "c"}
	for _, tc := range []struct {
		registry []string
		want     string
	}{
		{nil, "[a b c]"},
		{[]string{}, "[]"},
		{[]string{"c", "a"}, "[a c]"},
		{[]string{"z", "b", "b"}, "[b]"},
	} {
		if got := fmt.Sprint(narrow(profile, tc.registry)); got != tc.want {
			t.Errorf("narrow(%v, %v) = %s, want %s", profile, tc.registry, got, tc.want)
		}
	}
}

// The reference scope reaches egress.json: the route the proxy enforces
// holds exactly the grant's methods and tools, and no tool that starts
// work outside the sandbox.
func TestMCPScopeRendered(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	r, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	var route *grant.Route
	for _, g := range r.Manifest.Grants {
		if g, ok := g.(grant.Route); ok && g.Purpose == "mcp" {
			route = &g
		}
	}
	if route == nil {
		t.Fatal("no mcp route grant")
	}
	eg, err := r.Files.Egress()
	if err != nil || len(eg.Routes) != 2 {
		t.Fatalf("egress: %v (want the model and the MCP route)", err)
	}
	mcp := slices.IndexFunc(eg.Routes, func(r bundle.Route) bool { return r.Purpose == "mcp" })
	if mcp < 0 {
		t.Fatal("egress.json has no mcp route")
	}
	eg.Routes[0] = eg.Routes[mcp]
	var opts []string
	for _, m := range eg.Routes[0].Methods {
		opts = append(opts, "method="+m)
	}
	for _, tool := range eg.Routes[0].Tools {
		opts = append(opts, "tool="+tool)
	}
	var scope []string
	for _, m := range route.Methods {
		scope = append(scope, "method="+m)
	}
	for _, tool := range route.Tools {
		scope = append(scope, "tool="+tool)
	}
	if got, want := strings.Join(opts, " "), strings.Join(scope, " "); got != want {
		t.Errorf("egress.json scope %q, grant %q", got, want)
	}
	for _, tool := range []string{"create_agent", "send_agent_prompt", "kill_agent", "respond_to_permission"} {
		if strings.Contains(strings.Join(eg.Routes[0].Tools, " "), tool) {
			t.Errorf("the reference scope allows %s", tool)
		}
	}
}
