package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemcp"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
)

// demoT is the demo's testnet.T: a failure ends the demo with that
// message (main recovers it) after the cleanups registered so far have
// run, last first, as a test's would.
type demoT struct{ cleanups []func() }

// failure is what demoT panics with.
type failure struct{ msg string }

func (*demoT) Helper()                        {}
func (*demoT) Fatal(a ...any)                 { panic(failure{fmt.Sprint(a...)}) }
func (*demoT) Fatalf(format string, a ...any) { panic(failure{fmt.Sprintf(format, a...)}) }
func (d *demoT) Cleanup(f func())             { d.cleanups = append(d.cleanups, f) }
func (d *demoT) fail(format string, a ...any) { d.Fatalf(format, a...) }
func (d *demoT) check(err error, what string) {
	if err != nil {
		d.Fatalf("%s: %v", what, err)
	}
}

func (d *demoT) close() {
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
	d.cleanups = nil
}

// metadataAddr is the cloud metadata service's address. The demo stands a
// server there on its decoy host, so an escape to it would be seen.
var metadataAddr = netip.MustParseAddr("169.254.169.254")

// world is the demo's network: an uplink namespace standing in for the
// host's network, the model host serving the fake model, and a decoy host
// with a server on its own address and one at the metadata address. None
// of it is the host's own namespace; all addresses are the demo's.
type world struct {
	net      *testnet.World
	model    *testnet.Host
	decoy    *testnet.Server
	metadata *testnet.Server
	// baseline is how many connections reachable made to each server.
	baseline map[*testnet.Server]int
	fm       *fakemodel.Server
	mcp      *mcpStandIn
	// ca signed the fake model's certificate; only the model route's
	// proxy is told to trust it.
	ca *fakemodel.TestCA
}

const modelHost = "llm.example.test"

func newWorld(t *demoT) *world {
	w := &world{net: testnet.New(t)}
	w.model = w.net.Host("model")
	decoyHost := w.net.Host("decoy")
	w.decoy = decoyHost.Serve(t, 8443, "decoy")
	w.net.Alias(decoyHost, metadataAddr)
	w.metadata = decoyHost.ServeAt(t, netip.AddrPortFrom(metadataAddr, 80), "metadata")
	w.mcp = newMCPStandIn(t)
	return w
}

// serveModel starts the fake model on the model host; its script names
// the world's addresses, so it comes after the world.
func (w *world) serveModel(t *demoT, script []fakemodel.Turn, apiKey string) {
	w.fm = fakemodel.New(fakemodel.Options{Script: script, APIKey: apiKey})
	var err error
	w.ca, err = fakemodel.NewTestCA(modelHost)
	t.check(err, "model test CA")
	l, err := w.model.Listen("tcp4", netip.AddrPortFrom(w.model.Addr, 8443).String())
	t.check(err, "model listener")
	go func() { _ = w.fm.ServeTLS(l, w.ca.Cert) }()
	t.Cleanup(func() { w.fm.Close() })
}

// modelURL is the model as the facts name it: https, which the model route
// (the key added outside the sandbox) requires.
func (w *world) modelURL() string { return "https://" + modelHost + ":8443/v1" }

// resolve pins the model's name to the model host, as the supervisor's
// resolver would pin it to what DNS says.
func (w *world) resolve(host string) ([]netip.Addr, error) {
	if host == modelHost {
		return []netip.Addr{w.model.Addr}, nil
	}
	return nil, fmt.Errorf("unknown host %s", host)
}

// reachable proves the decoy and the metadata stand-in answer from the
// uplink (where the sandbox's traffic goes), so that the sandbox failing
// to reach them is the policy, not a broken demo network.
func (w *world) reachable() error {
	for _, s := range []*testnet.Server{w.decoy, w.metadata} {
		c, err := testnet.DialFrom(w.net.Uplink, "tcp4", s.Addr.String(), 2*time.Second)
		if err != nil {
			return fmt.Errorf("%s at %s is not reachable from the uplink: %w", s.Banner, s.Addr, err)
		}
		c.Close()
	}
	// The servers count the connection asynchronously.
	for deadline := time.Now().Add(2 * time.Second); w.decoy.Conns() == 0 || w.metadata.Conns() == 0; {
		if time.Now().After(deadline) {
			return fmt.Errorf("the decoy servers did not count the uplink's connections")
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.baseline = map[*testnet.Server]int{w.decoy: w.decoy.Conns(), w.metadata: w.metadata.Conns()}
	return nil
}

// escapes is how many connections s accepted beyond reachable's own.
func (w *world) escapes(s *testnet.Server) int { return s.Conns() - w.baseline[s] }

// mcpStandIn is Paseo's /mcp/agents endpoint (fakemcp) on loopback: its
// catalog has a tool the reference scope allows (list_agents) and one it
// does not (create_agent), and it logs the tool calls it ran.
type mcpStandIn struct {
	*fakemcp.Daemon
	port  int
	token string
}

func newMCPStandIn(t *demoT) *mcpStandIn {
	token := "mcp-demo-" + randomHex(8)
	m := &mcpStandIn{Daemon: fakemcp.New(token, "agent-7f3c (this one)"), token: token}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	t.check(err, "MCP stand-in listener")
	m.port = l.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: m}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return m
}
