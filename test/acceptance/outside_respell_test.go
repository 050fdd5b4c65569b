package acceptance

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/mcpstandin"
	"paseo.dev/paseo-policy/internal/testkit/rawroute"
	"paseo.dev/paseo-policy/internal/testkit/respell"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
)

// The MCP route respelled (issue 18): from inside a sandbox's network
// namespace the agent sends tools/call spelled so that the proxy's reading
// and the daemon's differ (key case, charsets, batches; the corpus's
// representative set), through the reviewed route to a stand-in of
// Paseo's endpoint on Paseo's own npm stack (test/mcpstandin). A win is
// the stand-in running a tool outside the route's scope. The product is
// contained; two controls each lack one of its protections: the same
// scope check forwarding the agent's bytes and Content-Type (no canonical
// re-encoding), and the proxy's check before issue 18 (encoding/json's
// case-insensitive reading) forwarding them too.

var respellPool = netip.MustParsePrefix("10.213.81.4/30")

func (s *scene) respellThroughRoute(t *testing.T) []OutsideAttack {
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
	const token = "run-token"
	standIn := mcpstandin.Start(t, token)
	route := eg.Routes[0]
	route.Upstream = standIn.URL
	nw := s.floodNeighbour(t, "mcp-respell", respellPool, nil, []bundle.Route{route})
	tok := &routeproxy.Token{}
	if err := tok.Set([]byte(token)); err != nil {
		t.Fatal(err)
	}
	spellings := respell.Representative()

	// serve starts one way on the gateway's route port and returns its
	// closer.
	serve := func(name string) func() {
		ln, err := nw.ListenGateway(route.Port)
		if err != nil {
			t.Fatal(err)
		}
		if name == "product" {
			p, err := routeproxy.New(route, routeproxy.Limits{}, tok)
			if err != nil {
				t.Fatal(err)
			}
			p.Serve(ln)
			return func() { p.Close() }
		}
		scope := routeproxy.Scope{Methods: route.Methods, Tools: route.Tools}
		check := func(b []byte) error { _, err := scope.Check(b); return err }
		if name == "lenient" {
			check = rawroute.Lenient(route.Methods, route.Tools)
		}
		h, err := rawroute.Route{Path: route.Path, CallerAgentID: route.CallerAgentID, Upstream: standIn.URL, Token: token, Check: check}.Handler()
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		return func() { srv.Close(); <-done }
	}
	outside := func(runs []mcpstandin.Run) int {
		n := 0
		for _, r := range runs {
			if !slices.Contains(route.Tools, r.Tool) || r.CallerAgentID != route.CallerAgentID {
				n++
			}
		}
		return n
	}
	run := func(name string) (tally Tally) {
		defer serve(name)()
		tr := &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return testnet.DialFrom(nw.NetnsPath, network, addr, 3*time.Second)
		}}
		defer tr.CloseIdleConnections()
		url := fmt.Sprintf("http://%s:%d%s?callerAgentId=%s", nw.Gateway, route.Port, route.Path, route.CallerAgentID)
		sess, err := mcpstandin.Open(&http.Client{Transport: tr, Timeout: 30 * time.Second}, url)
		if err != nil {
			t.Fatalf("%s: opening a session through the route: %v", name, err)
		}
		send := func(sp respell.Spelling) (int, string, []mcpstandin.Run) {
			if err := standIn.Reset(); err != nil {
				t.Fatal(err)
			}
			code, answer, err := sess.Post(sp.ContentType, sp.Body)
			if err != nil {
				t.Fatalf("%s: %s/%s: %v", name, sp.Family, sp.Name, err)
			}
			runs, err := standIn.Runs()
			if err != nil {
				t.Fatal(err)
			}
			return code, string(answer), runs
		}
		// The plain in-scope call runs, or a contained run proves nothing.
		if _, answer, runs := send(respell.Control()); len(runs) != 1 || runs[0].Tool != respell.Cover {
			t.Fatalf("%s: the plain list_agents call ran %+v: %.300s", name, runs, answer)
		}
		for _, sp := range spellings {
			tally.Attempts++
			code, answer, runs := send(sp)
			switch {
			case outside(runs) > 0:
				tally.Wins++
			case code >= 400 || strings.Contains(answer, `"error"`):
				tally.Refusals++
			}
		}
		return tally
	}
	contained := run("product")
	families := map[string]bool{}
	for _, sp := range spellings {
		families[sp.Family] = true
	}
	evidence := fmt.Sprintf("%d spellings of %d families (internal/testkit/respell) to test/mcpstandin; a win is a tool outside %v running there", len(spellings), len(families), route.Tools)
	return []OutsideAttack{
		{Name: "agent-respells-tool-call-through-route", Attacker: "agent",
			Goal:      "have Paseo's endpoint run an out-of-scope tool (create_agent, create_terminal, ...) from a tools/call body the route proxy reads as an in-scope one: a charset (UTF-7) body-parser honours, case-variant and escaped keys, duplicates, BOMs, batches, odd numbers and unicode",
			Control:   "the same scope check, forwarding the agent's own bytes and Content-Type instead of the checked value re-encoded",
			Contained: contained, ControlRun: run("raw"), Evidence: evidence},
		{Name: "agent-respells-tool-keys-through-route", Attacker: "agent",
			Goal:      "the same spellings, for the key spellings (params.Name, NAME, escaped case variants next to name) that a case-insensitive reader takes for name",
			Control:   "the proxy's check before issue 18 (encoding/json's case-insensitive struct keys), forwarding the agent's own bytes and Content-Type",
			Contained: contained, ControlRun: run("lenient"), Evidence: evidence},
	}
}
