package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/supervisor"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Floods of shared resources (issue 10, item 4): a sandbox opening
// connections past its egress cap, a sandbox flooding its route proxy
// (which runs as root in the holder, outside the sandbox's cgroup), and one
// peer uid flooding the supervisor's socket. Each contained run shows the
// cap holding and a neighbour (sandbox or uid) served during the flood;
// each control lifts exactly that cap and shows the flood getting past it.
// The supervisor's frame, idle and quota limits are shown in the
// supervisor tests (TestFrameTimeoutAndSizes, TestMaxSandboxesPerDeployment).

func init() { registerOutside("floods", floods) }

func floods(t *testing.T, s *scene) []OutsideAttack {
	return []OutsideAttack{s.egressFlood(t), s.routeProxyFlood(t), s.supervisorFlood(t)}
}

// Separate one-link pools: the scene's own pool may still be leased.
var (
	floodNeighbourPool = netip.MustParsePrefix("10.213.78.0/30")
	floodRouteAPool    = netip.MustParsePrefix("10.213.79.0/30")
	floodRouteBPool    = netip.MustParsePrefix("10.213.80.0/30")
)

// floodNeighbour is a second sandbox network in the scene's uplink,
// allowed the same model host and port the flooding sandbox is.
func (s *scene) floodNeighbour(t *testing.T, id string, pool netip.Prefix, rules []bundle.EgressRule, routes []bundle.Route) *sandboxnet.Network {
	n, err := sandboxnet.Setup(context.Background(), sandboxnet.Config{ID: id, StateDir: t.TempDir(), Uplink: s.world.Uplink, Pool: pool,
		Egress: bundle.Egress{Mode: "sandbox", Default: "deny", DNS: "pinned", Rules: rules, Routes: routes}})
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

// reportWriter collects the sandbox's stdout and signals its first line.
type reportWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	line chan string
	once sync.Once
}

func (w *reportWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if i := bytes.IndexByte(w.buf.Bytes(), '\n'); i >= 0 {
		w.once.Do(func() { w.line <- string(w.buf.Bytes()[:i]) })
	}
	return len(p), nil
}

// egressFlood runs paseo-flood in a real runsc sandbox against the allowed
// model host: contained with a cap of 16 live connections, control with the
// cap lifted. While the flood holds its connections, a neighbour sandbox
// connects to the same host and port.
func (s *scene) egressFlood(t *testing.T) OutsideAttack {
	const limit, n = 16, 48
	a := OutsideAttack{Name: "sandbox-floods-egress-connections", Attacker: "flood",
		Goal:    fmt.Sprintf("open %d connections at once to the shared allowed model host, past the sandbox's cap (%d here, test-sized so the rate cap of %d a burst stays out of the way; the default is %d), and starve a neighbour", n, limit, sandboxnet.DefaultCaps.Burst, sandboxnet.DefaultCaps.Conns),
		Control: "the same sandbox with the live-connection cap lifted (rate cap unchanged)"}
	flood := testbundle.BuildStatic(t, "./test/cmd/paseo-flood")
	sb := testbundle.New(t, testbundle.Options{Host: s.host, RegistryPatch: `{"network":{"mode":"sandbox"}}`, FactsPatch: directModel,
		Argv:        []string{"/bin/paseo-flood", "-addr", "llm.example.test:8443", "-n", fmt.Sprint(n), "-hold", "4s"},
		RootfsFiles: map[string]string{"/bin/paseo-flood": flood}})
	s.plant(t)
	model := []bundle.EgressRule{{Proto: "tcp", Host: s.model.Addr.String(), Port: 8443, Purpose: "model"}}
	nb := s.floodNeighbour(t, "flood-egress-neighbour", floodNeighbourPool, model, nil)

	var evidence []string
	run := func(caps sandboxnet.Caps) (tally Tally) {
		w := &reportWriter{line: make(chan string, 1)}
		neighbourOK := make(chan bool, 1)
		go func() {
			line, ok := <-w.line
			if !ok {
				neighbourOK <- false
				return
			}
			_ = line
			c, err := testnet.DialFrom(nb.NetnsPath, "tcp4", netip.AddrPortFrom(s.model.Addr, 8443).String(), 3*time.Second)
			if err == nil {
				c.Close()
			}
			neighbourOK <- err == nil
		}()
		var errb bytes.Buffer
		res, err := launcher.Launch(context.Background(), launcher.Options{
			BundleDir: sb.Bundle, StateRoot: sb.State, RunscPath: sb.Runsc, NetCaps: caps,
			Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
			Stdin:   strings.NewReader(""), Stdout: w, Stderr: &errb,
			Uplink: s.world.Uplink, Pool: pool,
			Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
				if host == "llm.example.test" {
					return []netip.Addr{s.model.Addr}, nil
				}
				return nil, fmt.Errorf("unknown host %s", host)
			},
		})
		close(w.line)
		if err != nil {
			t.Errorf("flood launch: %v\n%s", err, errb.String())
			return
		}
		var rep struct{ Attempts, Connected int }
		w.mu.Lock()
		out := w.buf.String()
		w.mu.Unlock()
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &rep); err != nil {
			t.Errorf("flood report: %v (exit %d)\nstdout: %s\nstderr: %s", err, res.ExitCode, out, errb.String())
			return
		}
		served := <-neighbourOK
		tally = Tally{Attempts: rep.Attempts, Refusals: rep.Attempts - rep.Connected}
		if rep.Connected > limit {
			tally.Wins = rep.Connected - limit
		}
		evidence = append(evidence, fmt.Sprintf("cap %d: %d of %d connected, %d refused (drop-conn-limit counted %d packets), neighbour served: %v",
			caps.Conns, rep.Connected, rep.Attempts, tally.Refusals, res.Packets[sandboxnet.TagConnLimit], served))
		if !served {
			t.Errorf("the neighbour sandbox was not served during the flood (cap %d)", caps.Conns)
		}
		return tally
	}
	a.Contained = run(sandboxnet.Caps{Conns: limit})
	a.ControlRun = run(sandboxnet.Caps{Conns: 1 << 20})
	a.Evidence = strings.Join(evidence, "; ")
	return a
}

// routeProxyFlood floods a sandbox's route proxy from that sandbox's own
// namespace, through its packet filter, as the launcher wires them:
// contained with the default limits, control with the connection cap
// lifted. A neighbour sandbox's proxy answers a request during the flood.
func (s *scene) routeProxyFlood(t *testing.T) OutsideAttack {
	lim := routeproxy.DefaultLimits.MaxConns
	n := 2 * lim
	a := OutsideAttack{Name: "sandbox-floods-route-proxy", Attacker: "flood",
		Goal:    fmt.Sprintf("hold %d idle connections to the sandbox's route proxy, past its cap of %d, and starve a neighbour's proxy", n, lim),
		Control: "the same proxy with its connection cap lifted (timeouts unchanged)"}
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}))
	defer daemon.Close()
	route := func(agent string) bundle.Route {
		return bundle.Route{Purpose: "mcp", Listen: "gateway", Port: 6767, Method: "POST", Path: "/mcp/agents",
			CallerAgentID: agent, Upstream: daemon.URL + "/mcp/agents", Methods: []string{"ping"}}
	}
	token := &routeproxy.Token{}
	if err := token.Set([]byte("run-token")); err != nil {
		t.Fatal(err)
	}
	netA := s.floodNeighbour(t, "flood-route-a", floodRouteAPool, nil, []bundle.Route{route("agent-a")})
	netB := s.floodNeighbour(t, "flood-route-b", floodRouteBPool, nil, []bundle.Route{route("agent-b")})
	serve := func(nw *sandboxnet.Network, agent string, l routeproxy.Limits) *routeproxy.Proxy {
		p, err := routeproxy.New(route(agent), l, token)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := nw.ListenGateway(6767)
		if err != nil {
			t.Fatal(err)
		}
		p.Serve(ln)
		return p
	}
	pb := serve(netB, "agent-b", routeproxy.Limits{})
	defer pb.Close()
	neighbourServed := func() bool {
		tr := &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return testnet.DialFrom(netB.NetnsPath, network, addr, 3*time.Second)
		}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s:6767/mcp/agents?callerAgentId=agent-b", netB.Gateway), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}

	var evidence []string
	run := func(l routeproxy.Limits) Tally {
		pa := serve(netA, "agent-a", l)
		defer pa.Close()
		conns := make([]net.Conn, n)
		var wg sync.WaitGroup
		for i := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conns[i], _ = testnet.DialFrom(netA.NetnsPath, "tcp4", netip.AddrPortFrom(netA.Gateway, 6767).String(), 3*time.Second)
			}()
		}
		wg.Wait()
		// Give the proxy a moment to close what it refuses at accept.
		time.Sleep(500 * time.Millisecond)
		held := 0
		for _, c := range conns {
			if c == nil {
				continue
			}
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := bufio.NewReader(c).ReadByte(); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					held++ // still open: the proxy holds a slot for it
				}
			}
		}
		served := neighbourServed()
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		tally := Tally{Attempts: n, Refusals: int(pa.Stats.RefusedConns.Load())}
		if held > lim {
			tally.Wins = held - lim
		}
		if !served {
			t.Errorf("a neighbour's route proxy was not served during the flood")
		}
		evidence = append(evidence, fmt.Sprintf("cap %d: the proxy held %d of %d connections, refused %d at accept; neighbour served: %v",
			max(l.MaxConns, lim), held, n, tally.Refusals, served))
		return tally
	}
	a.Contained = run(routeproxy.Limits{})
	a.ControlRun = run(routeproxy.Limits{MaxConns: 1 << 20})
	a.Evidence = strings.Join(evidence, "; ")
	return a
}

// The other peer of the supervisor flood: a uid and group of its own.
const floodPeerID = 4242

// supervisorFlood: uid 0 opens four times its per-uid cap of connections
// to a supervisor (each asks list, so each answer shows whether it got a
// slot), and while they are held a client of another uid asks list too.
// The control is the same supervisor with its connection caps lifted.
func (s *scene) supervisorFlood(t *testing.T) OutsideAttack {
	per := supervisor.DefaultLimits.MaxConnsPerUID
	n := 4 * per
	a := OutsideAttack{Name: "peer-floods-supervisor-connections", Attacker: "flood",
		Goal:    fmt.Sprintf("hold %d connections of one peer uid to the supervisor, past its per-uid cap of %d, and starve another uid's client", n, per),
		Control: "the same supervisor with its connection caps lifted (frame and idle timeouts unchanged)"}
	reg, err := os.ReadFile(testbundle.Repo(t, "testdata/base/registry.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/run", "paseo-acceptance-flood-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "peer")
	if data, err := os.ReadFile(os.Args[0]); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	otherPeer := func(socket string) string {
		cmd := exec.Command(exe, "-test.run=^TestHelperFloodPeer$")
		cmd.Env = []string{"PASEO_ACCEPTANCE_FLOOD_SOCKET=" + socket}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: floodPeerID, Gid: floodPeerID}}
		out, _ := cmd.CombinedOutput()
		return string(out)
	}

	var evidence []string
	run := func(lim supervisor.Limits) (tally Tally) {
		socket := filepath.Join(dir, "supervisor.sock")
		srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: reg},
			Socket: socket, SocketGID: floodPeerID, StateRoot: t.TempDir(), Limits: lim})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Listen(ctx) }()
		defer func() { cancel(); srv.Close(); <-served }()
		for i := 0; ; i++ {
			if c, err := net.Dial("unix", socket); err == nil {
				c.Close()
				break
			}
			if i == 200 {
				t.Fatal("the supervisor socket never came up")
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // the probe connection gives its slot back

		held, busy := 0, 0
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := 0; i < n; i++ {
			c, err := net.Dial("unix", socket)
			if err != nil {
				busy++
				continue
			}
			conns = append(conns, c)
			fmt.Fprintln(c, `{"v":1,"id":"f","op":"list"}`)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			var r supervisor.Response
			line, err := bufio.NewReader(c).ReadBytes('\n')
			switch {
			case err == nil && json.Unmarshal(line, &r) == nil && r.OK:
				held++
			case r.Error != nil && r.Error.Code == rpcerr.Busy:
				busy++
			}
		}
		out := otherPeer(socket)
		neighbourServed := strings.Contains(out, "served")
		if !neighbourServed {
			t.Errorf("a client of uid %d during the flood: %q", floodPeerID, out)
		}
		tally = Tally{Attempts: n, Refusals: busy}
		if held > per {
			tally.Wins = held - per
		}
		evidence = append(evidence, fmt.Sprintf("per-uid cap %d: uid 0 held %d of %d connections, %d refused busy; uid %d served: %v",
			max(lim.MaxConnsPerUID, per), held, n, busy, floodPeerID, neighbourServed))
		return tally
	}
	a.Contained = run(supervisor.Limits{})
	a.ControlRun = run(supervisor.Limits{MaxConns: 1 << 20, MaxConnsPerUID: 1 << 20})
	a.Evidence = strings.Join(evidence, "; ")
	return a
}

// TestHelperFloodPeer is the supervisor flood's other peer, run by
// supervisorFlood as uid 4242; on its own it does nothing.
func TestHelperFloodPeer(t *testing.T) {
	socket := os.Getenv("PASEO_ACCEPTANCE_FLOOD_SOCKET")
	if socket == "" {
		return
	}
	c, err := supervisor.Dial(socket)
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Call(ctx, supervisor.Request{Op: "list"}, nil); err != nil {
		fmt.Println("refused:", err)
		return
	}
	fmt.Println("served")
}
