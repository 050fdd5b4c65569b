package sandboxnet

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
)

// holdOpen opens a connection from the sandbox and reads the banner, so
// the connection is established (and counted) when it returns.
func holdOpen(n *Network, s *testnet.Server) (net.Conn, error) {
	c, err := testnet.DialFrom(n.NetnsPath, "tcp4", s.Addr.String(), 700*time.Millisecond)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// A sandbox holding its cap of live connections gets no further one,
// while a neighbour reaching the same allowed host and port is served;
// closing one of its own connections gives the sandbox room again.
func TestConnectionCapIsPerSandbox(t *testing.T) {
	f := newFixture(t)
	s := f.allowed.Serve(t, 8443, "allowed")
	rules := []bundle.EgressRule{{Proto: "tcp", Host: f.allowed.Addr.String(), Port: 8443, Purpose: "model"}}
	const limit = 8
	setup := func(id string) *Network {
		cfg := f.config(id, rules, nil)
		cfg.Caps = Caps{Conns: limit, NewPerMinute: 6000, Burst: 1000}
		n, err := Setup(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := n.Teardown(); err != nil {
				t.Error(err)
			}
		})
		return n
	}
	flooder, neighbour := setup("sbx-cap-flood"), setup("sbx-cap-neighbour")

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for i := 0; i < 3*limit; i++ {
		c, err := holdOpen(flooder, s)
		if err != nil {
			refused++
			continue
		}
		held = append(held, c)
	}
	if len(held) != limit || refused != 2*limit {
		t.Fatalf("flooding sandbox holds %d connections (%d refused); want exactly the cap %d", len(held), refused, limit)
	}
	counts, err := flooder.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if counts[TagConnLimit] == 0 {
		t.Errorf("counter %s is 0 after %d refused connections; counters: %v", TagConnLimit, refused, counts)
	}
	if got, err := reach(t, neighbour, s.Addr); err != nil || got != "allowed" {
		t.Errorf("neighbour of a flooding sandbox: got %q, %v; want the banner", got, err)
	}
	// The cap is on live connections, not a budget: one closed, one more.
	held[0].Close()
	held = held[1:]
	var c net.Conn
	for i := 0; i < 10 && c == nil; i++ {
		c, _ = holdOpen(flooder, s)
		time.Sleep(100 * time.Millisecond)
	}
	if c == nil {
		t.Error("after closing one of its connections the sandbox still cannot open one")
	} else {
		held = append(held, c)
	}
}

// Opening connections faster than the rate is refused even when each is
// closed at once, and a neighbour is still served.
func TestNewConnectionRateIsPerSandbox(t *testing.T) {
	f := newFixture(t)
	s := f.allowed.Serve(t, 8443, "allowed")
	rules := []bundle.EgressRule{{Proto: "tcp", Host: f.allowed.Addr.String(), Port: 8443, Purpose: "model"}}
	cfg := f.config("sbx-rate-flood", rules, nil)
	// A minute's rate of 1 with a burst of 5: the burst is all a quick
	// loop can get, whatever the machine's load.
	cfg.Caps = Caps{Conns: 1000, NewPerMinute: 1, Burst: 5}
	n, err := Setup(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Teardown()
	nb, err := Setup(context.Background(), f.config("sbx-rate-neighbour", rules, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Teardown()

	won := 0
	for i := 0; i < 20; i++ {
		if got, err := dial(t, n, s.Addr); err == nil && strings.TrimSpace(got) == "allowed" {
			won++
		}
	}
	if won == 0 || won > 6 {
		t.Errorf("%d of 20 quick connections got through; want the burst (5, give or take the first token)", won)
	}
	counts, err := n.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if counts[TagConnRate] == 0 {
		t.Errorf("counter %s is 0; counters: %v", TagConnRate, counts)
	}
	if got, err := reach(t, nb, s.Addr); err != nil || got != "allowed" {
		t.Errorf("neighbour of a fast-connecting sandbox: got %q, %v", got, err)
	}
}
