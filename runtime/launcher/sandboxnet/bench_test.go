package sandboxnet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
)

// BenchmarkSetup times Setup and Teardown of one sandbox network (fresh
// netns, veth pair with its peer in the uplink, addresses and default
// route, nftables table) separately, in a private test world, with the
// egress of a reference bundle: one tcp rule to a test host (by name,
// pinned through an in-process resolver: no DNS is timed) and one gateway
// route. setup-ns and teardown-ns are means per iteration; ns/op is both.
// It is a measurement for make bench-launch; `go test` without -bench
// skips it.
func BenchmarkSetup(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("sandboxnet benchmarks create network namespaces and need root")
	}
	world := testnet.New(b)
	model := world.Host("model")
	state := b.TempDir()
	cfg := func(id string) Config {
		return Config{ID: id, StateDir: state, Uplink: world.Uplink,
			Egress: bundle.Egress{Mode: "sandbox", Default: "deny", DNS: "pinned",
				Rules:  []bundle.EgressRule{{Proto: "tcp", Host: "llm.example.test", Port: 8443, Purpose: "model", Fact: "model.baseURL"}},
				Routes: []bundle.Route{{Purpose: "mcp", Listen: "gateway", Port: 6767, Method: "POST", Path: "/mcp/agents"}}},
			Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
				if host == "llm.example.test" {
					return []netip.Addr{model.Addr}, nil
				}
				return nil, fmt.Errorf("unknown host %s", host)
			}}
	}
	cycle := func(id string) (setup, teardown time.Duration) {
		t0 := time.Now()
		n, err := Setup(context.Background(), cfg(id))
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		err = n.Teardown()
		t2 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		return t1.Sub(t0), t2.Sub(t1)
	}
	// One untimed cycle first: the first table and veth in a fresh uplink
	// pay one-time costs (nf_tables and veth state in the namespace) that a
	// long-running host has paid already.
	cycle(fmt.Sprintf("bench-%d-warm", os.Getpid()))

	var setup, teardown time.Duration
	n := 0
	for b.Loop() {
		s, t := cycle(fmt.Sprintf("bench-%d-%d", os.Getpid(), n))
		setup, teardown = setup+s, teardown+t
		n++
	}
	b.ReportMetric(float64(setup.Nanoseconds())/float64(n), "setup-ns")
	b.ReportMetric(float64(teardown.Nanoseconds())/float64(n), "teardown-ns")
}
