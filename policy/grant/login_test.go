package grant

import "testing"

// A login model route (oauth-broker) names an API whose login the route
// brokers, its auth.json, entry and https token endpoint, and no key; a
// key route names none of the login's fields; an MCP route neither.
func TestRouteLoginValidate(t *testing.T) {
	login := Route{Purpose: "model", Proto: "tcp", Port: 18080, Upstream: "https://api.anthropic.com:443",
		API: "anthropic-messages", Credential: ModelLoginCredential, Requests: []string{"POST /v1/messages"}, Model: "m-1",
		LoginFile: "/srv/paseo/state/pi-agent/auth.json", LoginEntry: "anthropic", LoginRefresh: "https://platform.claude.com/v1/oauth/token"}
	if err := login.Validate(); err != nil {
		t.Fatalf("a login route: %v", err)
	}
	for name, edit := range map[string]func(*Route){
		"with a key too":           func(g *Route) { g.TokenRef = "alice/k" },
		"no entry":                 func(g *Route) { g.LoginEntry = "" },
		"relative file":            func(g *Route) { g.LoginFile = "auth.json" },
		"plain-HTTP endpoint":      func(g *Route) { g.LoginRefresh = "http://platform.claude.com/v1/oauth/token" },
		"another API":              func(g *Route) { g.API, g.Requests = "openai-responses", []string{"POST /responses"} },
		"the API key's header":     func(g *Route) { g.Credential = "x-api-key" },
		"a key route's entry":      func(g *Route) { g.LoginFile, g.TokenRef, g.Credential = "", "alice/k", "x-api-key" },
		"a key route's endpoint":   func(g *Route) { g.LoginFile, g.LoginEntry, g.TokenRef, g.Credential = "", "", "alice/k", "x-api-key" },
		"login credential no file": func(g *Route) { g.LoginFile, g.LoginEntry, g.LoginRefresh, g.TokenRef = "", "", "", "alice/k" },
	} {
		g := login
		edit(&g)
		if g.Validate() == nil {
			t.Errorf("%s: passed Validate", name)
		}
	}
	mcp := Route{Purpose: "mcp", Proto: "tcp", Port: 6767, Method: "POST", Path: "/mcp/agents", Upstream: "http://127.0.0.1:6767/mcp/agents",
		LoginFile: "/srv/paseo/state/pi-agent/auth.json"}
	if mcp.Validate() == nil {
		t.Error("an MCP route with a login passed Validate")
	}
}
