package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/pilaunch"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// The daemon user of this test: the image's sandbox uid, as on a host
// daemon whose sandboxes run as the daemon's own user.
const daemonUID = 1000

// decoys are other providers' keys in the daemon's environment, as a
// Paseo daemon's process.env holds them. None may reach the sandbox.
var decoys = map[string]string{
	"ANTHROPIC_API_KEY": "decoy-anthropic-5b1e",
	"OPENAI_API_KEY":    "decoy-openai-77c0",
	"GEMINI_API_KEY":    "decoy-gemini-a3f9",
	"FAKE_LLM_KEY":      "decoy-fake-llm-0d2e",
}

type paseoWorld struct {
	e         *env
	sc        *testbundle.Scene
	bin       string
	config    string
	bridge    string
	socket    string
	harnessJS string
	agentURL  string
}

// harness runs test/paseoharness/harness.mjs as the daemon user in a
// process group of its own (the daemon's process tree), with a daemon's
// environment: decoys included.
func (w *paseoWorld) harness(t *testing.T, scenario string, opts map[string]any) (*exec.Cmd, *bufio.Reader) {
	return w.harnessAs(t, daemonUID, scenario, opts)
}

// harnessAs runs the harness as uid; opts["command"] defaults to
// `paseo-policy pi --config <the operator's file>`.
func (w *paseoWorld) harnessAs(t *testing.T, uid uint32, scenario string, opts map[string]any) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	if opts["command"] == nil {
		opts["command"] = []string{w.bin, "pi", "--config", w.config}
	}
	raw, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", w.harnessPath(), scenario, string(raw))
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "PASEO_HOME=/tmp/paseo-home"}
	for k, v := range decoys {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the harness's stderr (%s): %s", cmd.ProcessState, tailOf(stderr.String(), 4000))
		}
	})
	return cmd, bufio.NewReader(out)
}

func (w *paseoWorld) harnessPath() string { return w.harnessJS }

type step struct {
	Step        string            `json:"step"`
	Message     string            `json:"message"`
	Events      []json.RawMessage `json:"events"`
	Text        string            `json:"text"`
	SessionFile string            `json:"sessionFile"`
	Stderr      string            `json:"stderr"`
	Request     string            `json:"request"`
	Models      []struct{ ID, Provider string }
	AnswerMs    int `json:"answerMs"`
	TotalMs     int `json:"totalMs"`
	MS          int `json:"ms"`
	PID         int `json:"pid"`
	// Strays: response frames the harness got for an id it did not send
	// or no longer waited for, or for another command; Next: the id the
	// harness would number next.
	Strays   []string `json:"strays"`
	Next     int      `json:"next"`
	Before   int      `json:"before"`
	Provider string   `json:"provider"`
	N        int      `json:"n"`
	Exit     struct {
		Code   *int    `json:"code"`
		Signal *string `json:"signal"`
	} `json:"exit"`
}

func readStep(t *testing.T, r *bufio.Reader, want string) step {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the harness ended before %q: %v", want, err)
		}
		var s step
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("harness line %q: %v", line, err)
		}
		if s.Step == "error" {
			t.Fatalf("harness: %s", s.Message)
		}
		if s.Step == want {
			return s
		}
	}
}

func (w *paseoWorld) run(t *testing.T, scenario string, opts map[string]any) step {
	return w.runAs(t, daemonUID, scenario, opts)
}

func (w *paseoWorld) runAs(t *testing.T, uid uint32, scenario string, opts map[string]any) step {
	t.Helper()
	cmd, r := w.harnessAs(t, uid, scenario, opts)
	s := readStep(t, r, "done")
	_ = cmd.Wait()
	return s
}

func (w *paseoWorld) list(t *testing.T) []supervisor.Info {
	t.Helper()
	cl := dialSupervisor(t, w.socket)
	defer cl.Close()
	var out []supervisor.Info
	if err := cl.Call(ctx(t), supervisor.Request{Op: "list"}, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func chmodUp(t *testing.T, p string, stop string) {
	for d := p; d != stop && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func newPaseoWorld(t *testing.T, e *env) *paseoWorld {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not on PATH; scripts/deps.sh (make deps) installs it")
	}
	sc := e.scene(t, "pi-session", "")
	w := &paseoWorld{e: e, sc: sc, harnessJS: testbundle.Repo(t, "test/paseoharness/harness.mjs")}
	w.bin = testbundle.BuildStatic(t, "./cmd/paseo-policy")
	chmodUp(t, filepath.Dir(w.bin), "/tmp")
	// The daemon user reaches the workspace, the state and the launch dir
	// as on a host where they are its own.
	chmodUp(t, sc.Workspace(), "/tmp")
	sessions := filepath.Join(sc.Host, "srv/paseo/state/pi-sessions")
	probe := filepath.Join(sc.Host, "srv/paseo/workspace/probe")
	for _, d := range []string{sessions, probe} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		chownTree(t, d, daemonUID, daemonUID)
	}
	chownTree(t, sc.Workspace(), daemonUID, daemonUID)
	// The workspace is a linked worktree of a repository under the repos
	// root, which the daemon user owns (it made the worktree): the command
	// reads the worktree's Git pointers as that user.
	if repos := filepath.Join(sc.Host, "srv/paseo/repos"); dirExists(repos) {
		chmodUp(t, repos, "/tmp")
		chownTree(t, repos, daemonUID, daemonUID)
	}
	chmodUp(t, filepath.Join(sc.Host, "srv/paseo/launch/paseo-pi-extension-a1"), "/tmp")

	// The operator's side: the supervisor serving the daemon's group, and
	// the command's configuration, root's, beside the socket.
	dir, err := os.MkdirTemp("/run", "paseo-e2e-pi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	w.socket = filepath.Join(dir, "supervisor.sock")
	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		Socket: w.socket, SocketGID: daemonUID, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Listen(sctx) }()
	t.Cleanup(func() { cancel(); srv.Shutdown() })

	w.bridge = filepath.Join(dir, "bridge")
	if err := os.Mkdir(w.bridge, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(w.bridge, daemonUID, daemonUID); err != nil {
		t.Fatal(err)
	}
	w.agentURL = fmt.Sprintf("http://127.0.0.1:%d/mcp/agents", e.daemon.port)
	cfg := pilaunch.Config{Socket: w.socket, Deployment: "host-alice", WorkspaceID: "wks_4be1",
		Models: map[string]pilaunch.ModelRoute{"fake": {BaseURL: modelURL, API: "openai-completions",
			Mode: "api-key", Env: "FAKE_LLM_KEY", SecretRef: "alice/fake-llm"}},
		DefaultModel: "fake/fake-1",
		MCP:          &pilaunch.MCPRoute{AgentsURL: w.agentURL, TokenRef: "paseo/mcp-token"},
		State: pilaunch.StateDirs{AgentDir: filepath.Join(sc.Host, "srv/paseo/state/pi-agent"), SessionsDir: sessions,
			BridgeDir: w.bridge},
		Extension: filepath.Join(sc.Host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"),
		ProbeCwd:  probe}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.config = filepath.Join(dir, "pi.json")
	if err := os.WriteFile(w.config, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

// Paseo as it ships, with `paseo-policy pi` as its Pi command: the harness
// launches the command exactly as PiCliRuntime does, and every session
// runs the real Pi in gVisor through the supervisor.
func TestPaseoPiCommand(t *testing.T) {
	words := strings.Repeat("streaming ", 60)
	e := newEnv(t)
	const envCmd = "env; tr '\\0' '\\n' </proc/1/environ; cat /proc/self/environ | tr '\\0' '\\n'"
	e.mu.Lock()
	e.fm = fakemodel.New(fakemodel.Options{APIKey: apiKey, Scripts: map[string][]fakemodel.Turn{
		"tool:": {fakemodel.Bash(envCmd), fakemodel.WriteFile("PASEO.md", "written through paseo-policy pi\n"), fakemodel.Text("wrote it")},
		"slow:": {fakemodel.Slow(words, 60, 8*time.Second)},
	}})
	e.mu.Unlock()
	w := newPaseoWorld(t, e)
	mcpServers := map[string]any{"paseo": map[string]any{
		"url":     w.agentURL + "?callerAgentId=agent-paseo-1",
		"headers": map[string]string{"Authorization": "Bearer " + mcpToken}}}

	t.Run("probe", func(t *testing.T) {
		// listModels/isAvailable: `pi --mode rpc` from the daemon's home.
		s := w.run(t, "probe", map[string]any{"cwd": "/tmp"})
		if len(s.Models) == 0 || s.Models[0].ID != "fake-1" {
			t.Fatalf("models %+v; stderr %s", s.Models, s.Stderr)
		}
		t.Logf("probe (indicative, shared machine): get_available_models answered after %d ms, closed after %d ms", s.AnswerMs, s.TotalMs)
	})

	t.Run("turn", func(t *testing.T) {
		before := len(e.requests())
		s := w.run(t, "turn", map[string]any{"cwd": w.sc.Workspace(), "model": "fake/fake-1", "prompt": "tool: env and a file",
			"systemPrompt": "You are running in Paseo.", "mcpServers": mcpServers})
		all := strings.Join(rawStrings(s.Events), "\n")
		for _, want := range []string{`"toolName":"bash"`, `"toolName":"write"`, "PASEO_AGENT_ID=agent-paseo-1"} {
			if !strings.Contains(all, want) {
				t.Errorf("the turn's events lack %s; stderr %s", want, s.Stderr)
			}
		}
		if s.Text != "wrote it" {
			t.Errorf("text %q", s.Text)
		}
		for k, v := range decoys {
			if strings.Contains(all, v) {
				t.Errorf("the decoy %s reached the sandbox", k)
			}
		}
		if got, err := os.ReadFile(filepath.Join(w.sc.Workspace(), "PASEO.md")); err != nil || string(got) != "written through paseo-policy pi\n" {
			t.Errorf("PASEO.md: %q %v", got, err)
		}
		if !strings.HasPrefix(s.SessionFile, filepath.Join(w.sc.Host, "srv/paseo/state/pi-sessions/agent-paseo-1")+"/") {
			t.Errorf("session file %q", s.SessionFile)
		}
		if n := len(e.requests()) - before; n != 3 {
			t.Errorf("%d model requests, want 3", n)
		}
		// The deliberate close (stdin end, SIGTERM) left nothing.
		if l := w.list(t); len(l) != 0 {
			t.Errorf("sandboxes after a deliberate close: %+v", l)
		}
		if _, err := os.Stat(filepath.Join(w.bridge, "agent-paseo-1.json")); !os.IsNotExist(err) {
			t.Errorf("the agent's record after a deliberate close: %v", err)
		}
		t.Logf("session start (indicative): get_state answered %d ms after spawn", s.MS)
	})

	// The daemon's environment holds other providers' keys; Pi's own bash
	// RPC command prints its process's environment. Through the command
	// none of them is there; with the image's Pi run on the host as the Pi
	// command (the control: the daemon user's own Pi, as Paseo runs it
	// without the sandbox) every one is.
	t.Run("decoys", func(t *testing.T) {
		s := w.run(t, "bash-env", map[string]any{"cwd": w.sc.Workspace(), "model": "fake/fake-1"})
		if !strings.Contains(s.Text, "PASEO_AGENT_ID=") || !strings.Contains(s.Text, "PI_CODING_AGENT_DIR=") {
			t.Fatalf("no environment printed: %q (stderr %s)", s.Text, s.Stderr)
		}
		for k, v := range decoys {
			if strings.Contains(s.Text, v) {
				t.Errorf("the decoy %s reached the sandboxed Pi", k)
			}
		}
		// The control: as root (to chroot), a private mount namespace with
		// a fresh /tmp over the image's, the image's Pi as uid 1000.
		host := []string{"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
			`mount -t tmpfs tmpfs "$0/tmp" && exec /usr/sbin/chroot --userspec=1000:1000 "$0" /usr/bin/env HOME=/tmp PI_OFFLINE=1 /usr/local/bin/pi "$@"`, e.image.Rootfs}
		// unshare, sh, chroot and env exec in place: the pid is Pi's.
		cmd, r := w.harnessAs(t, 0, "bash-env", map[string]any{"cwd": "/", "command": host})
		st := readStep(t, r, "started")
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", st.PID))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range decoys {
			if !strings.Contains(string(environ), k+"="+v) {
				t.Errorf("control: the decoy %s is not in the host Pi's environment", k)
			}
		}
		if st.Provider == "fake" || st.Provider == "" {
			t.Errorf("control: the host Pi chose provider %q; a decoy key should have given it a real provider's model", st.Provider)
		}
		t.Logf("control: the host Pi took the decoy keys and chose provider %s", st.Provider)
		t.Logf("first get_state after the spawn (indicative, shared machine): %d ms sandboxed through paseo-policy pi, %d ms for the image's Pi on the host", s.MS, st.MS)
		readStep(t, r, "done")
		_ = cmd.Wait()
	})

	t.Run("refused", func(t *testing.T) {
		before := len(e.requests())
		sessions := filepath.Join(w.sc.Host, "srv/paseo/state/pi-sessions")
		entries := func() int { d, _ := os.ReadDir(sessions); return len(d) }
		dirs := entries()
		s := w.run(t, "refused", map[string]any{"cwd": "/", "model": "fake/fake-1"})
		if n := entries(); n != dirs {
			t.Errorf("the refused launch left a session dir behind (%d entries, %d before)", n, dirs)
		}
		if s.Request != "failed" || s.Exit.Code == nil || *s.Exit.Code == 0 {
			t.Fatalf("a refused launch: request %s, exit %+v", s.Request, s.Exit)
		}
		line := regexp.MustCompile(`^PP-[A-Z-]+ [a-zA-Z.\[\]0-9]*: .+$`)
		lines := strings.Split(strings.TrimSpace(s.Stderr), "\n")
		for _, l := range lines {
			if !line.MatchString(l) {
				t.Errorf("stderr line %q is not CODE path: message", l)
			}
		}
		if !strings.Contains(s.Stderr, "workspace.cwd") {
			t.Errorf("stderr names no workspace.cwd: %s", s.Stderr)
		}
		if n := len(e.requests()) - before; n != 0 || len(w.list(t)) != 0 {
			t.Errorf("a refused launch reached the model (%d requests) or left a sandbox", n)
		}
	})

	t.Run("unavailable", func(t *testing.T) {
		// The operator's configuration naming a socket nobody serves: exit
		// 4, one PP-PI-UNAVAILABLE line, no session dir left.
		var cfg pilaunch.Config
		data, err := os.ReadFile(w.config)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.Socket = filepath.Join(filepath.Dir(w.config), "nobody.sock")
		if data, err = json.Marshal(cfg); err != nil {
			t.Fatal(err)
		}
		other := filepath.Join(filepath.Dir(w.config), "pi-unavailable.json")
		if err := os.WriteFile(other, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sessions := filepath.Join(w.sc.Host, "srv/paseo/state/pi-sessions")
		entries := func() int { d, _ := os.ReadDir(sessions); return len(d) }
		dirs := entries()
		s := w.run(t, "refused", map[string]any{"cwd": w.sc.Workspace(), "model": "fake/fake-1",
			"command": []string{w.bin, "pi", "--config", other}})
		if s.Exit.Code == nil || *s.Exit.Code != 4 || !strings.HasPrefix(s.Stderr, "PP-PI-UNAVAILABLE supervisor: ") || strings.Count(s.Stderr, "\n") != 1 {
			t.Errorf("an unreachable supervisor: exit %+v, stderr %q", s.Exit, s.Stderr)
		}
		if n := entries(); n != dirs {
			t.Errorf("the unavailable launch left a session dir behind")
		}
	})

	t.Run("daemon-killed-mid-turn", func(t *testing.T) {
		// The killed daemon's last command (Pi's bash, answered 2 s later)
		// is answered while nobody is attached: its response frame waits
		// in the sandbox's output, with an id the new daemon uses again.
		opts := map[string]any{"cwd": w.sc.Workspace(), "model": "fake/fake-1", "prompt": "slow: stream", "deltas": 8, "mcpServers": mcpServers,
			"lateCommand": "sleep 2; echo late"}
		cmd, r := w.harness(t, "streaming", opts)
		started := readStep(t, r, "started")
		first := readStep(t, r, "streaming")
		// SIGKILL of the daemon's process tree: the harness and the command.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		l := w.list(t)
		if len(l) != 1 || l[0].Status == supervisor.StatusExited {
			t.Fatalf("after the kill: %+v", l)
		}
		time.Sleep(2500 * time.Millisecond) // the late command's answer is written meanwhile
		// Paseo comes back and resumes the agent with its session log; its
		// requests reach the killed daemon's last id.
		opts["session"] = started.SessionFile
		opts["untilId"] = first.Next
		delete(opts, "lateCommand")
		s := w.run(t, "resume", opts)
		if len(s.Strays) != 0 {
			t.Errorf("the respawned daemon got response frames it did not ask for: %q", s.Strays)
		}
		if !strings.Contains(s.Stderr, "paseo-policy pi: dropped") {
			t.Errorf("no stale response frame was dropped (the scene did not produce one?); stderr %q", s.Stderr)
		}
		rest := s.Text
		if !strings.HasSuffix(words, rest) || rest == "" {
			t.Fatalf("the respawn got %q, not the rest of the turn", rest)
		}
		if len(first.Text)+len(rest) < len(words) || !strings.HasPrefix(words, first.Text) {
			t.Errorf("text lost: %d before the kill + %d after < %d", len(first.Text), len(rest), len(words))
		}
		all := strings.Join(rawStrings(s.Events), "\n")
		if n := strings.Count(all, `"type":"agent_settled"`); n != 1 {
			t.Errorf("agent_settled %d times after the respawn", n)
		}
		if strings.Contains(all, `"type":"agent_start"`) {
			t.Error("the respawn replayed the turn's start: records before the persisted cursor came twice")
		}
		t.Logf("before the kill %d bytes, after the respawn %d bytes of %d", len(first.Text), len(rest), len(words))
		if l := w.list(t); len(l) != 0 {
			t.Errorf("sandboxes after the close: %+v", l)
		}
	})
}

func rawStrings(r []json.RawMessage) []string {
	out := make([]string, len(r))
	for i, m := range r {
		out[i] = string(m)
	}
	return out
}

// Git in Paseo's linked worktree through the command: a configuration with
// state.gitStoresDir makes the command claim the worktree's Git facts and
// the agent's store; the agent commits in the sandbox (into its store, the
// repository read-only), and the command imports the commit onto the
// worktree's branch at the turn's end, before Paseo sees agent_end: no
// manual import. A second turn's commit arrives too (the base carried).
// The host then moves the branch: the third turn's import is refused with
// PP-GIT-IMPORT-MOVED on stderr, the branch stays the host's, and the
// fourth turn still runs. Control: with gitImport off in the operator's
// configuration the same commit does not arrive.
func TestPaseoPiCommandGitWorktree(t *testing.T) {
	e := newEnv(t)
	commit := func(msg string) []fakemodel.Turn {
		return []fakemodel.Turn{fakemodel.Bash(`export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@example.test GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@example.test; ` +
			`echo ` + msg + ` >> agent.txt && git add agent.txt && git commit -q -m ` + msg + ` && echo commit-ok || echo commit-failed`),
			fakemodel.Text("committed")}
	}
	e.mu.Lock()
	e.fm = fakemodel.New(fakemodel.Options{APIKey: apiKey, Scripts: map[string][]fakemodel.Turn{
		"git1:": commit("by-agent-turn-1"), "git2:": commit("by-agent-turn-2"), "git3:": commit("by-agent-turn-3"),
		"gitoff:": commit("by-agent-import-off"), "hello:": {fakemodel.Text("still here")},
	}})
	e.mu.Unlock()
	w := newPaseoWorld(t, e)
	repo := filepath.Join(w.sc.Host, "srv/paseo/repos/paseo-proj")
	ws := filepath.Join(w.sc.Host, "srv/paseo/workspace/paseo-proj-agent")
	wsOff := filepath.Join(w.sc.Host, "srv/paseo/workspace/paseo-proj-off")
	common := filepath.Join(repo, ".git")
	initRepo(t, repo)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "agent-work", ws)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "agent-off", wsOff)
	chownTree(t, repo, daemonUID, daemonUID)
	chownTree(t, ws, daemonUID, daemonUID)
	chownTree(t, wsOff, daemonUID, daemonUID)
	stores := filepath.Join(w.sc.Host, "srv/paseo/state/pi-git")
	if err := os.MkdirAll(stores, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(stores, daemonUID, daemonUID); err != nil {
		t.Fatal(err)
	}
	writeConfig := func(name, gitImport string) string {
		var cfg map[string]any
		if err := json.Unmarshal(readFileBytes(t, w.config), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg["state"].(map[string]any)["gitStoresDir"] = stores
		if gitImport != "" {
			cfg["gitImport"] = gitImport
		}
		data, _ := json.Marshal(cfg)
		p := filepath.Join(filepath.Dir(w.config), name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gitConfig := writeConfig("pi-git.json", "")
	offConfig := writeConfig("pi-git-off.json", "off")
	mcpServers := func(agent string) map[string]any {
		return map[string]any{"paseo": map[string]any{
			"url":     w.agentURL + "?callerAgentId=" + agent,
			"headers": map[string]string{"Authorization": "Bearer " + mcpToken}}}
	}
	branchLog := func(ref string) string {
		got, err := deployGit(t, repo, "log", "--format=%s", ref)
		if err != nil {
			t.Fatalf("git log %s: %v %s", ref, err, got)
		}
		return got
	}
	base := hostRev(t, common, "refs/heads/agent-work")
	gate := filepath.Join(filepath.Dir(w.config), "gate")
	open := func(n int) {
		if err := os.WriteFile(fmt.Sprintf("%s.%d", gate, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd, r := w.harness(t, "turns", map[string]any{"command": []string{w.bin, "pi", "--config", gitConfig}, "cwd": ws, "model": "fake/fake-1",
		"prompts": []string{"git1: commit", "git2: commit", "git3: commit", "hello: after the refusal"}, "gate": gate, "mcpServers": mcpServers("agent-paseo-git")})

	// Turn 1: the commit is on the branch when Paseo has the turn's end.
	s := readStep(t, r, "settled")
	if all := strings.Join(rawStrings(s.Events), "\n"); !strings.Contains(all, "commit-ok") {
		t.Fatalf("the agent's commit in the linked worktree did not succeed; stderr %s\n%s", s.Stderr, tailOf(all, 2000))
	}
	if got := branchLog("refs/heads/agent-work"); !strings.HasPrefix(got, "by-agent-turn-1\n") {
		t.Fatalf("turn 1's commit is not on the worktree's branch at agent_settled: %q; stderr %s", got, s.Stderr)
	}
	if !strings.Contains(s.Stderr, "git import at turn-end: imported refs/heads/agent-work "+base+" -> ") {
		t.Errorf("no import line on stderr: %s", s.Stderr)
	}
	if got := hostRev(t, common, "refs/heads/main"); got != base {
		t.Errorf("main moved: %s", got)
	}
	if out, err := deployGit(t, repo, "fsck", "--strict", "--no-dangling"); err != nil {
		t.Errorf("fsck after the import: %v %s", err, out)
	}
	open(0)

	// Turn 2: its commit arrives on top (the base was carried).
	s = readStep(t, r, "settled")
	if got := branchLog("refs/heads/agent-work"); !strings.HasPrefix(got, "by-agent-turn-2\nby-agent-turn-1\n") {
		t.Fatalf("turn 2's commit did not arrive: %q; stderr %s", got, s.Stderr)
	}
	// The host moves the branch between turns (a person's commit in the
	// worktree).
	if out, err := deployGit(t, ws, "-c", "user.name=h", "-c", "user.email=h@example.test", "commit", "-q", "--allow-empty", "-m", "by-the-host"); err != nil {
		t.Fatalf("host commit: %v %s", err, out)
	}
	hostHead := hostRev(t, common, "refs/heads/agent-work")
	open(1)

	// Turn 3: committed in the sandbox, refused at the import, the
	// branch untouched.
	s = readStep(t, r, "settled")
	if all := strings.Join(rawStrings(s.Events), "\n"); !strings.Contains(all, "commit-ok") {
		t.Fatalf("turn 3's commit did not succeed in the sandbox; stderr %s", s.Stderr)
	}
	if got := hostRev(t, common, "refs/heads/agent-work"); got != hostHead {
		t.Errorf("a refused import moved the branch: %s, the host had %s", got, hostHead)
	}
	if !regexp.MustCompile(`(?m)^PP-GIT-IMPORT-MOVED refs/heads/agent-work: .*\(git import at turn-end: no ref was written\)$`).MatchString(s.Stderr) {
		t.Errorf("no PP-GIT-IMPORT-MOVED line on stderr: %s", s.Stderr)
	}
	open(2)

	// Turn 4: the session goes on.
	s = readStep(t, r, "settled")
	if !strings.Contains(s.Text, "still here") {
		t.Errorf("the turn after the refusal: %q; stderr %s", s.Text, s.Stderr)
	}
	open(3)
	s = readStep(t, r, "done")
	_ = cmd.Wait()
	if got := hostRev(t, common, "refs/heads/agent-work"); got != hostHead {
		t.Errorf("the branch moved at the sandbox's end: %s, the host had %s", got, hostHead)
	}
	if l := w.list(t); len(l) != 0 {
		t.Errorf("sandboxes after the close: %+v", l)
	}

	// Control: gitImport off. The commit is made in the store and does not
	// arrive; the command says nothing of an import.
	offBase := hostRev(t, common, "refs/heads/agent-off")
	before := repoBytes(t, common)
	off := w.run(t, "turn", map[string]any{"command": []string{w.bin, "pi", "--config", offConfig}, "cwd": wsOff, "model": "fake/fake-1",
		"prompt": "gitoff: commit", "mcpServers": mcpServers("agent-paseo-git-off")})
	if all := strings.Join(rawStrings(off.Events), "\n"); !strings.Contains(all, "commit-ok") {
		t.Fatalf("control: the agent's commit did not succeed; stderr %s", off.Stderr)
	}
	if got := hostRev(t, common, "refs/heads/agent-off"); got != offBase {
		t.Errorf("control: with gitImport off the branch moved to %s", got)
	}
	if after := repoBytes(t, common); after != before {
		t.Errorf("control: with gitImport off the repository was written")
	}
	if strings.Contains(off.Stderr, "git import") {
		t.Errorf("control: an import ran with gitImport off: %s", off.Stderr)
	}
	if l := w.list(t); len(l) != 0 {
		t.Errorf("sandboxes after the close: %+v", l)
	}
}

func readFileBytes(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
