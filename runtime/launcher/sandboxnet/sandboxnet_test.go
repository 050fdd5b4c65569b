package sandboxnet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/nsutil"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
)

// These tests build real namespaces, veths and nftables rules (root is
// required; CI runs as root) and send traffic from the sandbox namespace
// with the kernel's own stack. The launcher tests repeat the reachability
// checks with runsc's netstack in the same namespace.

type fixture struct {
	world   *testnet.World
	allowed *testnet.Host
	decoy   *testnet.Host
	state   string
}

func newFixture(t *testing.T) *fixture {
	skip.UnlessRoot(t, "it creates network namespaces, veths and nftables rules")
	w := testnet.New(t)
	f := &fixture{world: w, allowed: w.Host("allowed"), decoy: w.Host("decoy"), state: t.TempDir()}
	return f
}

func (f *fixture) resolver(names map[string][]netip.Addr) Resolver {
	return func(_ context.Context, host string) ([]netip.Addr, error) {
		if a, ok := names[host]; ok {
			return a, nil
		}
		return nil, fmt.Errorf("no such host %s", host)
	}
}

func (f *fixture) config(id string, rules []bundle.EgressRule, routes []bundle.Route) Config {
	return Config{ID: id, StateDir: f.state, Uplink: f.world.Uplink,
		Egress:  bundle.Egress{Mode: "sandbox", Default: "deny", DNS: "pinned", Rules: rules, Routes: routes},
		Resolve: f.resolver(map[string][]netip.Addr{"model.test": {f.allowed.Addr}})}
}

func dial(t *testing.T, n *Network, addr netip.AddrPort) (string, error) {
	t.Helper()
	return dialTimeout(n, addr, 700*time.Millisecond)
}

// reach is dial for destinations that must answer: a loaded machine gets
// three tries of two seconds (a blocked destination fails every one).
func reach(t *testing.T, n *Network, addr netip.AddrPort) (string, error) {
	t.Helper()
	var got string
	var err error
	for i := 0; i < 3; i++ {
		if got, err = dialTimeout(n, addr, 2*time.Second); err == nil {
			return got, nil
		}
	}
	return got, err
}

func dialTimeout(n *Network, addr netip.AddrPort, d time.Duration) (string, error) {
	c, err := testnet.DialFrom(n.NetnsPath, "tcp4", addr.String(), d)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestEgressAllowsExactlyTheRules(t *testing.T) {
	f := newFixture(t)
	allowed := f.allowed.Serve(t, 8443, "allowed")
	otherPort := f.allowed.Serve(t, 9000, "allowed-other-port")
	decoy := f.decoy.Serve(t, 8443, "decoy")

	n, err := Setup(context.Background(), f.config("sbx-egress", []bundle.EgressRule{
		{Proto: "tcp", Host: "model.test", Port: 8443, Purpose: "model", Fact: "model.baseURL"},
	}, []bundle.Route{{Purpose: "mcp", Listen: "gateway", Port: 6767, Method: "POST", Path: "/mcp/agents"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.Teardown(); err != nil {
			t.Error(err)
		}
	}()

	if got, err := reach(t, n, allowed.Addr); err != nil || got != "allowed" {
		t.Errorf("allowed destination: got %q, %v; want the banner", got, err)
	}
	for name, s := range map[string]*testnet.Server{"other port": otherPort, "decoy": decoy} {
		if _, err := dial(t, n, s.Addr); err == nil {
			t.Errorf("%s %s reachable from the sandbox", name, s.Addr)
		}
		if s.Conns() != 0 {
			t.Errorf("%s saw %d connections", name, s.Conns())
		}
	}

	// The gateway (the uplink host itself) answers only on route ports.
	proxy, err := n.ListenGateway(6767)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	go func() {
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "proxy")
			c.Close()
		}
	}()
	if got, err := reach(t, n, netip.AddrPortFrom(n.Gateway, 6767)); err != nil || got != "proxy" {
		t.Errorf("route port on the gateway: got %q, %v", got, err)
	}
	hostSSH, err := f.world.ListenUplink("tcp4", netip.AddrPortFrom(n.Gateway, 22).String())
	if err != nil {
		t.Fatal(err)
	}
	defer hostSSH.Close()
	if _, err := dial(t, n, netip.AddrPortFrom(n.Gateway, 22)); err == nil {
		t.Error("a non-route port on the gateway is reachable")
	}
	if _, err := dial(t, n, netip.AddrPortFrom(f.allowed.Gateway, 8443)); err == nil {
		t.Error("another uplink address is reachable")
	}

	// Nothing outside may open a connection into the sandbox.
	inside, err := listenIn(n.NetnsPath, netip.AddrPortFrom(n.Address, 7000))
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if c, err := f.allowed.Dial("tcp4", netip.AddrPortFrom(n.Address, 7000).String(), 700*time.Millisecond); err == nil {
		c.Close()
		t.Error("the allowed host opened a connection into the sandbox")
	}

	counts, err := n.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{TagAllowPrefix + "model", TagEgressDrop, TagGatewayDrop, TagRoutePrefix + "6767", TagInboundDrop} {
		if counts[tag] == 0 {
			t.Errorf("counter %s is 0; counters: %v", tag, counts)
		}
	}
}

func listenIn(nsPath string, addr netip.AddrPort) (net.Listener, error) {
	fd, err := nsutil.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var l net.Listener
	err = nsutil.Do(fd, func() error {
		var err error
		l, err = net.Listen("tcp4", addr.String())
		return err
	})
	return l, err
}

func TestTeardownRemovesEverything(t *testing.T) {
	f := newFixture(t)
	n, err := Setup(context.Background(), f.config("sbx-teardown", []bundle.EgressRule{
		{Proto: "tcp", Host: f.allowed.Addr.String(), Port: 443, Purpose: "model"},
	}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Teardown(); err != nil {
		t.Fatal(err)
	}
	f.assertGone(t, "sbx-teardown")
}

// assertGone checks that no table, link, namespace or lease of id is left.
func (f *fixture) assertGone(t *testing.T, id string) {
	t.Helper()
	peer, _, table := Names(id)
	for _, left := range testnet.Leftovers(t, f.world.Uplink, peer, table) {
		t.Errorf("%s left behind", left)
	}
	if _, err := os.Stat(NetnsPath(f.state, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file left behind: %v", err)
	}
	leases, _ := Leases(LeaseDir(f.state))
	for _, owner := range leases {
		if owner == id {
			t.Errorf("lease of %s left behind", id)
		}
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name  string
		host  string
		names map[string][]netip.Addr
		want  string
	}{
		{"loopback name", "evil.test", map[string][]netip.Addr{"evil.test": {netip.MustParseAddr("127.0.0.1")}}, "loopback"},
		{"metadata literal", "169.254.169.254", nil, "unsafe destination"},
		{"link-local literal", "169.254.7.7", nil, "link-local"},
		{"mapped metadata literal", "::ffff:169.254.169.254", nil, "metadata"},
		// Names resolved on the trusted side are classified too: a public
		// looking name bound to the metadata service, the Alibaba one
		// outside link-local space, multicast, the unspecified address.
		{"name to metadata", "meta.test", map[string][]netip.Addr{"meta.test": {netip.MustParseAddr("192.0.2.80"), netip.MustParseAddr("169.254.169.254")}}, "metadata"},
		{"name to alibaba metadata", "ali.test", map[string][]netip.Addr{"ali.test": {netip.MustParseAddr("100.100.100.200")}}, "metadata"},
		{"name to mapped loopback", "mapped.test", map[string][]netip.Addr{"mapped.test": {netip.MustParseAddr("::ffff:127.0.0.1")}}, "loopback"},
		{"name to unspecified", "zero.test", map[string][]netip.Addr{"zero.test": {netip.MustParseAddr("0.0.0.0")}}, "unspecified"},
		{"name to multicast", "mc.test", map[string][]netip.Addr{"mc.test": {netip.MustParseAddr("224.0.0.251")}}, "multicast"},
		// Refused before resolution, whatever the resolver would say.
		{"metadata name", "metadata.google.internal", map[string][]netip.Addr{"metadata.google.internal": {netip.MustParseAddr("192.0.2.80")}}, "metadata"},
		{"localhost name", "localhost", map[string][]netip.Addr{"localhost": {netip.MustParseAddr("192.0.2.80")}}, "loopback"},
		{"hex notation", "0x7f.1", map[string][]netip.Addr{"0x7f.1": {netip.MustParseAddr("192.0.2.80")}}, "non-canonical"},
		{"decimal notation", "3221225552", map[string][]netip.Addr{"3221225552": {netip.MustParseAddr("192.0.2.80")}}, "non-canonical"},
		{"unresolvable", "nowhere.test", nil, "resolving egress host"},
		{"ipv6 only", "v6.test", map[string][]netip.Addr{"v6.test": {netip.MustParseAddr("2001:db8::1")}}, "no IPv4 address"},
		{"inside the pool", "10.213.0.9", nil, "inside the sandbox address pool"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("sbx-refuse-%d", i)
			cfg := f.config(id, []bundle.EgressRule{{Proto: "tcp", Host: tc.host, Port: 443, Purpose: "model"}}, nil)
			cfg.Resolve = f.resolver(tc.names)
			_, err := Setup(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			f.assertGone(t, id)
		})
	}
}

func TestRefusesWithoutForwarding(t *testing.T) {
	f := newFixture(t)
	fd, err := nsutil.Open(f.world.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := nsutil.Sysctl(fd, "ipv4/ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	_, err = Setup(context.Background(), f.config("sbx-nofwd", []bundle.EgressRule{{Proto: "tcp", Host: f.allowed.Addr.String(), Port: 443, Purpose: "model"}}, nil))
	if err == nil || !strings.Contains(err.Error(), "ip_forward") {
		t.Fatalf("got %v, want a forwarding refusal", err)
	}
	f.assertGone(t, "sbx-nofwd")
	// Without egress rules (routes only) no forwarding is needed.
	n, err := Setup(context.Background(), f.config("sbx-routes-only", nil, []bundle.Route{{Purpose: "mcp", Listen: "gateway", Port: 6767}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Teardown(); err != nil {
		t.Fatal(err)
	}
}

func TestDuplicateIDLeavesTheFirstIntact(t *testing.T) {
	f := newFixture(t)
	s := f.allowed.Serve(t, 8443, "allowed")
	cfg := f.config("sbx-dup", []bundle.EgressRule{{Proto: "tcp", Host: f.allowed.Addr.String(), Port: 8443, Purpose: "model"}}, nil)
	first, err := Setup(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Teardown()
	if _, err := Setup(context.Background(), cfg); err == nil {
		t.Fatal("a second network with the same id was created")
	}
	if got, err := reach(t, first, s.Addr); err != nil || got != "allowed" {
		t.Fatalf("first sandbox lost its network after a duplicate setup: %q, %v", got, err)
	}
}

func TestHostsPinsExactlyTheResolvedNames(t *testing.T) {
	n := &Network{Gateway: netip.MustParseAddr("10.213.0.1"),
		Pins: []Pin{{Host: "model.test", Addrs: []netip.Addr{netip.MustParseAddr("10.77.1.2"), netip.MustParseAddr("10.77.1.3")}}}}
	compiled := "# generated\n127.0.0.1\tlocalhost\n# pin: model.test"
	got, err := n.Hosts([]byte(compiled), &bundle.Gateway{Name: "paseo-gateway"})
	if err != nil {
		t.Fatal(err)
	}
	want := "# generated\n127.0.0.1\tlocalhost\n# pin: model.test\n10.77.1.2\tmodel.test\n10.77.1.3\tmodel.test\n10.213.0.1\tpaseo-gateway\n"
	if string(got) != want {
		t.Errorf("hosts:\n%s\nwant:\n%s", got, want)
	}
	// The gateway is named by egress.json only: a comment in the compiled
	// file (a bundle from before) pins nothing.
	got, err = n.Hosts([]byte(compiled+"\n# gateway: paseo-gateway\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(got), "10.213.0.1") {
		t.Errorf("a gateway was pinned with none named:\n%s", got)
	}
	if _, err := n.Hosts([]byte("# pin: other.test\n"), nil); err == nil {
		t.Error("a marker without a resolved name was accepted")
	}
	if _, err := n.Hosts([]byte("127.0.0.1 localhost\n"), nil); err == nil {
		t.Error("a resolved name without a marker was accepted")
	}
}

// A port the launcher serves on the gateway beside the routes (the
// workspace monitor's, Config.GatewayPorts) is admitted from its own
// sandbox only. Two sandboxes each serve the same port number on their
// own gateway: each reaches its own, and B does not reach A's. The
// control deletes B's table (B's own rules are what stop it: A's are keyed
// on A's interface) and B then reaches A's port.
func TestGatewayPortsAdmitTheirSandboxOnly(t *testing.T) {
	f := newFixture(t)
	const port = 18090
	cfg := func(id string) Config {
		c := f.config(id, nil, nil)
		c.GatewayPorts = []int{port}
		return c
	}
	a, err := Setup(context.Background(), cfg("sbx-gwport-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Teardown()
	b, err := Setup(context.Background(), cfg("sbx-gwport-b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Teardown()
	for _, n := range []*Network{a, b} {
		ln, err := n.ListenGateway(port)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		banner := n.Inner
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, banner)
				c.Close()
			}
		}()
	}
	if got, err := reach(t, a, netip.AddrPortFrom(a.Gateway, port)); err != nil || got != a.Inner {
		t.Errorf("A to its own gateway port: %q, %v", got, err)
	}
	if got, err := reach(t, b, netip.AddrPortFrom(b.Gateway, port)); err != nil || got != b.Inner {
		t.Errorf("B to its own gateway port: %q, %v", got, err)
	}
	if got, err := dial(t, b, netip.AddrPortFrom(a.Gateway, port)); err == nil {
		t.Errorf("B reached A's gateway port: %q", got)
	}
	if counts, err := b.Counters(); err != nil || counts[TagGatewayDrop] == 0 || counts[fmt.Sprintf("%s%d", TagRoutePrefix, port)] == 0 {
		t.Errorf("B's counters: %v, %v", counts, err)
	}

	// Control: without B's table nothing stops it.
	fd, err := nsutil.Open(f.world.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	if err := deleteTable(c, b.Table); err != nil {
		t.Fatal(err)
	}
	if got, err := reach(t, b, netip.AddrPortFrom(a.Gateway, port)); err != nil || got != a.Inner {
		t.Errorf("control: without B's table, B to A's gateway port: %q, %v; want A's banner", got, err)
	}
}

// A gateway port a route already has, or out of range, fails Setup and
// leaves nothing behind.
func TestGatewayPortsRefused(t *testing.T) {
	f := newFixture(t)
	for i, ports := range [][]int{{6767}, {0}, {70000}} {
		id := fmt.Sprintf("sbx-gwport-bad-%d", i)
		c := f.config(id, nil, []bundle.Route{{Purpose: "mcp", Listen: "gateway", Port: 6767}})
		c.GatewayPorts = ports
		if _, err := Setup(context.Background(), c); err == nil || !strings.Contains(err.Error(), "gateway port") {
			t.Errorf("ports %v: %v, want a refusal", ports, err)
		}
		f.assertGone(t, id)
	}
}
