package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// TestTypeScriptClient runs clients/typescript's unit tests (`npm run test:unit`) and its
// tests against the real supervisor (`npm run test:e2e`: the `paseo-policy supervise`
// binary built from this tree, as root) with the real Pi image in gVisor and the fake
// model on a test host. This test is the world: it starts the
// fake model, compiles the scene, runs the supervisor and restarts it whenever it dies (as
// systemd's Restart=always would, so the TypeScript test can SIGKILL it mid-turn), and
// hands the TypeScript tests what they need in a world file (PASEO_TS_WORLD). Afterwards it
// checks that the tests left nothing behind and that no secret reached their output.
func TestTypeScriptClient(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH; scripts/deps.sh (make deps) installs node and npm", tool)
		}
	}
	// Every scripted turn is the same slow text, so the tests' order does not matter and a
	// turn streams long enough to be interrupted (about 3 s).
	words := strings.Repeat("sandboxed ", 40)
	script := make([]fakemodel.Turn, 24)
	for i := range script {
		script[i] = fakemodel.Slow(words, 40, 3*time.Second)
	}
	e := newEnv(t)
	// The provider's tool-call test has a script of its own (fakemodel.Options.Scripts): a
	// write through Pi's own tool, then a text answer.
	const toolPrefix, toolFile, toolContent, toolText = "tool:", "PROVIDER.md", "written by the sandboxed Pi\n", "wrote it"
	e.mu.Lock()
	e.fm = fakemodel.New(fakemodel.Options{Script: script, APIKey: apiKey, Scripts: map[string][]fakemodel.Turn{
		toolPrefix: {fakemodel.WriteFile(toolFile, toolContent), fakemodel.Text(toolText)}}})
	e.mu.Unlock()
	sc := e.tsScene(t)

	// The supervisor's configuration, as an operator would install it.
	bin := testbundle.BuildStatic(t, "./cmd/paseo-policy")
	cfgDir := t.TempDir()
	registry := filepath.Join(cfgDir, "registry.json")
	write(t, registry, string(sc.Registry))
	secretsDir := filepath.Join(cfgDir, "secrets")
	for ref, v := range map[string]string{"alice/fake-llm": apiKey, "paseo/mcp-token": mcpToken} {
		p := filepath.Join(secretsDir, "host-alice", ref)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sockDir, err := os.MkdirTemp("/run", "paseo-e2e-ts-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	_ = os.Chmod(sockDir, 0o755)
	socket := filepath.Join(sockDir, "supervisor.sock")
	pidFile := filepath.Join(cfgDir, "supervisor.pid")
	// The model route verifies the fake model's certificate against the
	// test CA (supervise --model-ca; the holders get it in their spec).
	caFile := filepath.Join(cfgDir, "model-ca.pem")
	if err := os.WriteFile(caFile, e.ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	sup := &restarter{argv: []string{bin, "supervise", "--registry", registry, "--socket", socket, "--socket-group", "0",
		"--state-root", sc.State, "--runsc", sc.Runsc, "--secrets-dir", secretsDir, "--uplink-netns", e.world.Uplink,
		"--model-ca", caFile}, pidFile: pidFile}
	sup.start(t)
	dialSupervisor(t, socket).Close()

	// A facts set the compiler refuses several times over, and what it says of it.
	const secret = "sk-live-Abcdefghijklmnop1234"
	refusedFacts, err := testtree.MergePatch(sc.Facts, []byte(`{"workspace":{"cwd":"relative/path"},"model":{"baseURL":"http://127.0.0.1:9/v1"},"credential":{"secretRef":"`+secret+`"},"extra":true}`))
	if err != nil {
		t.Fatal(err)
	}
	_, diags := compiler.Compile(compiler.Inputs{Facts: schema.Input{Name: "facts.json", Data: refusedFacts},
		Registry: schema.Input{Name: "registry.json", Data: sc.Registry}}, compiler.Options{})
	if len(diags) < 3 {
		t.Fatalf("the refused facts should be refused several times over: %v", diags)
	}
	worldFile := filepath.Join(cfgDir, "world.json")
	w, err := json.Marshal(map[string]any{
		"socket": socket, "deployment": "host-alice", "facts": json.RawMessage(sc.Facts), "mcpToken": mcpToken,
		"supervisorPidFile": pidFile, "turnText": words,
		"refused":   map[string]any{"facts": json.RawMessage(refusedFacts), "diagnostics": diags.Sorted(), "secret": secret},
		"workspace": sc.Workspace(),
		"tool":      map[string]string{"prefix": toolPrefix, "file": toolFile, "content": toolContent, "text": toolText},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(worldFile, w, 0o600); err != nil {
		t.Fatal(err)
	}

	pkg := testbundle.Repo(t, "clients/typescript")
	npm := func(args ...string) (string, error) {
		c, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(c, "npm", args...)
		cmd.Dir = pkg
		cmd.Env = append(os.Environ(), "PASEO_TS_WORLD="+worldFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := npm("ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=warn"); err != nil {
		t.Fatalf("npm ci in clients/typescript: %v\n%s", err, out)
	}
	// The unit tests (a scripted Pi stream, a scripted supervisor: no world) and the tests
	// against the world, each through its own script; node's runner counts what it ran.
	var out string
	for _, script := range []string{"test:unit", "test:e2e"} {
		o, err := npm("run", script)
		t.Logf("npm run %s:\n%s", script, o)
		if err != nil {
			t.Errorf("npm run %s: %v", script, err)
		}
		checkNodeCounts(t, script, o)
		out += o
	}
	for name, s := range map[string]string{"the model key": apiKey, "the MCP token": mcpToken} {
		if strings.Contains(out, s) || strings.Contains(sup.stderr(), s) {
			t.Errorf("%s is in the test's or the supervisor's output", name)
		}
	}
	if sup.restarts() < 1 {
		t.Errorf("the supervisor was never restarted: the SIGKILL test did not run")
	}
	if len(e.requests()) == 0 {
		t.Error("the fake model saw no request")
	}
	for _, r := range e.requests() {
		if !r.Authorized {
			t.Errorf("a model request without the injected key: %+v", r.Path)
		}
	}

	// The tests delete what they create: no holder is left.
	sup.stop(t)
	left, _ := os.ReadDir(supervisor.HolderDir(sc.State))
	var socks []string
	for _, l := range left {
		if strings.HasSuffix(l.Name(), ".sock") {
			socks = append(socks, l.Name())
		}
	}
	if len(socks) > 0 {
		t.Errorf("holders left behind: %v", socks)
	}
	// Whatever a failed run left, a supervisor over the same state adopts and deletes.
	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: secrets, Uplink: e.world.Uplink, ModelRoots: e.ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
}

// checkNodeCounts fails the test unless node's runner (TAP) passed some tests and skipped,
// cancelled, left to do or failed none.
func checkNodeCounts(t *testing.T, script, out string) {
	t.Helper()
	for _, counter := range []string{"skipped", "todo", "cancelled", "fail"} {
		if m := regexp.MustCompile(`(?m)^# ` + counter + ` (\d+)$`).FindStringSubmatch(out); m == nil || m[1] != "0" {
			t.Errorf("npm run %s: %q is %v, want 0", script, counter, m)
		}
	}
	if m := regexp.MustCompile(`(?m)^# pass (\d+)$`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Errorf("npm run %s passed no tests: %v", script, m)
	}
}

// tsScene is e.scene for a supervisor that resolves names as the host does: the model is
// named by its address, so `paseo-policy supervise` needs no test resolver.
func (e *env) tsScene(t *testing.T) *testbundle.Scene {
	url := fmt.Sprintf("https://%s:8443/v1", e.model.Addr)
	// The daemon's models.json, naming the model by its address, exists
	// before the compile: the model route's generated one is made from it.
	agentFiles := func(t testing.TB, agent string) {
		writeAgentFiles(t, agent)
		p := filepath.Join(agent, "models.json")
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		write(t, p, strings.ReplaceAll(string(data), modelURL, url))
	}
	facts := []byte(fmt.Sprintf(`{"model":{"baseURL":%q},"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, url, e.daemon.port))
	erofs, err := json.Marshal(e.image.Erofs)
	if err != nil {
		t.Fatal(err)
	}
	sc := testbundle.New(t, testbundle.Options{Host: e.host, Rootfs: e.image.Rootfs, Profile: "pi-session",
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"erofs":%s},"deployments":{"host-alice":{"peers":{"uids":[0],"gids":[1000]}}}}`, e.image.Version, e.image.Digest, erofs),
		FactsPatch:    string(facts),
		Prepare:       func(t testing.TB, host string) { agentFiles(t, filepath.Join(host, "srv/paseo/state/pi-agent")) }})
	e.prepareState(t, sc)
	// The agent files prepareState wrote name the model by the test resolver's name.
	agent := filepath.Join(sc.Host, "srv/paseo/state/pi-agent", "models.json")
	data, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	write(t, agent, strings.ReplaceAll(string(data), modelURL, url))
	chownTree(t, filepath.Dir(agent), 1000, 1000)
	return sc
}

// restarter runs the supervisor as systemd's Restart=always would: started again whenever
// it ends, until stop. Its pid is in pidFile (rewritten by rename at each start).
type restarter struct {
	argv    []string
	pidFile string

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	n        int
	errBuf   bytes.Buffer
	done     chan struct{}
}

func (r *restarter) start(t *testing.T) {
	r.done = make(chan struct{})
	if err := r.launch(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		for {
			r.mu.Lock()
			cmd := r.cmd
			r.mu.Unlock()
			_ = cmd.Wait()
			r.mu.Lock()
			stopping := r.stopping
			r.mu.Unlock()
			if stopping {
				return
			}
			time.Sleep(100 * time.Millisecond) // RestartSec
			if err := r.launch(); err != nil {
				fmt.Fprintf(&r.errBuf, "restart: %v\n", err)
				return
			}
			r.mu.Lock()
			r.n++
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { r.stop(t) })
}

func (r *restarter) launch() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Stderr = &lockedWriter{mu: &r.mu, w: &r.errBuf}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.cmd = cmd
	tmp := r.pidFile + ".new"
	if err := os.WriteFile(tmp, []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, r.pidFile)
}

// stop ends the supervisor with SIGTERM (its sandboxes go on in their holders).
func (r *restarter) stop(t *testing.T) {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return
	}
	r.stopping = true
	cmd := r.cmd
	r.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-r.done
	}
}

func (r *restarter) restarts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *restarter) stderr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errBuf.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
