package acceptance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// A neighbouring sandbox
//
// Sandbox B (the victim) runs beside sandbox A (the attacker) on the same
// uplink, from the same launcher state, as two agents of one deployment
// do. B listens on a port of its own address and has its own gateway with
// its own route proxy. A tries to reach B's address, B's gateway (a host
// service listening on every uplink address) and B's route proxy, and to
// see B's processes.
//
// Controls: the network attacks run again with both sandboxes' nftables
// tables deleted (the same topology with nothing filtering), and the
// process attack runs A and B as plain host processes, where /proc shows
// every process; each must win there.

func init() { registerOutside("neighbour", neighbourAttacks) }

// neighbourPool holds two sandbox links (/30 each), apart from the scene's
// one-link pool; both launches share one state root so their leases do not
// collide.
var neighbourPool = netip.MustParsePrefix("10.213.82.0/29")

const (
	neighbourPort     = 7000 // B's own listener, inside B
	neighbourAttempts = 3    // per target and side
)

// neighbourTarget is one thing A aims at.
type neighbourTarget struct {
	name, goal, host string
	port             int
}

func neighbourAttacks(t *testing.T, s *scene) []OutsideAttack {
	token := randomHex(8)
	state := filepath.Join(t.TempDir(), "state")

	// B: a listener on its own address and a process whose argv carries
	// the token (the "; :" keeps sh from exec'ing sleep over its argv);
	// it runs until the attacks are done.
	ready := filepath.Join(s.workspace, ".neighbour-ready-"+token)
	defer os.Remove(ready)
	bScript := fmt.Sprintf("/bin/busybox sh -c 'sleep 3600; :' neighbour-%s & (/bin/busybox sleep 1; /bin/busybox touch %s) & exec /bin/busybox nc -ll -p %d -e /bin/busybox echo neighbour", token, ready, neighbourPort)
	b := s.compile(t, testbundle.Script(bScript), "")
	bNet := make(chan *sandboxnet.Network, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, _ = s.launchWith(ctx, t, b, state, func(n *sandboxnet.Network) { bNet <- n })
	}()
	defer func() { cancel(); wg.Wait() }()
	var nb *sandboxnet.Network
	select {
	case nb = <-bNet:
	case <-time.After(60 * time.Second):
		t.Fatal("neighbour sandbox B never got its network")
	}
	routePort := firstRoutePort(t, b.Bundle)
	waitFile(t, ready, 60*time.Second)

	targets := []neighbourTarget{
		{"neighbour-reaches-sandbox-address", "open a connection to a port B listens on at B's own address", nb.Address.String(), neighbourPort},
		{"neighbour-reaches-gateway", "open a connection to a host service through B's gateway address", nb.Gateway.String(), 2222},
		{"neighbour-reaches-route-proxy", "open a connection to B's route proxy (B's caller id toward the daemon)", nb.Gateway.String(), routePort},
	}
	pattern := "neighbou[r]-" + token // matches B's argv, not A's own
	// A first shows that its tools work where it is allowed to go (its
	// model endpoint, its own process): a miss against B then means B was
	// out of reach, not that nc or /proc were broken.
	self := fmt.Sprintf("/bin/busybox sh -c 'sleep 60; :' self-%s & /bin/busybox sleep 0.3; ", token)
	sanity := []neighbourTarget{{name: "sanity-model", host: "llm.example.test", port: 8443}}
	script := self + attackerScript(append(sanity, targets...), pattern) + "; " +
		"if /bin/busybox grep -qs 'sel[f]-" + token + "' /proc/[0-9]*/cmdline; then echo 'WIN sanity-self'; else echo 'MISS sanity-self'; fi"

	// Contained: A with the product's filter, B's filter in place.
	a := s.compile(t, testbundle.Script(script), "")
	_, out, _ := s.launchWith(context.Background(), t, a, state, nil)
	contained := tallyLines(out)

	// Control: the same topology with nothing filtering.
	deleteTable(t, s.world.Uplink, nb.Table)
	_, out, _ = s.launchWith(context.Background(), t, a, state, func(n *sandboxnet.Network) { deleteTable(t, s.world.Uplink, n.Table) })
	control := tallyLines(out)

	var attacks []OutsideAttack
	for _, tg := range targets {
		attacks = append(attacks, OutsideAttack{Name: tg.name, Attacker: "neighbour-sandbox", Goal: tg.goal,
			Control:   "both sandboxes' nftables tables deleted: the same links and routes with no filter",
			Contained: contained[tg.name], ControlRun: control[tg.name]})
	}
	attacks = append(attacks, OutsideAttack{Name: "neighbour-sees-processes", Attacker: "neighbour-sandbox",
		Goal:      "find B's process (its argv) from inside A, the precondition for signalling or reading it",
		Control:   "A and B as plain host processes: one pid namespace, one /proc",
		Contained: contained["neighbour-sees-processes"], ControlRun: hostProcessControl(t, token, pattern)})
	// Without working tools in A, a miss proves nothing: such an attack is
	// reported as not attempted, which the verdict treats as unproven.
	for i := range attacks {
		check := "sanity-model"
		if attacks[i].Name == "neighbour-sees-processes" {
			check = "sanity-self"
		}
		if ok := contained[check]; ok.Wins == 0 {
			attacks[i].Contained = Tally{}
			attacks[i].Evidence = "the attacker's own " + check + " check failed, so its misses prove nothing"
			continue
		}
		attacks[i].Evidence = "the attacker reached its own model endpoint and saw its own processes in the same run"
	}
	return attacks
}

// attackerScript tries each target neighbourAttempts times and looks for
// B's processes as often, printing "WIN name" or "MISS name" per attempt.
func attackerScript(targets []neighbourTarget, pattern string) string {
	var b strings.Builder
	b.WriteString("try() { i=0; while [ $i -lt " + fmt.Sprint(neighbourAttempts) + " ]; do ")
	b.WriteString("if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 1 $2 $3 >/dev/null 2>&1; then echo \"WIN $1\"; else echo \"MISS $1\"; fi; i=$((i+1)); done; }; ")
	for _, tg := range targets {
		fmt.Fprintf(&b, "try %s %s %d; ", tg.name, tg.host, tg.port)
	}
	b.WriteString(procsLoop(pattern))
	return b.String()
}

func procsLoop(pattern string) string {
	return "i=0; while [ $i -lt " + fmt.Sprint(neighbourAttempts) + " ]; do " +
		"if /bin/busybox grep -qs '" + pattern + "' /proc/[0-9]*/cmdline; then echo 'WIN neighbour-sees-processes'; else echo 'MISS neighbour-sees-processes'; fi; " +
		"i=$((i+1)); /bin/busybox sleep 0.2; done"
}

// tallyLines counts the attacker's WIN/MISS lines per attack name.
func tallyLines(out []byte) map[string]Tally {
	m := map[string]Tally{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || (f[0] != "WIN" && f[0] != "MISS") {
			continue
		}
		tl := m[f[1]]
		tl.Attempts++
		if f[0] == "WIN" {
			tl.Wins++
		}
		m[f[1]] = tl
	}
	return m
}

// hostProcessControl runs B's process and A's search as plain host
// processes.
func hostProcessControl(t *testing.T, token, pattern string) Tally {
	victim := exec.Command("/bin/busybox", "sh", "-c", "sleep 60; :", "neighbour-"+token)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = victim.Process.Kill(); _ = victim.Wait() }()
	out, err := exec.Command("/bin/busybox", "sh", "-c", procsLoop(pattern)).Output()
	if err != nil {
		t.Fatalf("host process control: %v", err)
	}
	return tallyLines(out)["neighbour-sees-processes"]
}

// launchWith runs one bundle from a given launcher state root with the
// neighbour pool; onNet sees the sandbox network before runsc starts.
func (s *scene) launchWith(ctx context.Context, t *testing.T, sb *testbundle.Scene, state string, onNet func(*sandboxnet.Network)) (launcher.Result, []byte, []byte) {
	var out, errb bytes.Buffer
	res, err := launcher.Launch(ctx, launcher.Options{
		BundleDir: sb.Bundle, StateRoot: state, RunscPath: sb.Runsc,
		Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
		Stdin:   strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Uplink: s.world.Uplink, Pool: neighbourPool, OnNetwork: onNet,
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			if host == "llm.example.test" {
				return []netip.Addr{s.model.Addr}, nil
			}
			return nil, fmt.Errorf("unknown host %s", host)
		},
	})
	if err != nil && ctx.Err() == nil {
		t.Errorf("launch: %v\nstderr: %s", err, errb.String())
	}
	return res, out.Bytes(), errb.Bytes()
}

// firstRoutePort is the port of the bundle's first private route (the MCP
// route of the reference facts).
func firstRoutePort(t *testing.T, dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, bundle.EgressFile))
	if err != nil {
		t.Fatal(err)
	}
	var eg bundle.Egress
	if err := json.Unmarshal(data, &eg); err != nil {
		t.Fatal(err)
	}
	if len(eg.Routes) == 0 {
		t.Fatal("the neighbour's bundle has no private route to attack")
	}
	return eg.Routes[0].Port
}

// waitFile waits for B to say, through its workspace, that its listener
// is up: B's filter drops every connection opened towards it, so its
// readiness cannot be probed from outside without weakening it.
func waitFile(t *testing.T, p string, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("neighbour sandbox B never became ready (%s)", p)
}

// deleteTable removes a sandbox's nftables table from the uplink: the
// control's "nothing filtering".
func deleteTable(t *testing.T, uplink, table string) {
	fd, err := unix.Open(uplink, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
	if err := c.Flush(); err != nil {
		t.Fatalf("control: deleting table %s: %v", table, err)
	}
}
