package grant

import "testing"

// A model route's hosted tools are names the route knows, each once, and
// only a model route names any.
func TestRouteHostedToolsValidate(t *testing.T) {
	model := Route{Purpose: "model", Proto: "tcp", Port: 18080, Path: "/v1", Upstream: "https://llm.example.test/v1", TokenRef: "alice/k",
		API: "openai-responses", Credential: "authorization-bearer", Requests: []string{"POST /responses"}, Model: "m-1"}
	for _, c := range []struct {
		tools []string
		ok    bool
	}{{nil, true}, {[]string{"web_search"}, true}, {[]string{"mcp"}, false}, {[]string{"code_interpreter"}, false}, {[]string{"web_search", "web_search"}, false}} {
		g := model
		g.HostedTools = c.tools
		if err := g.Validate(); (err == nil) != c.ok {
			t.Errorf("hosted tools %v: %v", c.tools, err)
		}
	}
	mcp := Route{Purpose: "mcp", Proto: "tcp", Port: 6767, Method: "POST", Path: "/mcp/agents", Upstream: "http://127.0.0.1:6767/mcp/agents",
		HostedTools: []string{"web_search"}}
	if mcp.Validate() == nil {
		t.Error("an MCP route with hosted tools passed Validate")
	}
}
