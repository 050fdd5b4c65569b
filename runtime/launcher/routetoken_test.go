package launcher

import (
	"errors"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
)

// Without a daemon (paseo-policy launch) the proxy's token comes from the
// deployment's secrets under the route's tokenRef; a token that cannot be
// found refuses a launch whose agent is configured to use the route, and
// leaves the route closed (503) for one that is not. A caller's holder is
// used as it is, and no secret is read.
func TestRouteToken(t *testing.T) {
	route := bundle.Route{Purpose: "mcp", TokenRef: "paseo/mcp-token"}
	withConfig := bundle.Files{bundle.MCPConfigFile: []byte("{}")}
	asked := 0
	src := func(deployment, ref string) ([]byte, error) {
		asked++
		if deployment == "host-alice" && ref == "paseo/mcp-token" {
			return []byte("run-token"), nil
		}
		return nil, errors.New("unknown secret " + ref)
	}
	tok, err := routeToken(Options{Secrets: src}, withConfig, "host-alice", route)
	if err != nil || tok == nil {
		t.Fatalf("from the secrets: %v", err)
	}
	if _, err := routeToken(Options{Secrets: src}, withConfig, "host-bob", route); err == nil || strings.Contains(err.Error(), "run-token") {
		t.Errorf("another deployment's lookup: %v", err)
	}
	if _, err := routeToken(Options{}, withConfig, "host-alice", route); err == nil {
		t.Error("no secret source and an MCP config: launched")
	}
	if tok, err := routeToken(Options{}, bundle.Files{}, "host-alice", route); err != nil || tok == nil {
		t.Errorf("no MCP config, no token: %v", err)
	}
	asked = 0
	mine := &routeproxy.Token{}
	if tok, err := routeToken(Options{Secrets: src, MCPToken: mine}, withConfig, "host-alice", route); err != nil || tok != mine || asked != 0 {
		t.Errorf("the caller's holder: %v, same %v, %d lookups", err, tok == mine, asked)
	}
}
