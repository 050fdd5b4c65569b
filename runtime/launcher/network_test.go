package launcher

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// In sandbox mode runsc's netstack reaches exactly the compiled egress: the
// model host by its pinned name, nothing else on the model host, no decoy,
// no service of the uplink host, not the launcher's loopback, and nothing
// outside can connect in. The servers are the test's own, in its own
// namespaces, on addresses it assigns.
func TestLaunchSandboxNetwork(t *testing.T) {
	world := testnet.New(t)
	model, decoy := world.Host("model"), world.Host("decoy")
	allowed := model.Serve(t, 8443, "model-banner")
	otherPort := model.Serve(t, 9000, "model-other-port")
	decoySrv := decoy.Serve(t, 8443, "decoy-banner")
	hostSvc, err := world.ListenUplink("tcp4", netip.AddrPortFrom(model.Gateway, 2222).String())
	if err != nil {
		t.Fatal(err)
	}
	defer hostSvc.Close()
	loop, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Close()
	var loopConns atomic.Int32
	go func() {
		for {
			c, err := loop.Accept()
			if err != nil {
				return
			}
			loopConns.Add(1)
			fmt.Fprintln(c, "launcher-loopback")
			c.Close()
		}
	}()

	nc := func(name, addr string, port int) string {
		return fmt.Sprintf("echo hi | /bin/busybox timeout 4 /bin/busybox nc -w 2 %s %d | /bin/busybox grep -q . && echo %s=reached || echo %s=blocked\n", addr, port, name, name)
	}
	script := "/bin/busybox grep -q '^" + model.Addr.String() + "\tllm.example.test$' /etc/hosts && echo pinned=yes\n" +
		"(echo inside | /bin/busybox nc -l -p 7000 >/dev/null 2>&1 &)\n" +
		"echo hi | /bin/busybox timeout 4 /bin/busybox nc -w 2 llm.example.test 8443\n" +
		nc("other-port", model.Addr.String(), 9000) +
		nc("decoy", decoy.Addr.String(), 8443) +
		nc("uplink-host", model.Gateway.String(), 2222) +
		nc("loopback", "127.0.0.1", loop.Addr().(*net.TCPAddr).Port) +
		"/bin/busybox sleep 3\n"
	s := compileScriptFacts(t, script, `{"network":{"mode":"sandbox"}}`, directModel)
	s.uplink = world.Uplink
	s.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "llm.example.test" {
			return []netip.Addr{model.Addr}, nil
		}
		return nil, fmt.Errorf("unknown host %s", host)
	}
	var inbound atomic.Bool
	s.onNetwork = func(n *sandboxnet.Network) {
		target := netip.AddrPortFrom(n.Address, 7000).String()
		go func() {
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
				if c, err := model.Dial("tcp4", target, 300*time.Millisecond); err == nil {
					c.Close()
					inbound.Store(true)
				}
			}
		}()
	}
	res, out, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatalf("launch: %v\nstderr: %s", err, stderr)
	}
	for _, want := range []string{"pinned=yes", "model-banner", "other-port=blocked", "decoy=blocked", "uplink-host=blocked", "loopback=blocked"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr: %s", want, out, stderr)
		}
	}
	if allowed.Conns() == 0 {
		t.Error("the model host saw no connection")
	}
	if otherPort.Conns()+decoySrv.Conns() != 0 || loopConns.Load() != 0 {
		t.Errorf("blocked servers saw connections: other-port %d decoy %d loopback %d", otherPort.Conns(), decoySrv.Conns(), loopConns.Load())
	}
	if inbound.Load() {
		t.Error("a test host opened a connection into the sandbox")
	}
	for _, tag := range []string{sandboxnet.TagAllowPrefix + "model", sandboxnet.TagEgressDrop, sandboxnet.TagGatewayDrop, sandboxnet.TagInboundDrop} {
		if res.Packets[tag] == 0 {
			t.Errorf("packet counter %s is 0: %v", tag, res.Packets)
		}
	}
	s.assertClean(t)
}

// Network mode none: the sandbox has loopback only; a test host that a
// sandbox-mode bundle could reach is unreachable, and no interface but lo
// exists.
func TestLaunchNetworkNone(t *testing.T) {
	world := testnet.New(t)
	model := world.Host("model")
	srv := model.Serve(t, 8443, "model-banner")
	script := "/bin/busybox ip -o link | /bin/busybox grep -v ': lo:' | /bin/busybox grep -q . && echo links=more || echo links=lo-only\n" +
		"echo hi | /bin/busybox timeout 4 /bin/busybox nc -w 2 " + model.Addr.String() + " 8443 | /bin/busybox grep -q . && echo model=reached || echo model=blocked\n"
	s := compileScript(t, script, "")
	s.uplink = world.Uplink
	_, out, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	for _, want := range []string{"links=lo-only", "model=blocked"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\n%s", want, out, stderr)
		}
	}
	if srv.Conns() != 0 {
		t.Error("a network-none sandbox reached the test host")
	}
	s.assertClean(t)
}

// DNS mode resolver: the sandbox resolves names through the one configured
// resolver (UDP 53 allowed to it alone); another resolver is unreachable,
// and a name it resolves still cannot be connected to unless an egress
// rule allows the address.
func TestLaunchResolverDNS(t *testing.T) {
	world := testnet.New(t)
	model, dnsHost, decoy := world.Host("model"), world.Host("dns"), world.Host("decoy")
	model.Serve(t, 8443, "model-banner")
	decoySrv := decoy.Serve(t, 8443, "decoy-banner")
	names := map[string]netip.Addr{"llm.example.test": model.Addr, "decoy.test": decoy.Addr}
	resolver := dnsHost.ServeDNS(t, names)
	rogue := decoy.ServeDNS(t, names)

	script := "/bin/busybox nslookup decoy.test && echo resolver=answered || echo resolver=silent\n" +
		"/bin/busybox nslookup decoy.test " + decoy.Addr.String() + " >/dev/null 2>&1 && echo rogue=answered || echo rogue=silent\n" +
		"echo hi | /bin/busybox timeout 4 /bin/busybox nc -w 2 decoy.test 8443 | /bin/busybox grep -q . && echo decoy=reached || echo decoy=blocked\n" +
		"echo hi | /bin/busybox timeout 4 /bin/busybox nc -w 2 llm.example.test 8443\n"
	s := compileScriptFacts(t, script, `{"network":{"mode":"sandbox","dns":"resolver","resolver":"`+dnsHost.Addr.String()+`"}}`, directModel)
	s.uplink = world.Uplink
	s.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		if a, ok := names[host]; ok {
			return []netip.Addr{a}, nil
		}
		return nil, fmt.Errorf("unknown host %s", host)
	}
	_, out, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	for _, want := range []string{"resolver=answered", decoy.Addr.String(), "rogue=silent", "decoy=blocked", "model-banner"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr: %s", want, out, stderr)
		}
	}
	if resolver.Queries() == 0 || rogue.Queries() != 0 || decoySrv.Conns() != 0 {
		t.Errorf("resolver saw %d queries, rogue %d, decoy %d connections", resolver.Queries(), rogue.Queries(), decoySrv.Conns())
	}
	s.assertClean(t)
}

// The private MCP route: Pi's MCP config (compiled to name the gateway,
// with no bearer) leads the sandbox to the daemon's loopback-only endpoint
// through the launcher's proxy, for its own agent id, POST only and inside
// the MCP scope; the proxy adds the bearer it read from mcp.tokenRef (no
// daemon here: paseo-policy launch's way) and refuses one the sandbox
// sends. The daemon sees exactly the one allowed request, with the token,
// which the sandbox itself never holds.
func TestLaunchMCPRoute(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`)
	}))
	defer daemon.Close()
	port := daemon.Listener.Addr().(*net.TCPAddr).Port
	world := testnet.New(t)
	model := world.Host("model")

	bb := "/bin/busybox "
	// The profile's mcp-config slot appends "--mcp-config PATH": $1 and $2.
	script := "[ \"$1\" = --mcp-config ] || exit 9; CFG=$2\n" +
		"URL=$(" + bb + "sed -n 's/.*\"url\": \"\\(.*\\)\",/\\1/p' $CFG)\n" +
		"echo url=$URL\n" +
		"JSON='Content-Type: application/json'\n" +
		bb + "wget -q -O - --header \"$JSON\" --post-data '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}' \"$URL\" && echo; echo mcp=done\n" +
		bb + "wget -q -O - --header \"$JSON\" --header 'Authorization: Bearer guessed' --post-data '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}' \"$URL\" || echo bearer=refused\n" +
		bb + "wget -q -O - --header \"$JSON\" --post-data '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"create_agent\"}}' \"$URL\"; echo; echo scope=done\n" +
		bb + "wget -q -O - --header \"$JSON\" --post-data '{}' \"${URL%=*}=agent-other\" || echo other=refused\n" +
		bb + "wget -q -O - \"$URL\" || echo get=refused\n" +
		// The token's text is assembled so that the script itself (in
		// argv and config.json) does not hold it.
		"T=run-; T=${T}token\n" +
		"if " + bb + "grep -rqs \"$T\" $CFG /proc/$$/environ /proc/$$/cmdline /etc /home /tmp; then echo token=inside; else echo token=absent; fi\n"
	sc := testbundle.New(t, testbundle.Options{Argv: append(testbundle.Script(script), "mcp-test", "slot:mcp-config"),
		RegistryPatch: `{"network":{"mode":"sandbox"}}`,
		FactsPatch:    fmt.Sprintf(`{"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, port)})
	s := &sandbox{host: sc.Host, bundle: sc.Bundle, state: sc.State, runsc: sc.Runsc, uplink: world.Uplink,
		resolve: func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{model.Addr}, nil }}
	secrets := func(deployment, ref string) ([]byte, error) {
		if deployment == "host-alice" && ref == "paseo/mcp-token" {
			return []byte("run-token"), nil
		}
		return staticSecret("v")(deployment, ref)
	}
	res, out, stderr, err := s.launch(t, secrets)
	if err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	wantURL := fmt.Sprintf("url=http://paseo-gateway:%d/mcp/agents?callerAgentId=agent-7f3c", port)
	for _, want := range []string{wantURL, `"tools":[]`, "mcp=done", "bearer=refused", "outside the sandbox's MCP scope", "scope=done", "other=refused", "get=refused", "token=absent"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr: %s", want, out, stderr)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "POST /mcp/agents?callerAgentId=agent-7f3c Bearer run-token" {
		t.Errorf("the daemon saw %q", seen)
	}
	if st := res.Routes["mcp"]; st.Forwarded != 1 || st.Refused != 4 || st.OutOfScope != 1 {
		t.Errorf("route stats %+v", res.Routes)
	}
	if err := filepath.WalkDir(sc.Bundle, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), "run-token") {
				t.Errorf("the bundle's %s holds the token", p)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	s.assertClean(t)
}
