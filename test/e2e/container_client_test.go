package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/fakemcp"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/runtime/supervisor"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// TestHelperOfficialContainer is the daemon inside the official container
// (TestPiOfficialContainer starts it through internal/testkit/testcontainer): it
// checks who it is and what it sees, writes what Paseo writes before a
// launch, serves the daemon's MCP on the published port, and drives the
// supervisor through the socket with the reference client.
func TestHelperOfficialContainer(t *testing.T) {
	raw := os.Getenv(envOfficialClient)
	if raw == "" {
		return
	}
	var oc officialClient
	if err := json.Unmarshal([]byte(raw), &oc); err != nil {
		t.Fatal(err)
	}
	checkContainerIdentity(t, oc)
	checkContainerView(t, oc)
	if oc.Mode == "no-group" {
		// The socket is 0660 root:<socket GID>: without group_add the
		// container's user cannot connect, bind mount or not.
		if _, err := supervisor.Dial(containerSocket); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("connecting without the socket's group: %v, want EACCES", err)
		}
		return
	}
	writeDaemonFiles(t)

	ln, err := net.FileListener(os.NewFile(3, "published-mcp"))
	if err != nil {
		t.Fatalf("the published MCP listener: %v", err)
	}
	daemon := fakemcp.New(mcpToken, listAgentsText)
	mcp := &http.Server{Handler: daemon}
	go mcp.Serve(ln)
	defer mcp.Close()
	// The container has a network namespace of its own: the host's
	// loopback, where the published port is, is not its loopback.
	if c, err := net.DialTimeout("tcp4", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatalf("the container reached the host's loopback %s", ln.Addr())
	}

	c := ctx(t)
	cl, err := supervisor.Dial(containerSocket)
	if err != nil {
		t.Fatalf("dialing the bind-mounted socket: %v", err)
	}
	defer cl.Close()
	create := func(deployment string, facts []byte) (supervisor.Info, error) {
		var in supervisor.Info
		err := cl.Call(c, supervisor.Request{Op: "createSandbox", Deployment: deployment, Facts: facts, MCPToken: mcpToken}, &in)
		return in, err
	}
	patched := func(patch string) []byte {
		out, err := testtree.MergePatch(oc.Facts, []byte(patch))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	// Refusals: each changes nothing and carries a stable code (and, for
	// the compiler's, its PP-* code and the fact path).
	for _, r := range []struct {
		name, deployment string
		facts            []byte
		code             rpcerr.Code
		detail           string // "PP-CODE fact.path" of one of the refusal's diagnostics
	}{
		{"a host path", dockerID, patched(`{"workspace":{"cwd":"` + oc.HostWorkspace + `"}}`), rpcerr.Refused, "PP-PATH-UNMAPPED workspace.cwd"},
		{"another deployment's id", otherID, patched(`{"deployment":{"id":"` + otherID + `"}}`), rpcerr.Forbidden, ""},
		{"another deployment's id in the facts", dockerID, patched(`{"deployment":{"id":"` + otherID + `"}}`), rpcerr.Forbidden, ""},
		{"/home/paseo for Pi's state (the image's default agent dir)", dockerID, patched(`{"state":{"agentDir":"/home/paseo/.pi/agent"}}`), rpcerr.Refused, "PP-PATH-FORBIDDEN state.agentDir"},
		{"/home/paseo as the workspace", dockerID, patched(`{"workspace":{"cwd":"/home/paseo"}}`), rpcerr.Refused, "PP-PATH-FORBIDDEN workspace.cwd"},
		{"/home/paseo/.paseo for the extension", dockerID, patched(`{"launch":{"extension":"/home/paseo/.paseo/ext.mjs"}}`), rpcerr.Refused, "PP-PATH-FORBIDDEN launch.extension"},
	} {
		_, err := create(r.deployment, r.facts)
		var se *supervisor.Error
		code, path, _ := strings.Cut(r.detail, " ")
		if !errors.As(err, &se) || se.Code != r.code || (r.detail != "" && !slices.ContainsFunc(se.Diagnostics, func(d diag.Diagnostic) bool {
			return string(d.Code) == code && d.Path == path
		})) {
			t.Errorf("%s: %v (diagnostics %+v), want %s %q", r.name, err, se, r.code, r.detail)
		}
	}
	var none []supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "list"}, &none); err != nil || len(none) != 0 {
		t.Fatalf("after the refusals: %v %v", none, err)
	}

	in, err := create(dockerID, oc.Facts)
	if err != nil {
		t.Fatalf("createSandbox from container paths: %v", err)
	}
	// The sandbox's holder socket and runsc's state exist now, on the host.
	for _, p := range []string{filepath.Join(oc.HolderDir, in.Sandbox+".sock"), filepath.Join(filepath.Dir(oc.HolderDir), "runsc", in.Sandbox)} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the container sees %s: %v", p, err)
		}
	}
	var att struct{ Epoch uint64 }
	if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: in.Sandbox}, &att); err != nil {
		t.Fatal(err)
	}
	tr := &stream{}
	prompt := func(id, message string) {
		line := `{"id":"` + id + `","type":"prompt","message":"` + message + `"}` + "\n"
		if err := cl.Call(c, supervisor.Request{Op: "write", Sandbox: in.Sandbox, Epoch: att.Epoch, InputID: id, Data: []byte(line)}, nil); err != nil {
			t.Fatal(err)
		}
		if !tr.until(t, cl, in.Sandbox, `"agent_settled"`, 120*time.Second) {
			t.Fatalf("the turn %q never settled: %q", message, tr.tail())
		}
		tr.from = tr.Stdout.Len()
	}
	prompt("p1", "call the paseo tool")
	if !strings.Contains(tr.Stdout.String(), "agents listed by paseo") {
		t.Errorf("the MCP tool's answer did not come back through the route: %q", tr.tail())
	}
	seen := daemon.Requests()
	var calls int
	for _, s := range seen {
		// The route proxy added the daemon's bearer; the sandbox never had it.
		if !strings.HasPrefix(s, "POST /mcp/agents?callerAgentId=agent-b2 Bearer "+mcpToken+" ") {
			t.Errorf("the daemon's MCP listener got %q", s)
		}
		if strings.HasSuffix(s, " tools/call list_agents") {
			calls++
		}
	}
	if calls != 1 {
		t.Errorf("tools/call reached the daemon %d times, want 1: %q", calls, seen)
	}

	// The supervisor restarts (an upgrade): the daemon's connection drops.
	// The socket the container bound is the one systemd keeps, so the same
	// path reaches the new supervisor, which adopted the sandbox from its
	// holder; the daemon reattaches from its last acknowledged record.
	cl.Close()
	if _, err := os.NewFile(4, "ask").WriteString("restart-supervisor\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(os.NewFile(5, "done")).ReadString('\n'); err != nil || line != "restarted\n" {
		t.Fatalf("waiting for the supervisor restart: %q %v", line, err)
	}
	if cl, err = supervisor.Dial(containerSocket); err != nil {
		t.Fatalf("the bound socket after a supervisor restart: %v", err)
	}
	defer cl.Close()
	var got supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil || got.Status != supervisor.StatusRunningUnattached {
		t.Fatalf("after the supervisor restart: %+v %v", got, err)
	}
	// The daemon hands its MCP token over again on every attach (it is
	// the same daemon run here; only the supervisor restarted).
	if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor, MCPToken: mcpToken}, &att); err != nil {
		t.Fatal(err)
	}
	prompt("p2", "write a file")
	var st unix.Stat_t
	if err := unix.Stat("/workspace/app/made-in-container.txt", &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("the agent's file in the container's /workspace: %+v %v", st, err)
	}
	if err := cl.Call(c, supervisor.Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	if err := cl.Call(c, supervisor.Request{Op: "list"}, &none); err != nil || len(none) != 0 {
		t.Errorf("after delete: %v %v", none, err)
	}
	os.Stdout.WriteString("official-client: done\n")
}

// checkContainerIdentity: uid 1000, gid 1000, the socket's GID only as a
// supplementary group (in daemon mode), a child of the container's pid 1.
func checkContainerIdentity(t *testing.T, oc officialClient) {
	t.Helper()
	if os.Getuid() != 1000 || os.Geteuid() != 1000 || os.Getgid() != 1000 || os.Getegid() != 1000 {
		t.Fatalf("running as %d/%d:%d/%d, want 1000:1000", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid())
	}
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	if want := oc.Mode == "daemon"; slices.Contains(groups, int(oc.SocketGID)) != want {
		t.Fatalf("supplementary groups %v (socket GID %d expected: %v)", groups, oc.SocketGID, want)
	}
	if os.Getppid() != 1 {
		t.Fatalf("pid %d, parent %d: not in the container's pid namespace", os.Getpid(), os.Getppid())
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	if want := []string{"1", strconv.Itoa(os.Getpid())}; !slices.Equal(pids, want) {
		t.Errorf("the container's /proc shows processes %v, want only its own %v", pids, want)
	}
}

// checkContainerView: the host paths the test names do not exist here,
// /run holds the socket alone, and no other socket is reachable anywhere
// in the container's tree.
func checkContainerView(t *testing.T, oc officialClient) {
	t.Helper()
	for _, p := range oc.Hidden {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the container sees the host's %s: %v", p, err)
		}
	}
	for dir, want := range map[string][]string{"/run": {"paseo-sandbox"}, "/run/paseo-sandbox": {"supervisor.sock"}} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, want) {
			t.Errorf("the container's %s holds %v, want %v", dir, names, want)
		}
	}
	var sockets []string
	err := filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "/proc" || p == "/usr" {
			return fs.SkipDir // the kernel's view of this pid namespace; the image's OS
		}
		// Lstat, not the directory entry's type: a mount point's entry
		// names what was there before the bind.
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSocket != 0 {
			sockets = append(sockets, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sockets, []string{containerSocket}) {
		t.Errorf("sockets in the container's view: %v, want the supervisor's alone", sockets)
	}
}

// writeDaemonFiles writes what Paseo writes before a launch, as the
// container's user and at container paths: Pi's models and settings, the
// generated extension (0600, as Paseo writes it) and its own MCP config.
func writeDaemonFiles(t *testing.T) {
	t.Helper()
	for p, content := range map[string]string{
		"/paseo-state/pi-agent/models.json": `{"providers":{"fake":{"baseUrl":"` + modelURL + `","api":"openai-completions",
 "apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},
 "models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}`,
		"/paseo-state/pi-agent/settings.json":              `{"packages":["/opt/pi/node_modules/pi-mcp-adapter"]}`,
		"/tmp/paseo-pi-extension-b2/paseo-integration.mjs": "export default function () {}\n",
		"/tmp/paseo-pi-mcp-b2/mcp.json":                    `{"mcpServers":{"paseo":{"url":"http://127.0.0.1:6767/mcp/agents"}}}`,
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
