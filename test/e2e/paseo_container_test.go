package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testcontainer"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/pilaunch"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// containerWords is the slow turn the container's daemon is killed in.
var containerWords = strings.Repeat("contained ", 60)

// envPaseoContainer carries the harness runs to TestHelperPaseoContainer.
const envPaseoContainer = "PASEO_E2E_PASEO_CONTAINER"

type containerRun struct {
	Scenario string         `json:"scenario"`
	Opts     map[string]any `json:"opts"`
}

// The official Paseo container's topology with paseo-policy pi as Paseo's
// Pi command inside it: the daemon side (the harness, the command) runs in
// its own mount, pid and network namespaces as uid 1000, with the socket
// file alone bound into /run, the socket's GID as a supplementary group,
// Compose's binds (/workspace, /paseo-state, /tmp), the command's binary
// and the operator's configuration (root's, read-only) bound in. The
// configuration names container paths; the registry maps them. A turn with
// tool calls lands in the mapped host workspace; a cwd no mapping covers is
// refused with its diagnostic lines.
func TestPaseoPiCommandOfficialContainer(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not on PATH; scripts/deps.sh (make deps) installs it")
	}
	e := newEnv(t)
	const envCmd = "env; tr '\\0' '\\n' </proc/1/environ"
	e.mu.Lock()
	e.fm = fakemodel.New(fakemodel.Options{APIKey: apiKey, Scripts: map[string][]fakemodel.Turn{
		"tool:": {fakemodel.Bash(envCmd), fakemodel.WriteFile("PASEO.md", "written in the official container\n"), fakemodel.Text("wrote it")},
		"slow:": {fakemodel.Slow(containerWords, 60, 8*time.Second)},
	}})
	e.mu.Unlock()

	run, err := os.MkdirTemp("/run", "paseo-e2e-pi-official-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	_ = os.Chmod(run, 0o755)
	socket := filepath.Join(run, "supervisor.sock")
	erofs, err := json.Marshal(e.image.Erofs)
	if err != nil {
		t.Fatal(err)
	}
	// Outside /tmp: a host path beneath /tmp would also be a container path.
	base, err := os.MkdirTemp("/var/tmp", "paseo-e2e-pi-official-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e.host = filepath.Join(base, "host")
	sc := testbundle.New(t, testbundle.Options{Host: e.host, Rootfs: e.image.Rootfs,
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"erofs":%s},
			"deployments":{%q:{"peers":{"uids":[1000,0],"gids":[1000]},"daemon":{"mcpUpstream":"http://127.0.0.1:%d"}}}}`,
			e.image.Version, e.image.Digest, erofs, dockerID, e.daemon.port),
		FactsPatch: fmt.Sprintf(`{"model":{"baseURL":%q},"mcp":{"agentsURL":"http://127.0.0.1:6767/mcp/agents"}}`, modelURL)})
	docker := filepath.Join(sc.Host, "srv/paseo-docker")
	for _, d := range []string{"workspace/app", "workspace/probe", "state/pi-sessions", "tmp/paseo-pi-extension-b2"} {
		if err := os.MkdirAll(filepath.Join(docker, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeAgentFiles(t, filepath.Join(docker, "state/pi-agent"))
	write(t, filepath.Join(docker, "tmp/paseo-pi-extension-b2/paseo-integration.mjs"), "export default function () {}\n")
	if err := os.Mkdir(filepath.Join(docker, "state/pi-bridge"), 0o700); err != nil {
		t.Fatal(err)
	}
	chownTree(t, docker, 1000, 1000)

	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		Socket: socket, SocketGID: officialSocketGID, StateRoot: filepath.Join(run, "state"), RunscPath: sc.Runsc,
		Secrets: dockerSecrets, Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := contextWithCancel()
	go func() { _ = srv.Listen(sctx) }()
	t.Cleanup(func() { cancel(); srv.Shutdown() })

	// The operator's configuration, in container paths, root's.
	cfg := pilaunch.Config{Socket: containerSocket, Deployment: dockerID, WorkspaceID: "wks_b2",
		Models: map[string]pilaunch.ModelRoute{"fake": {BaseURL: modelURL, API: "openai-completions",
			Mode: "api-key", Env: "FAKE_LLM_KEY", SecretRef: "alice/fake-llm"}},
		DefaultModel: "fake/fake-1",
		MCP:          &pilaunch.MCPRoute{AgentsURL: "http://127.0.0.1:6767/mcp/agents", TokenRef: "paseo/mcp-token"},
		State: pilaunch.StateDirs{AgentDir: "/paseo-state/pi-agent", SessionsDir: "/paseo-state/pi-sessions",
			BridgeDir: "/paseo-state/pi-bridge"},
		Extension: "/tmp/paseo-pi-extension-b2/paseo-integration.mjs",
		ProbeCwd:  "/workspace/probe"}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(run, "pi.json")
	if err := os.WriteFile(cfgFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := testbundle.BuildStatic(t, "./cmd/paseo-policy")
	command := []string{"/opt/paseo-policy", "pi", "--config", "/etc/paseo-sandbox/pi.json"}
	mcpServers := map[string]any{"paseo": map[string]any{
		"url":     "http://127.0.0.1:6767/mcp/agents?callerAgentId=agent-b2",
		"headers": map[string]string{"Authorization": "Bearer " + mcpToken}}}
	runs := []containerRun{
		{"turn", map[string]any{"command": command, "cwd": "/workspace/app", "model": "fake/fake-1", "prompt": "tool: in the container", "mcpServers": mcpServers}},
		{"refused", map[string]any{"command": command, "cwd": "/opt", "model": "fake/fake-1"}},
		// The daemon's process tree SIGKILLed mid-turn inside the container,
		// then a respawn with --session (the helper does both).
		{"kill-resume", map[string]any{"command": command, "cwd": "/workspace/app", "model": "fake/fake-1", "prompt": "slow: in the container", "deltas": 8, "mcpServers": mcpServers,
			"lateCommand": "sleep 2; echo late"}},
	}
	raw, err := json.Marshal(runs)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=/home/paseo", "PATH=/usr/bin:/bin", envPaseoContainer + "=" + string(raw)}
	for k, v := range decoys {
		env = append(env, k+"="+v)
	}
	spec := testcontainer.Spec{
		Root:  t.TempDir(),
		Tmpfs: []string{"/run", "/home/paseo"},
		Binds: []testcontainer.Bind{
			{Host: filepath.Join(docker, "workspace"), Container: "/workspace"},
			{Host: filepath.Join(docker, "state"), Container: "/paseo-state"},
			{Host: filepath.Join(docker, "tmp"), Container: "/tmp"},
			{Host: socket, Container: containerSocket},
			{Host: bin, Container: "/opt/paseo-policy", ReadOnly: true},
			{Host: testbundle.Repo(t, "test/paseoharness/harness.mjs"), Container: "/opt/harness.mjs", ReadOnly: true},
			{Host: cfgFile, Container: "/etc/paseo-sandbox/pi.json", ReadOnly: true},
		},
		UID: 1000, GID: 1000, Groups: []uint32{officialSocketGID},
		Argv: []string{"paseo-daemon", "-test.run=^TestHelperPaseoContainer$", "-test.v", "-test.timeout=5m"},
		Env:  env,
	}
	out, err := testcontainer.Run(spec, 6*time.Minute)
	if err != nil {
		t.Fatalf("the container: %v\n%s", err, out)
	}
	steps := map[string]step{}
	sc2 := bufio.NewScanner(bytes.NewReader(out))
	sc2.Buffer(make([]byte, 1<<20), 16<<20)
	for sc2.Scan() {
		var r struct {
			Run string `json:"run"`
			step
		}
		if json.Unmarshal(sc2.Bytes(), &r) == nil && r.Run != "" {
			steps[r.Run] = r.step
		}
	}
	turn, refused := steps["turn"], steps["refused"]
	t.Logf("inside the container: the turn answered %q (first get_state %d ms after the spawn, indicative); the refused launch said %q", turn.Text, turn.MS, strings.TrimSpace(refused.Stderr))
	all := strings.Join(rawStrings(turn.Events), "\n")
	for _, want := range []string{`"toolName":"bash"`, `"toolName":"write"`, "PASEO_AGENT_ID=agent-b2", "PASEO_AGENT_CWD=/workspace/app"} {
		if !strings.Contains(all, want) {
			t.Errorf("the container's turn lacks %s\n%s", want, out)
		}
	}
	for k, v := range decoys {
		if strings.Contains(all, v) {
			t.Errorf("the decoy %s reached the sandbox", k)
		}
	}
	host := filepath.Join(docker, "workspace/app/PASEO.md")
	if got, err := os.ReadFile(host); err != nil || string(got) != "written in the official container\n" {
		t.Errorf("PASEO.md in the mapped host workspace: %q %v", got, err)
	} else if uid, gid := ownerOf(t, host); uid != 1000 || gid != 1000 {
		t.Errorf("PASEO.md owned by %d:%d", uid, gid)
	}
	if !strings.HasPrefix(turn.SessionFile, "/paseo-state/pi-sessions/agent-b2/") {
		t.Errorf("session file %q (a container path)", turn.SessionFile)
	}
	if refused.Request != "failed" || refused.Exit.Code == nil || *refused.Exit.Code == 0 || !strings.Contains(refused.Stderr, "PP-PATH-UNMAPPED workspace.cwd: ") {
		t.Errorf("a cwd no mapping covers: %+v", refused)
	}
	kill := steps["kill-resume"]
	if !strings.HasSuffix(containerWords, kill.Text) || kill.Text == "" || len(kill.Text)+kill.Before < len(containerWords) {
		t.Errorf("after the kill inside the container the respawn got %d bytes (%d before the kill) of %d", len(kill.Text), kill.Before, len(containerWords))
	}
	if n := strings.Count(strings.Join(rawStrings(kill.Events), "\n"), `"type":"agent_settled"`); n != 1 {
		t.Errorf("agent_settled %d times after the respawn in the container", n)
	}
	if len(kill.Strays) != 0 || !strings.Contains(kill.Stderr, "paseo-policy pi: dropped") {
		t.Errorf("the killed daemon's late answer inside the container: the respawn got %q, its command's stderr %q (want none, and the drop counted)", kill.Strays, kill.Stderr)
	}
	t.Logf("inside the container: %d bytes before the kill, %d after the respawn, of %d", kill.Before, len(kill.Text), len(containerWords))
	cl := dialSupervisor(t, socket)
	var l []supervisor.Info
	if err := cl.Call(ctx(t), supervisor.Request{Op: "list"}, &l); err != nil || len(l) != 0 {
		t.Errorf("sandboxes left: %+v %v", l, err)
	}
}

// TestHelperPaseoContainer is the container's daemon side: it runs the
// harness for each run and prints its steps, tagged, on stdout.
func TestHelperPaseoContainer(t *testing.T) {
	raw := os.Getenv(envPaseoContainer)
	if raw == "" {
		return
	}
	var runs []containerRun
	if err := json.Unmarshal([]byte(raw), &runs); err != nil {
		t.Fatal(err)
	}
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPaseoContainer+"=") {
			env = append(env, kv)
		}
	}
	for _, r := range runs {
		if r.Scenario == "kill-resume" {
			killResume(t, env, r.Opts)
			continue
		}
		opts, err := json.Marshal(r.Opts)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("/usr/bin/node", "/opt/harness.mjs", r.Scenario, string(opts))
		cmd.Env = env
		cmd.Dir = "/tmp"
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Errorf("%s: %v\n%s\n%s", r.Scenario, err, out, stderr.String())
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var s map[string]any
			if json.Unmarshal([]byte(line), &s) == nil && s["step"] == "done" {
				s["run"] = r.Scenario
				b, _ := json.Marshal(s)
				fmt.Println(string(b))
			} else if line != "" {
				fmt.Println("harness:", line)
			}
		}
	}
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// killResume is the daemon killed mid-turn and started again, inside the
// container: the harness streams a turn in a process group of its own,
// which is SIGKILLed (harness and command), then a respawn resumes the
// session and prints what it got.
func killResume(t *testing.T, env []string, o map[string]any) {
	opts, _ := json.Marshal(o)
	cmd := exec.Command("/usr/bin/node", "/opt/harness.mjs", "streaming", string(opts))
	cmd.Env, cmd.Dir = env, "/tmp"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	started := readStep(t, r, "started")
	first := readStep(t, r, "streaming")
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	time.Sleep(2500 * time.Millisecond) // the late command's answer is written meanwhile
	o["session"] = started.SessionFile
	o["untilId"] = first.Next
	delete(o, "lateCommand")
	opts, _ = json.Marshal(o)
	res := exec.Command("/usr/bin/node", "/opt/harness.mjs", "resume", string(opts))
	res.Env, res.Dir = env, "/tmp"
	got, err := res.Output()
	if err != nil {
		t.Errorf("resume: %v\n%s", err, got)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(got)), "\n") {
		var s map[string]any
		if json.Unmarshal([]byte(line), &s) == nil && s["step"] == "done" {
			s["run"], s["before"] = "kill-resume", len(first.Text)
			b, _ := json.Marshal(s)
			fmt.Println(string(b))
		}
	}
}
