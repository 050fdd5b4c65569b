package acceptance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
)

// The MCP route used for more than a Pi agent needs (issue 11, item 8):
// from inside a sandbox's network namespace, the agent asks the daemon,
// through its route proxy, to create a helper agent. Paseo's other
// providers run unsandboxed, so the helper's work would run outside any
// sandbox. The contained run uses the reviewed route (the golden api-key
// bundle's egress.json, whose scope is pi-session's); the control is the
// same route with create_agent added to its tools, as the proxy forwarded
// every tool before the scope existed. The win is the daemon receiving a
// tools/call of create_agent.

func init() { registerOutside("mcp", mcpAttacks) }

func mcpAttacks(t *testing.T, s *scene) []OutsideAttack {
	return append([]OutsideAttack{s.createAgentThroughRoute(t)}, s.respellThroughRoute(t)...)
}

var mcpRoutePool = netip.MustParsePrefix("10.213.81.0/30")

func (s *scene) createAgentThroughRoute(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "agent-creates-helper-through-route", Attacker: "agent",
		Goal:    "call Paseo's create_agent through the sandbox's MCP route (plain, in a batch behind an allowed call, with a duplicated name key, as a notification, under a SSE-accepting client), so the daemon starts an agent outside any sandbox",
		Control: "the same route and proxy with create_agent in the route's tools (no scope on tools)"}
	data, err := os.ReadFile(testbundle.Repo(t, "testdata/host-pi-session-api-key/golden/egress.json"))
	if err != nil {
		t.Fatal(err)
	}
	var eg bundle.Egress
	err = json.Unmarshal(data, &eg)
	// The model route (issue 24) sits beside it; the MCP route is the one.
	eg.Routes = slices.DeleteFunc(eg.Routes, func(r bundle.Route) bool { return r.Purpose != "mcp" })
	if err != nil || len(eg.Routes) != 1 {
		t.Fatalf("the golden egress.json: %v %d routes", err, len(eg.Routes))
	}
	reviewed := eg.Routes[0]
	if slices.Contains(reviewed.Tools, "create_agent") || !slices.Contains(reviewed.Methods, "tools/call") {
		t.Fatalf("the reviewed scope changed: %v %v", reviewed.Methods, reviewed.Tools)
	}

	var mu sync.Mutex
	var created int
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		// The daemon parses as JavaScript does: the last of duplicate keys.
		var msgs []struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msgs) != nil {
			msgs = msgs[:0]
			var one struct {
				Method string `json:"method"`
				Params struct {
					Name string `json:"name"`
				} `json:"params"`
			}
			if json.Unmarshal(body, &one) == nil {
				msgs = append(msgs, one)
			}
		}
		for _, m := range msgs {
			if m.Method == "tools/call" && m.Params.Name == "create_agent" {
				mu.Lock()
				created++
				mu.Unlock()
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`)
	}))
	defer daemon.Close()
	route := reviewed
	route.Upstream = daemon.URL + reviewed.Path
	nw := s.floodNeighbour(t, "mcp-scope", mcpRoutePool, nil, []bundle.Route{route})
	token := &routeproxy.Token{}
	if err := token.Set([]byte("run-token")); err != nil {
		t.Fatal(err)
	}
	attempts := []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_agent","arguments":{"cwd":"/","title":"helper","initialPrompt":"rm -rf ~"}}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents"}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_agent"}}]`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","name":"create_agent"}}`,
		`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"create_agent"}}`,
	}
	run := func(r bundle.Route) (tally Tally) {
		mu.Lock()
		created = 0
		mu.Unlock()
		p, err := routeproxy.New(r, routeproxy.Limits{}, token)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := nw.ListenGateway(r.Port)
		if err != nil {
			t.Fatal(err)
		}
		p.Serve(ln)
		defer p.Close()
		tr := &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return testnet.DialFrom(nw.NetnsPath, network, addr, 3*time.Second)
		}}
		defer tr.CloseIdleConnections()
		url := fmt.Sprintf("http://%s:%d%s?callerAgentId=%s", nw.Gateway, r.Port, r.Path, r.CallerAgentID)
		for _, body := range attempts {
			tally.Attempts++
			mu.Lock()
			before := created
			mu.Unlock()
			req, _ := http.NewRequest("POST", url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
			if err != nil {
				t.Fatalf("the route: %v", err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			won := created > before
			mu.Unlock()
			switch {
			case won:
				tally.Wins++
			case strings.Contains(string(answer), `"error"`):
				tally.Refusals++
			}
		}
		return tally
	}
	a.Contained = run(route)
	widened := route
	widened.Tools = append(slices.Clone(route.Tools), "create_agent")
	a.ControlRun = run(widened)
	a.Evidence = fmt.Sprintf("reviewed scope methods %v tools %v; a win is a tools/call of create_agent at the daemon", reviewed.Methods, reviewed.Tools)
	return a
}
