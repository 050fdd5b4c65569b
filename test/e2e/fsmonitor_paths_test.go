package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// fsmonitorOff is the registry patch that turns the workspace monitor off
// for the scenes' deployment (deployments.<id>.fsmonitor).
const fsmonitorOff = `{"deployments":{"host-alice":{"fsmonitor":"off"}}}`

// The workspace monitor on the supervisor's path (createSandbox, the
// product's default for pi-session in network mode sandbox, no option of
// anyone's): Pi's bash runs git status in the linked worktree, the host
// then makes a file, and the next status, traced (GIT_TRACE_FSMONITOR),
// ran the hook, which returned the host's file by name (the watcher's
// list, not a full scan's "everything"), and the status shows it. Control:
// the same with the registry's switch off has no core.fsmonitor, runs no
// hook, and still shows the host's file (a full scan).
func TestFSMonitorThroughSupervisor(t *testing.T) {
	e := newEnv(t)
	repo := filepath.Join(e.host, "srv/paseo/repos/proj")
	ws := filepath.Join(e.host, "srv/paseo/workspace/proj-feature")
	initRepo(t, repo)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "feature", ws)
	sc := e.scene(t, "pi-session", "")
	chownTree(t, repo, daemonUID, daemonUID)
	chownTree(t, ws, daemonUID, daemonUID)
	searchable(t, filepath.Join(repo, ".git"))

	for _, tc := range []struct {
		name, patch string
		on          bool
	}{{"on", "", true}, {"off", fsmonitorOff, false}} {
		t.Run(tc.name, func(t *testing.T) {
			registry := sc.Registry
			if tc.patch != "" {
				var err error
				if registry, err = testtree.MergePatch(sc.Registry, []byte(tc.patch)); err != nil {
					t.Fatal(err)
				}
			}
			socket := startSupervisor(t, e, registry, sc.Runsc)
			c := ctx(t)
			cl := dialAs(t, socket, daemonUID)
			var in supervisor.Info
			if err := cl.Call(c, supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts}, &in); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cl.Call(context.Background(), supervisor.Request{Op: "delete", Sandbox: in.Sandbox}, nil) })
			var att struct{ Epoch uint64 }
			if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: in.Sandbox}, &att); err != nil {
				t.Fatal(err)
			}
			tr := &stream{}
			bash := func(id, command string) string {
				t.Helper()
				line := `{"id":"` + id + `","type":"bash","command":` + jsonString(t, "cd "+ws+" && "+command+"; echo done-"+id) + `}` + "\n"
				if err := cl.Call(c, supervisor.Request{Op: "write", Sandbox: in.Sandbox, Epoch: att.Epoch, InputID: id, Data: []byte(line)}, nil); err != nil {
					t.Fatal(err)
				}
				if !tr.until(t, cl, in.Sandbox, "done-"+id, 90*time.Second) {
					t.Fatalf("bash %s: %q", id, tr.tail())
				}
				out := tr.Stdout.String()[tr.from:]
				tr.from = tr.Stdout.Len()
				return out
			}
			out := bash("s1", "git config core.fsmonitor; git status --porcelain >/dev/null 2>&1 && echo status-ok")
			if !strings.Contains(out, "status-ok") {
				t.Fatalf("the first status: %q", out)
			}
			if got := strings.Contains(out, "/run/paseo/fsmonitor/hook"); got != tc.on {
				t.Errorf("core.fsmonitor names the hook: %v, want %v: %q", got, tc.on, out)
			}
			// The host's edit while the sandbox runs (Paseo's daemon, a
			// person's editor).
			write(t, filepath.Join(ws, "from-host.txt"), "host\n")
			if err := os.Chown(filepath.Join(ws, "from-host.txt"), daemonUID, daemonUID); err != nil {
				t.Fatal(err)
			}
			out = bash("s2", "GIT_TRACE_FSMONITOR=1 git status --porcelain 2>&1")
			if !strings.Contains(out, "?? from-host.txt") {
				t.Errorf("the status after the host's edit lacks it: %q", out)
			}
			ran := strings.Contains(out, "returned success")
			listed := strings.Contains(out, "fsmonitor_refresh_callback 'from-host.txt'")
			if ran != tc.on || listed != tc.on {
				t.Errorf("the hook ran: %v, listed the host's file: %v; want %v: %q", ran, listed, tc.on, out)
			}
		})
	}
}

// startSupervisor serves registry on a socket of its own, with a state
// root of its own, for the daemon's group.
func startSupervisor(t *testing.T, e *env, registry []byte, runsc string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "paseo-e2e-fsmon-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "supervisor.sock")
	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: registry},
		Socket: socket, SocketGID: daemonUID, StateRoot: state, RunscPath: runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Listen(sctx) }()
	t.Cleanup(func() { cancel(); srv.Shutdown() })
	dialSupervisor(t, socket).Close() // up
	// Root's dial can win the race with the socket's chown and chmod,
	// which come right after its bind: wait for the daemon's group too.
	for i := 0; ; i++ {
		var st unix.Stat_t
		if err := unix.Stat(socket, &st); err == nil && st.Gid == daemonUID && st.Mode&0o060 == 0o060 {
			break
		}
		if i == 250 {
			t.Fatalf("the supervisor's socket %s never became the daemon group's", socket)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return socket
}

// jsonString is s as a JSON string.
func jsonString(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The workspace monitor on Paseo's command path (`paseo-policy pi`, which
// the harness runs as Paseo's Pi command; its facts go to the supervisor,
// whose compile grants the monitor by default): the agent's turn runs git
// status, writes a file, and runs a traced status, which ran the hook, and
// the hook returned the agent's file by name (the watcher saw the write
// through the workspace bind). Control: the same turn through a
// supervisor whose registry turns the monitor off runs no hook and still
// lists the file (a full scan).
func TestPaseoPiCommandFSMonitor(t *testing.T) {
	e := newEnv(t)
	e.mu.Lock()
	look := []fakemodel.Turn{fakemodel.Bash(`git status --porcelain >/dev/null 2>&1; echo agent > from-agent.txt; GIT_TRACE_FSMONITOR=1 git status --porcelain 2>&1; echo traced-status-done`),
		fakemodel.Text("looked")}
	e.fm = fakemodel.New(fakemodel.Options{APIKey: apiKey, Scripts: map[string][]fakemodel.Turn{"fsm-on:": look, "fsm-off:": look}})
	e.mu.Unlock()
	w := newPaseoWorld(t, e)
	repo := filepath.Join(w.sc.Host, "srv/paseo/repos/paseo-fsm")
	ws := filepath.Join(w.sc.Host, "srv/paseo/workspace/paseo-fsm-on")
	wsOff := filepath.Join(w.sc.Host, "srv/paseo/workspace/paseo-fsm-off")
	initRepo(t, repo)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "fsm-on", ws)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "fsm-off", wsOff)
	for _, d := range []string{repo, ws, wsOff} {
		chownTree(t, d, daemonUID, daemonUID)
	}
	chmodUp(t, repo, "/tmp")
	stores := filepath.Join(w.sc.Host, "srv/paseo/state/pi-git")
	if err := os.MkdirAll(stores, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(stores, daemonUID, daemonUID); err != nil {
		t.Fatal(err)
	}
	// The Git store makes the worktree's index the sandbox's own, so its
	// git keeps the monitor's token between commands.
	writeConfig := func(name, socket string) string {
		var cfg map[string]any
		if err := json.Unmarshal(readFileBytes(t, w.config), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg["state"].(map[string]any)["gitStoresDir"] = stores
		cfg["socket"] = socket
		data, _ := json.Marshal(cfg)
		p := filepath.Join(filepath.Dir(w.config), name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	offRegistry, err := testtree.MergePatch(w.sc.Registry, []byte(fsmonitorOff))
	if err != nil {
		t.Fatal(err)
	}
	offSocket := startSupervisor(t, e, offRegistry, w.sc.Runsc)
	turn := func(config, cwd, agent, prompt string) string {
		t.Helper()
		s := w.run(t, "turn", map[string]any{"command": []string{w.bin, "pi", "--config", config}, "cwd": cwd, "model": "fake/fake-1",
			"prompt": prompt, "mcpServers": map[string]any{"paseo": map[string]any{
				"url":     w.agentURL + "?callerAgentId=" + agent,
				"headers": map[string]string{"Authorization": "Bearer " + mcpToken}}}})
		all := strings.Join(rawStrings(s.Events), "\n")
		if !strings.Contains(all, "traced-status-done") || !strings.Contains(all, "?? from-agent.txt") {
			t.Fatalf("the turn's traced status did not run or lacks the agent's file; stderr %s\n%s", s.Stderr, tailOf(all, 3000))
		}
		return all
	}

	on := turn(writeConfig("pi-fsm.json", w.socket), ws, "agent-fsm-on", "fsm-on: look")
	if !strings.Contains(on, "returned success") || !strings.Contains(on, "fsmonitor_refresh_callback 'from-agent.txt'") {
		t.Errorf("the monitor did not answer the sandbox's git with the agent's file:\n%s", tailOf(on, 3000))
	}
	off := turn(writeConfig("pi-fsm-off.json", offSocket), wsOff, "agent-fsm-off", "fsm-off: look")
	if strings.Contains(off, "returned success") || strings.Contains(off, "fsmonitor_refresh_callback") {
		t.Errorf("control (off): a hook ran:\n%s", tailOf(off, 3000))
	}
}
