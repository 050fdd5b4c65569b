// Package e2e runs the real Pi (the pinned image from `make image`) inside
// gVisor with only the grants the compiler produced, and drives it over
// its RPC protocol. The model is a fake provider (OpenAI chat completions
// and Responses, Anthropic Messages) on a test host in a namespace the
// test creates (internal/testkit/fakemodel); the daemon's MCP endpoint is
// a fake on the test's loopback. Needs root,
// bin/runsc and the image (.image/, `make image`).
package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/fakemcp"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

const (
	apiKey   = "sk-e2e-injected-0f3a9c"
	mcpToken = "mcp-run-token-77d2"
	// The model endpoint as the facts name it: the fake model speaks TLS
	// with a certificate of the env's test CA, which only the model
	// route's proxy is told to trust (launcher.Options.ModelRoots).
	modelURL = "https://llm.example.test:8443/v1"
)

type imageInfo struct {
	Version string `json:"version"`
	// Pi is the version of Pi the image holds.
	Pi     string `json:"pi"`
	Digest string `json:"digest"`
	Rootfs string `json:"rootfs"`
	// Pi as one file in the image (docs/image.md, "The Pi bundle").
	Bundle struct {
		File   string `json:"file"`
		Digest string `json:"digest"`
	} `json:"bundle"`
	// The image's EROFS files, as the registry's image.erofs names them.
	Erofs []struct {
		Dir    string `json:"dir"`
		File   string `json:"file"`
		Digest string `json:"digest"`
	} `json:"erofs"`
}

func image(t testing.TB) imageInfo {
	t.Helper()
	// Before the image: without root these tests skip, image or not.
	skip.UnlessRoot(t, "the real-Pi tests run runsc and make namespaces")
	p := testbundle.Repo(t, ".image/image.json")
	if v := os.Getenv("PI_BENCH_IMAGE"); v != "" {
		// make bench-pi's variants of the image (scripts/bench-pi.sh).
		p = filepath.Join(v, "image.json")
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("the Pi image is missing (%v): run `make image` (make e2e-pi does)", err)
	}
	var im imageInfo
	if err := json.Unmarshal(data, &im); err != nil {
		t.Fatal(err)
	}
	im.Rootfs = filepath.Join(filepath.Dir(p), "rootfs")
	// Users run the image with its EROFS files, so the real-Pi tests do too.
	if len(im.Erofs) == 0 {
		t.Fatalf("%s lists no EROFS files: rebuild the image with `make image` (erofs-utils)", p)
	}
	for i := range im.Erofs {
		im.Erofs[i].File = filepath.Join(filepath.Dir(p), "erofs", filepath.Base(im.Erofs[i].File))
	}
	return im
}

// env is one test's world: the model host with the fake model, a decoy
// host, and the fake daemon MCP endpoint on loopback.
type env struct {
	world     *testnet.World
	model     *testnet.Host
	decoyHost *testnet.Host
	decoy     *testnet.Server
	mu        sync.Mutex
	fm        *fakemodel.Server
	daemon    *mcpDaemon
	image     imageInfo
	// ca signed the fake model's certificate for llm.example.test.
	ca *fakemodel.TestCA
	// secrets, when set, replaces the package's secrets for launches.
	secrets launcher.SecretSource
	// host stands for / on the host; every scene of a test shares it, so a
	// second sandbox sees the first one's workspace and sessions.
	host string
	// models, when set, is the daemon's models.json in place of the
	// default one (writeAgentFiles).
	models string
	// settings, when set, is the daemon's settings.json in place of the
	// default one.
	settings string
	// baseURL, when set, is the facts' model.baseURL in place of modelURL
	// (Anthropic's clients add /v1 themselves).
	baseURL string
	// upstream, when set, answers the model host's requests in place of
	// the fake model (a provider API the fake model does not speak).
	upstream http.Handler
	// auth, when set, is the daemon's auth.json (mode 0600): a
	// subscription login the model route brokers (oauth-broker).
	auth string
}

func newEnv(t testing.TB, script ...fakemodel.Turn) *env {
	e := &env{image: image(t), world: testnet.New(t), host: filepath.Join(t.TempDir(), "host")}
	e.model = e.world.Host("model")
	e.decoyHost = e.world.Host("decoy")
	e.decoy = e.decoyHost.Serve(t, 8443, "decoy")
	e.setScript(t, script...)
	l, err := e.model.Listen("tcp4", netip.AddrPortFrom(e.model.Addr, 8443).String())
	if err != nil {
		t.Fatal(err)
	}
	// By name (the test resolver's) and by address (a supervisor that
	// resolves as the host does names the model by its address).
	if e.ca, err = fakemodel.NewTestCA("llm.example.test", e.model.Addr.String()); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		fm, up := e.fm, e.upstream
		e.mu.Unlock()
		if up != nil {
			up.ServeHTTP(w, r)
			return
		}
		fm.Handler().ServeHTTP(w, r)
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{e.ca.Cert}}, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	e.daemon = newMCPDaemon(t)
	return e
}

// setScript gives the fake model a new script (and a fresh request log).
func (e *env) setScript(t testing.TB, script ...fakemodel.Turn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fm = fakemodel.New(fakemodel.Options{Script: script, APIKey: apiKey})
}

func (e *env) decoyAddr() string { return e.decoyHost.Addr.String() }

func (e *env) secretSource() launcher.SecretSource {
	if e.secrets != nil {
		return e.secrets
	}
	return secrets
}

// scene compiles facts for profile into a bundle running the image, and
// prepares the daemon-owned state Pi reads: models.json, settings.json
// loading the image's pi-mcp-adapter, and the integration extension.
func (e *env) scene(t testing.TB, profile, factsPatch string) *testbundle.Scene {
	base := modelURL
	if e.baseURL != "" {
		base = e.baseURL
	}
	facts := []byte(fmt.Sprintf(`{"model":{"baseURL":%q},"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, base, e.daemon.port))
	if factsPatch != "" {
		// The scene's own fields go into the test's patch, not the other way
		// round, so a null in the test's patch still deletes a base field.
		var err error
		if facts, err = testtree.MergePatch([]byte(factsPatch), facts); err != nil {
			t.Fatal(err)
		}
	}
	erofs, err := json.Marshal(e.image.Erofs)
	if err != nil {
		t.Fatal(err)
	}
	sc := testbundle.New(t, testbundle.Options{Host: e.host, Rootfs: e.image.Rootfs, Profile: profile,
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"erofs":%s},"deployments":{"host-alice":{"peers":{"uids":[0],"gids":[1000]}}}}`, e.image.Version, e.image.Digest, erofs),
		FactsPatch:    string(facts),
		// The compiler reads the daemon's models.json (the model route's
		// generated one is made from it), so it exists before the compile.
		Prepare: func(t testing.TB, host string) { e.writeAgentFiles(t, filepath.Join(host, "srv/paseo/state/pi-agent")) }})
	e.prepareState(t, sc)
	return sc
}

func (e *env) prepareState(t testing.TB, sc *testbundle.Scene) {
	agent := filepath.Join(sc.Host, "srv/paseo/state/pi-agent")
	e.writeAgentFiles(t, agent)
	write(t, filepath.Join(sc.Host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"), "export default function () {}\n")
	// The daemon gives each agent its own jiti cache dir, owned by the
	// sandbox user (testdata/base: state.cacheDir), and its own Git store
	// (state.gitStore).
	for _, d := range []string{agent, filepath.Join(sc.Host, "srv/paseo/state/pi-sessions/agent-7f3c"), filepath.Join(sc.Host, "srv/paseo/state/pi-cache/agent-7f3c"), filepath.Join(sc.Host, "srv/paseo/state/pi-git/agent-7f3c")} {
		chownTree(t, d, 1000, 1000)
	}
}

// writeAgentFiles writes the daemon's files in an agent dir: models.json
// for the fake model and settings.json loading the image's pi-mcp-adapter.
func writeAgentFiles(t testing.TB, agent string) {
	write(t, filepath.Join(agent, "models.json"), `{"providers":{"fake":{"baseUrl":"`+modelURL+`","api":"openai-completions",
 "apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},
 "models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}`)
	write(t, filepath.Join(agent, "settings.json"), `{"packages":["/opt/pi/node_modules/pi-mcp-adapter"]}`)
}

// writeAgentFiles is writeAgentFiles with the env's models.json if it has
// one of its own.
func (e *env) writeAgentFiles(t testing.TB, agent string) {
	writeAgentFiles(t, agent)
	if e.models != "" {
		write(t, filepath.Join(agent, "models.json"), e.models)
	}
	if e.settings != "" {
		write(t, filepath.Join(agent, "settings.json"), e.settings)
	}
	if e.auth != "" {
		write(t, filepath.Join(agent, "auth.json"), e.auth)
		if err := os.Chmod(filepath.Join(agent, "auth.json"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func write(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	// WriteFile keeps the mode of a file the tree already made.
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
}

func chownTree(t testing.TB, root string, uid, gid int) {
	t.Helper()
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// pi is a running sandboxed Pi.
type pi struct {
	*piproto.Client
	stdin  io.WriteCloser
	stderr *lockedBuffer
	done   chan struct{} // closed when the launch returned
	result result
}

type result struct {
	res launcher.Result
	err error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (e *env) launch(t testing.TB, sc *testbundle.Scene) *pi { return e.launchID(t, sc, "") }

// launchID is launch with a fixed container id (empty: a fresh one).
func (e *env) launchID(t testing.TB, sc *testbundle.Scene, id string) *pi {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &pi{Client: piproto.New(outR, inW), stdin: inW, stderr: &lockedBuffer{}, done: make(chan struct{})}
	lctx, cancel := context.WithCancel(context.Background())
	go func() {
		res, err := launcher.Launch(lctx, launcher.Options{
			BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc, ID: id,
			Secrets: e.secretSource(), Stdin: inR, Stdout: outW, Stderr: p.stderr, Uplink: e.world.Uplink, Resolve: e.resolve,
			ModelRoots: e.ca.Roots,
		})
		outW.Close()
		p.result = result{res, err}
		close(p.done)
	}()
	// A failed test must not leave a sandbox behind: end Pi's input, then
	// cancel the launch (which tears everything down), and wait for it.
	t.Cleanup(func() {
		inW.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			cancel()
			<-p.done
		}
		cancel()
	})
	return p
}

func (p *pi) stop(t testing.TB) launcher.Result {
	t.Helper()
	p.stdin.Close()
	select {
	case <-p.done:
		r := p.result
		if r.err != nil {
			t.Fatalf("launch: %v\nstderr: %s", r.err, p.stderr.String())
		}
		return r.res
	case <-time.After(60 * time.Second):
		t.Fatalf("Pi did not exit after stdin closed; stderr: %s", p.stderr.String())
		return launcher.Result{}
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return c
}

// call sends a command and fails the test unless it succeeds.
func (p *pi) call(t *testing.T, c context.Context, cmd map[string]any) piproto.Frame {
	t.Helper()
	resp, _, err := p.Call(c, cmd)
	if err != nil {
		// Pi's output ended: say how the launch ended, if it did.
		launch := "still running"
		select {
		case <-p.done:
			launch = fmt.Sprintf("%+v, %v", p.result.res, p.result.err)
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("%v: %v\nlaunch: %s\nstderr: %s", cmd["type"], err, launch, p.stderr.String())
	}
	if !resp.OK() {
		t.Fatalf("%v failed: %s %s\nstderr: %s", cmd["type"], resp.Error, resp.Raw, p.stderr.String())
	}
	return resp
}

// turn sends a prompt and waits for agent_settled, returning the events.
func (p *pi) turn(t *testing.T, c context.Context, message string) []piproto.Frame {
	t.Helper()
	p.call(t, c, map[string]any{"type": "prompt", "message": message})
	_, events, err := p.Until(c, piproto.Event("agent_settled"))
	if err != nil {
		var last []string
		for _, f := range events {
			last = append(last, string(f.Raw))
		}
		if len(last) > 8 {
			last = last[len(last)-8:]
		}
		t.Fatalf("waiting for agent_settled: %v\nlast frames:\n%s\nstderr: %s", err, strings.Join(last, "\n"), p.stderr.String())
	}
	return events
}

// mcpDaemon stands in for Paseo's /mcp/agents endpoint (fakemcp) on a
// loopback port of the test's own.
type mcpDaemon struct {
	*fakemcp.Daemon
	port int
}

// listAgentsText is what the stand-in's list_agents answers.
const listAgentsText = "agents listed by paseo"

func newMCPDaemon(t testing.TB) *mcpDaemon {
	d := &mcpDaemon{Daemon: fakemcp.New(mcpToken, listAgentsText)}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	d.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return d
}

// startSupervisor serves a supervisor for sc (its registry, state root and
// runsc, the test's secrets, uplink and resolver) on a socket in a fresh
// directory under /run until tb ends, and returns the socket.
func (e *env) startSupervisor(tb testing.TB, sc *testbundle.Scene) string {
	tb.Helper()
	dir, err := os.MkdirTemp("/run", "paseo-e2e-supervisor-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	socket := filepath.Join(dir, "supervisor.sock")
	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		Socket: socket, SocketGID: 0, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM})
	if err != nil {
		tb.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Listen(sctx) }()
	tb.Cleanup(func() { cancel(); srv.Shutdown() })
	return socket
}

// dialSupervisor connects to a supervisor that is starting (up to 4 s);
// the connection closes with the test.
func dialSupervisor(t testing.TB, socket string) *supervisor.Client {
	t.Helper()
	for i := 0; i < 200; i++ {
		if c, err := supervisor.Dial(socket); err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("supervisor socket never came up")
	return nil
}

func ownerOf(t *testing.T, p string) (uint32, uint32) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func (e *env) requests() []fakemodel.Recorded {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fm.Requests()
}

// secrets holds the reference deployment's secrets only.
func secrets(deployment, ref string) ([]byte, error) {
	if deployment != "host-alice" {
		return nil, fmt.Errorf("unknown deployment %s", deployment)
	}
	switch ref {
	case "alice/fake-llm":
		return []byte(apiKey), nil
	case "paseo/mcp-token":
		return []byte(mcpToken), nil
	}
	return nil, fmt.Errorf("unknown secret %s", ref)
}

func (e *env) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	if host == "llm.example.test" {
		return []netip.Addr{e.model.Addr}, nil
	}
	return nil, fmt.Errorf("unknown host %s", host)
}
