package routeproxy_test

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/mcpstandin"
	"paseo.dev/paseo-policy/internal/testkit/rawroute"
	"paseo.dev/paseo-policy/internal/testkit/respell"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
)

// The differential test of issue 18: the proxy's reading of a body against
// the daemon's own. Every spelling of the corpus (internal/testkit/respell)
// goes through the product proxy to a stand-in of Paseo's endpoint on
// Paseo's npm stack (test/mcpstandin) and through two controls, each
// lacking one of the product's protections: "raw" checks with the same
// Scope.Check but forwards the agent's bytes and Content-Type, "lenient"
// also checks with encoding/json as the proxy did before. The stand-in
// says which tools ran; a win is a tool outside the scope.

const standinToken = "standin-run-token"

// referenceRoute is the reference route's scope (the golden api-key
// bundle's egress.json) in front of upstream.
func referenceRoute(upstream string) bundle.Route {
	return bundle.Route{Purpose: "mcp", Listen: "gateway", Method: "POST", Path: "/mcp/agents", CallerAgentID: "agent-7f3c",
		Upstream: upstream, Methods: []string{"initialize", "notifications/initialized", "ping", "tools/list", "tools/call"},
		Tools: []string{"list_agents", "get_agent_status", "get_agent_activity", "wait_for_agent"}}
}

// via is one way to the stand-in: a proxy and a session through it.
type via struct {
	name    string
	session *mcpstandin.Session
}

type routes struct {
	standIn *mcpstandin.StandIn
	route   bundle.Route
	// product first, then the controls.
	vias []via
}

func listen(t testing.TB) net.Listener {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func startRoutes(t testing.TB) *routes {
	s := mcpstandin.Start(t, standinToken)
	r := &routes{standIn: s, route: referenceRoute(s.URL)}
	tok := &routeproxy.Token{}
	if err := tok.Set([]byte(standinToken)); err != nil {
		t.Fatal(err)
	}
	p, err := routeproxy.New(r.route, routeproxy.Limits{}, tok)
	if err != nil {
		t.Fatal(err)
	}
	pl := listen(t)
	p.Serve(pl)
	t.Cleanup(func() { p.Close() })
	addrs := []struct {
		name string
		addr string
	}{{"product", pl.Addr().String()}}

	scope := routeproxy.Scope{Methods: r.route.Methods, Tools: r.route.Tools}
	for _, c := range []struct {
		name  string
		check func([]byte) error
	}{
		{"raw", func(b []byte) error { _, err := scope.Check(b); return err }},
		{"lenient", rawroute.Lenient(r.route.Methods, r.route.Tools)},
	} {
		h, err := rawroute.Route{Path: r.route.Path, CallerAgentID: r.route.CallerAgentID, Upstream: s.URL, Token: standinToken, Check: c.check}.Handler()
		if err != nil {
			t.Fatal(err)
		}
		l := listen(t)
		rawroute.Serve(t, l, h)
		addrs = append(addrs, struct{ name, addr string }{c.name, l.Addr().String()})
	}
	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	for _, a := range addrs {
		sess, err := mcpstandin.Open(client, "http://"+a.addr+r.route.Path+"?callerAgentId="+r.route.CallerAgentID)
		if err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
		r.vias = append(r.vias, via{a.name, sess})
	}
	return r
}

// outcome is what one spelling did through one way.
type outcome struct {
	status int
	answer string
	ran    []mcpstandin.Run
	// outside are the runs outside the route: a tool not in its scope, or
	// another caller.
	outside []mcpstandin.Run
}

func (r *routes) send(v via, s respell.Spelling) (outcome, error) {
	if err := r.standIn.Reset(); err != nil {
		return outcome{}, err
	}
	status, answer, err := v.session.Post(s.ContentType, s.Body)
	if err != nil {
		return outcome{}, fmt.Errorf("%s via %s: %w", s.Name, v.name, err)
	}
	runs, err := r.standIn.Runs()
	if err != nil {
		return outcome{}, err
	}
	o := outcome{status: status, answer: string(answer), ran: runs}
	for _, run := range runs {
		if !slices.Contains(r.route.Tools, run.Tool) || run.CallerAgentID != r.route.CallerAgentID {
			o.outside = append(o.outside, run)
		}
	}
	return o, nil
}

// mustWin is, for each attacking family, the controls in which some
// spelling of it must run an out-of-scope tool: the key spellings get past
// encoding/json's reading only (Scope.Check refuses them itself); the
// charset tricks get past any check that ignores the charset the daemon
// then honours.
var mustWin = map[string][]string{
	"keys":      {"lenient"},
	"charset":   {"raw", "lenient"},
	"batch":     {"raw", "lenient"},
	"generated": {"raw", "lenient"},
}

func TestRespelledToolCallsAgainstStandIn(t *testing.T) {
	r := startRoutes(t)
	control := respell.Control()
	check := func(when string) {
		for _, v := range r.vias {
			o, err := r.send(v, control)
			if err != nil {
				t.Fatal(err)
			}
			if len(o.ran) != 1 || o.ran[0].Tool != respell.Cover || o.ran[0].CallerAgentID != r.route.CallerAgentID {
				t.Fatalf("%s: the plain in-scope call through %s ran %+v (status %d: %.300s)", when, v.name, o.ran, o.status, o.answer)
			}
		}
	}
	check("before the corpus")

	// served counts the spellings that ran an in-scope tool: the product
	// is not simply refusing everything.
	type tally struct{ wins, served, attempts int }
	counts := map[string]map[string]*tally{}
	for _, f := range respell.Families {
		counts[f] = map[string]*tally{}
		for _, v := range r.vias {
			counts[f][v.name] = &tally{}
		}
	}
	for _, s := range respell.All() {
		for _, v := range r.vias {
			o, err := r.send(v, s)
			if err != nil {
				t.Fatal(err)
			}
			c := counts[s.Family][v.name]
			c.attempts++
			if len(o.ran) > len(o.outside) {
				c.served++
			}
			if len(o.outside) > 0 {
				c.wins++
				if v.name == "product" {
					t.Errorf("%s/%s (Content-Type %q): through the product the stand-in ran %+v (status %d: %.300s)", s.Family, s.Name, s.ContentType, o.outside, o.status, o.answer)
				}
			}
		}
	}
	check("after the corpus")

	for _, f := range respell.Families {
		var line []string
		for _, v := range r.vias {
			c := counts[f][v.name]
			line = append(line, fmt.Sprintf("%s %d/%d (in scope %d)", v.name, c.wins, c.attempts, c.served))
		}
		t.Logf("%-10s out-of-scope runs: %s", f, strings.Join(line, ", "))
	}
	for _, f := range respell.Attacking {
		for _, v := range mustWin[f] {
			if counts[f][v].wins == 0 {
				t.Errorf("family %s never ran an out-of-scope tool through the %s control in %d attempts: the corpus proves nothing there", f, v, counts[f][v].attempts)
			}
		}
	}
}

// FuzzRouteAgainstStandIn sends what the fuzzer makes through the product
// proxy to the stand-in; the oracle is the stand-in: every tool it ran
// must be in the route's scope, for the route's caller.
func FuzzRouteAgainstStandIn(f *testing.F) {
	for _, s := range respell.All() {
		f.Add(s.ContentType, s.Body)
	}
	r := startRoutes(f)
	product := r.vias[0]
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		if !validHeaderValue(contentType) {
			return // no client can send it
		}
		o, err := r.send(product, respell.Spelling{Family: "fuzz", Name: "fuzz", ContentType: contentType, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.outside) > 0 {
			t.Fatalf("through the product the stand-in ran %+v (status %d: %.300s)", o.outside, o.status, o.answer)
		}
	})
}

// validHeaderValue: what net/http will send as a header value.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return strings.TrimSpace(v) == v
}
