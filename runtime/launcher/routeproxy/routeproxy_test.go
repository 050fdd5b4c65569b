package routeproxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// fakeDaemon is a stand-in for Paseo's MCP endpoint: it records requests.
type fakeDaemon struct {
	mu   sync.Mutex
	reqs []*http.Request
	body []string
}

func (d *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	d.reqs = append(d.reqs, r)
	d.body = append(d.body, string(b))
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
}

func setup(t *testing.T) (*fakeDaemon, string) {
	d := &fakeDaemon{}
	_, base := setupWith(t, d, Limits{})
	return d, base
}

// testScope is the reference Pi scope with one tool.
var testMethods = []string{"initialize", "notifications/initialized", "ping", "tools/list", "tools/call"}

// setupWith starts a proxy with limits in front of the upstream handler,
// holding the daemon token "run-token".
func setupWith(t *testing.T, h http.Handler, lim Limits) (*Proxy, string) {
	tok := &Token{}
	if err := tok.Set([]byte("run-token")); err != nil {
		t.Fatal(err)
	}
	return setupToken(t, h, lim, tok)
}

func setupToken(t *testing.T, h http.Handler, lim Limits, tok *Token) (*Proxy, string) {
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	p, err := New(bundle.Route{Purpose: "mcp", Listen: "gateway", Method: "POST", Path: "/mcp/agents",
		CallerAgentID: "agent-7f3c", Upstream: up.URL + "/mcp/agents", Methods: testMethods, Tools: []string{"list_agents"}}, lim, tok)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Serve(l)
	t.Cleanup(func() { p.Close() })
	return p, "http://" + l.Addr().String()
}

func do(t *testing.T, method, url string, hdr map[string]string, body string) (int, string) {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestForwardsOnlyTheRoute(t *testing.T) {
	d, base := setup(t)
	auth := map[string]string{"Content-Type": "application/json", "Cookie": "x=1", "X-Forwarded-For": "1.2.3.4"}
	code, body := do(t, "POST", base+"/mcp/agents?callerAgentId=agent-7f3c", auth, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if code != 200 || !strings.Contains(body, `"result"`) {
		t.Fatalf("route: %d %s", code, body)
	}
	if len(d.reqs) != 1 {
		t.Fatalf("daemon saw %d requests", len(d.reqs))
	}
	r := d.reqs[0]
	if r.Method != "POST" || r.URL.Path != "/mcp/agents" || r.URL.RawQuery != "callerAgentId=agent-7f3c" {
		t.Errorf("forwarded %s %s?%s", r.Method, r.URL.Path, r.URL.RawQuery)
	}
	if r.Header.Get("Authorization") != "Bearer run-token" || r.Header.Get("Cookie") != "" || r.Header.Get("X-Forwarded-For") != "" {
		t.Errorf("forwarded headers: %v", r.Header)
	}
	if !strings.Contains(d.body[0], "tools/list") {
		t.Errorf("body not forwarded: %q", d.body[0])
	}

	refused := []struct {
		name, method, path string
		hdr                map[string]string
		body               string
		code               int
	}{
		{"another agent", "POST", "/mcp/agents?callerAgentId=agent-other", auth, "{}", 403},
		{"no agent", "POST", "/mcp/agents", auth, "{}", 403},
		{"two agents", "POST", "/mcp/agents?callerAgentId=agent-7f3c&callerAgentId=agent-other", auth, "{}", 403},
		{"extra parameter", "POST", "/mcp/agents?callerAgentId=agent-7f3c&admin=1", auth, "{}", 403},
		{"GET", "GET", "/mcp/agents?callerAgentId=agent-7f3c", auth, "", 405},
		{"DELETE", "DELETE", "/mcp/agents?callerAgentId=agent-7f3c", auth, "", 405},
		{"other path", "POST", "/api/agents?callerAgentId=agent-7f3c", auth, "{}", 404},
		{"encoded traversal", "POST", "/mcp/agents%2F..%2Fadmin?callerAgentId=agent-7f3c", auth, "{}", 404},
		{"sub path", "POST", "/mcp/agents/x?callerAgentId=agent-7f3c", auth, "{}", 404},
		{"the sandbox's own bearer", "POST", "/mcp/agents?callerAgentId=agent-7f3c", map[string]string{"Content-Type": "application/json", "Authorization": "Bearer run-token"}, `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 403},
		{"the sandbox's other credentials", "POST", "/mcp/agents?callerAgentId=agent-7f3c", map[string]string{"Content-Type": "application/json", "Authorization": "Basic eDp5"}, `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 403},
	}
	for _, tc := range refused {
		code, _ := do(t, tc.method, base+tc.path, tc.hdr, tc.body)
		if code != tc.code {
			t.Errorf("%s: status %d, want %d", tc.name, code, tc.code)
		}
	}
	if len(d.reqs) != 1 {
		t.Errorf("refused requests reached the daemon: %d requests", len(d.reqs))
	}
	code, _ = do(t, "POST", base+"/mcp/agents?callerAgentId=agent-7f3c", auth, strings.Repeat("x", int(DefaultLimits.MaxBody)+1))
	if code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: status %d", code)
	}
}

func TestRefusesRoutesItCannotEnforce(t *testing.T) {
	for _, r := range []bundle.Route{
		{Purpose: "mcp", Method: "GET", Path: "/mcp/agents", CallerAgentID: "a", Upstream: "http://127.0.0.1:1/mcp/agents"},
		{Purpose: "mcp", Method: "POST", Path: "/mcp/agents", CallerAgentID: "", Upstream: "http://127.0.0.1:1/mcp/agents"},
		{Purpose: "mcp", Method: "POST", Path: "/mcp/agents", CallerAgentID: "a", Upstream: "https://127.0.0.1:1/mcp/agents"},
		{Purpose: "mcp", Method: "POST", Path: "/mcp/agents", CallerAgentID: "a", Upstream: "http://127.0.0.1:1/other"},
		{Purpose: "mcp", Method: "POST", Path: "/mcp/agents", CallerAgentID: "a", Upstream: "http://127.0.0.1:1/mcp/agents?x=1"},
	} {
		if _, err := New(r, Limits{}, &Token{}); err == nil {
			t.Errorf("accepted %+v", r)
		}
	}
}

func TestRefusesWithoutATokenHolder(t *testing.T) {
	if _, err := New(bundle.Route{Purpose: "mcp", Method: "POST", Path: "/mcp/agents", CallerAgentID: "a", Upstream: "http://127.0.0.1:1/mcp/agents"}, Limits{}, nil); err == nil {
		t.Error("a proxy without a token holder was made")
	}
}
