package routeproxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
)

// hostedBodies are, per API, a Pi body with the provider's web search
// added as the provider documents it.
var hostedBodies = map[string]string{
	"openai-completions": `{"model":"m-1","messages":[{"role":"user","content":"news?"}],"stream":true,` +
		`"web_search_options":{"search_context_size":"low","user_location":{"type":"approximate","approximate":{"country":"DE"}}}}`,
	"openai-responses": `{"model":"m-1","input":[{"role":"user","content":"news?"}],"stream":true,"store":false,` +
		`"tools":[{"type":"function","name":"bash","parameters":{}},{"type":"web_search","filters":{"allowed_domains":["example.org"]},"search_context_size":"low"}]}`,
	"anthropic-messages": `{"model":"m-1","messages":[{"role":"user","content":"news?"}],"max_tokens":100,"stream":true,` +
		`"tools":[{"name":"read","input_schema":{}},{"type":"web_search_20250305","name":"web_search","max_uses":3,"allowed_domains":["example.org"]}]}`,
}

// A hosted tool passes only on a route whose registry grants it, with
// the members the provider documents for it; a grant of web search
// admits no other hosted tool and never a connector.
func TestBodyPolicyHostedTools(t *testing.T) {
	check := func(api, body string, hosted ...string) *Refusal {
		t.Helper()
		n, err := decodeStrict([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", api, err)
		}
		return BodyPolicies[api].Check(n, "m-1", hosted...)
	}
	// Each API's web search, respelled wrongly or beside what it does
	// not admit.
	others := map[string][]struct {
		name, from, to string
		reason         Reason
	}{
		"openai-completions": {
			{"an unknown member", `"search_context_size":"low"`, `"search_context_size":"low","url":"https://x.example"`, ReasonUnknownMember},
		},
		"openai-responses": {
			{"an unknown member", `"search_context_size":"low"}`, `"search_context_size":"low","url":"https://x.example"}`, ReasonUnknownMember},
			{"another hosted tool", `"type":"web_search"`, `"type":"code_interpreter"`, ReasonHostedTool},
			{"a connector", `{"type":"web_search","filters":{"allowed_domains":["example.org"]},"search_context_size":"low"}`, `{"type":"mcp","server_url":"https://x.example","headers":{"a":"b"}}`, ReasonConnector},
		},
		"anthropic-messages": {
			{"an unknown member", `"max_uses":3`, `"max_uses":3,"url":"https://x.example"`, ReasonUnknownMember},
			{"another name", `"name":"web_search"`, `"name":"web_fetch"`, ReasonShape},
			{"another hosted tool", `"type":"web_search_20250305"`, `"type":"web_fetch_20250910"`, ReasonHostedTool},
			{"an undated type", `"type":"web_search_20250305"`, `"type":"web_search_latest"`, ReasonHostedTool},
		},
	}
	for api, body := range hostedBodies {
		if rf := check(api, body, "web_search"); rf != nil {
			t.Errorf("%s: granted web search refused: %v", api, rf)
		}
		if rf := check(api, body); rf == nil || rf.Reason != ReasonHostedTool {
			t.Errorf("%s: web search without the grant: %v, want a hosted-tool refusal", api, rf)
		}
		for _, o := range others[api] {
			if !strings.Contains(body, o.from) {
				t.Fatalf("%s %s: the body lacks %s", api, o.name, o.from)
			}
			b := strings.Replace(body, o.from, o.to, 1)
			if rf := check(api, b, "web_search"); rf == nil || rf.Reason != o.reason {
				t.Errorf("%s: %s with web search granted: %v, want %s", api, o.name, rf, o.reason)
			}
		}
	}
	if rf := check("anthropic-messages", `{"model":"m-1","messages":[],"max_tokens":1,"mcp_servers":[{"type":"url","url":"https://x.example","name":"x"}]}`, "web_search"); rf == nil || rf.Reason != ReasonConnector {
		t.Errorf("anthropic mcp_servers with web search granted: %v", rf)
	}
}

// Through the route: with the grant the provider gets the body (as
// checked), without it the provider gets nothing, on each API.
func TestModelRouteHostedToolGrant(t *testing.T) {
	for api, body := range hostedBodies {
		t.Run(api, func(t *testing.T) {
			for _, grant := range []bool{true, false} {
				rt := apiRoutes[api]
				if grant {
					rt.HostedTools = []string{"web_search"}
				}
				rec := &recorder{}
				w := newModelWorldFor(t, rt, rec, nil)
				w.url = w.forAPI(api)
				resp, answer := w.do(t, "POST", apiPaths[api], body, piHeaders(api))
				got := rec.all()
				switch {
				case grant && (resp.StatusCode != http.StatusOK || len(got) != 1):
					t.Errorf("granted: %d %s, provider saw %d requests", resp.StatusCode, answer, len(got))
				case !grant && (resp.StatusCode != http.StatusForbidden || len(got) != 0 || w.proxy.Stats.Refusals()["hosted-tool"] != 1):
					t.Errorf("not granted: %d %s, provider saw %d requests, refusals %v", resp.StatusCode, answer, len(got), w.proxy.Stats.Refusals())
				}
			}
		})
	}
	// A route naming a hosted tool the proxy does not know is refused.
	rt := apiRoutes["openai-responses"]
	rt.HostedTools = []string{"code_interpreter"}
	o := ModelOptions{Key: func() ([]byte, error) { return nil, nil },
		Dial: func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("no dial") }}
	if _, err := NewModel(rt, o); err == nil || !strings.Contains(err.Error(), "hosted tool") {
		t.Errorf("a route with an unknown hosted tool: %v", err)
	}
	rt.HostedTools = []string{"web_search"}
	if _, err := NewModel(rt, o); err != nil {
		t.Errorf("a route with web search: %v", err)
	}
}
