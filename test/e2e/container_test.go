package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testcontainer"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

const (
	// The socket's group, which the container gets only through group_add:
	// deliberately not the container user's own gid.
	officialSocketGID = 4244
	// Where the official container finds the socket (compose snippet).
	containerSocket = "/run/paseo-sandbox/supervisor.sock"
	// Deployment ids of the registry the test runs.
	dockerID = "docker-official"
	otherID  = "host-alice"
)

// The official Paseo container, for real: the daemon side runs as the
// official image runs it, in its own mount, pid and network namespaces as
// uid 1000,
// with /workspace, /home/paseo, /paseo-state and /tmp bound from host dirs,
// the supervisor socket file (and nothing else of the host's /run) bound
// into a fresh /run, and the socket's GID as a supplementary group only.
// Its fake MCP listener is on the "published" port the registry's
// daemon.mcpUpstream names. From inside, the client sees none of the
// supervisor's state, runsc root or other sockets, cannot connect without
// the group, is refused for a host path, another deployment's id and
// /home/paseo, and creates a sandbox from container paths in which the real
// Pi makes an MCP tool call through the route, gets the daemon's answer and
// writes a file that lands in the host workspace owned by 1000:1000.
func TestPiOfficialContainer(t *testing.T) {
	e := newEnv(t,
		fakemodel.Turn{ToolCalls: []fakemodel.ToolCall{{Name: "mcp", Arguments: map[string]any{"tool": "paseo_list_agents", "args": "{}"}}}},
		fakemodel.Text("called"),
		fakemodel.WriteFile("made-in-container.txt", "from the official container\n"),
		fakemodel.Text("wrote"),
	)
	// The container's published MCP port: the test binds it on the host's
	// loopback and hands the listener to the daemon inside, as Docker's
	// port publishing makes the container's listener reachable there.
	published, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer published.Close()
	port := published.Addr().(*net.TCPAddr).Port

	// The supervisor's directory as the systemd unit lays it out: the
	// socket beside the state root (which holds runsc's root and the
	// holders' sockets). Only the socket file goes into the container.
	run, err := os.MkdirTemp("/run", "paseo-e2e-official-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	if err := os.Chmod(run, 0o755); err != nil {
		t.Fatal(err)
	}
	socket, state := filepath.Join(run, "supervisor.sock"), filepath.Join(run, "state")
	erofs, err := json.Marshal(e.image.Erofs)
	if err != nil {
		t.Fatal(err)
	}
	// The host tree lives outside /tmp: a host path beneath /tmp would
	// also be a container path under the /tmp mapping.
	base, err := os.MkdirTemp("/var/tmp", "paseo-e2e-official-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e.host = filepath.Join(base, "host")
	sc := testbundle.New(t, testbundle.Options{Host: e.host, Rootfs: e.image.Rootfs,
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"erofs":%s},
			"deployments":{%q:{"peers":{"uids":[4301],"gids":[4301]}},
				%q:{"peers":{"uids":[1000],"gids":[1000]},"daemon":{"mcpUpstream":"http://127.0.0.1:%d"}}},
			"supervisor":{"socket":%q,"stateDir":%q,"runscRoot":%q}}`,
			e.image.Version, e.image.Digest, erofs, otherID, dockerID, port, socket, state, filepath.Join(state, "runsc")),
		FactsPatch: fmt.Sprintf(`{"model":{"baseURL":%q},"mcp":{"agentsURL":"http://127.0.0.1:6767/mcp/agents"}}`, modelURL)})

	// The host dirs Compose binds into the container, owned by its user.
	docker := filepath.Join(sc.Host, "srv/paseo-docker")
	home := filepath.Join(sc.Host, "home/paseo")
	write(t, filepath.Join(home, ".paseo/config.json"), `{"daemon":"identity"}`)
	for _, d := range []string{docker, home} {
		chownTree(t, d, 1000, 1000)
	}
	facts, err := testtree.MergePatch(sc.Facts, []byte(`{"deployment":{"id":"docker-official"},"agent":{"id":"agent-b2"},
		"workspace":{"cwd":"/workspace/app","git":null},
		"state":{"agentDir":"/paseo-state/pi-agent","sessionDir":"/paseo-state/pi-sessions/agent-b2","cacheDir":"/paseo-state/pi-cache/agent-b2"},
		"launch":{"extension":"/tmp/paseo-pi-extension-b2/paseo-integration.mjs","mcpConfig":"/tmp/paseo-pi-mcp-b2/mcp.json"}}`))
	if err != nil {
		t.Fatal(err)
	}

	cfg := supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		Socket: socket, SocketGID: officialSocketGID, StateRoot: state, RunscPath: sc.Runsc,
		Secrets: dockerSecrets, Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM}
	// systemd's part (docs/deploy/paseo-sandbox.socket): the socket unit
	// holds the listening socket, so the supervisor's restarts keep the
	// inode the container bound.
	activation := listenActivated(t, socket, officialSocketGID)
	supervise := func() (stop func()) {
		f, err := activation.File()
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Listener = l.(*net.UnixListener)
		srv, err := supervisor.New(c)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Listen(sctx) }()
		t.Cleanup(func() { cancel(); srv.Shutdown() })
		return func() { cancel(); <-served; srv.Close() }
	}
	stop := supervise()

	// The daemon asks for a supervisor restart mid-session on one pipe and
	// hears it is done on the other.
	askR, askW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	doneR, doneW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer askR.Close()
	defer doneW.Close()
	go func() {
		br := bufio.NewReader(askR)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "restart-supervisor\n" {
				stop()
				stop = supervise()
				doneW.WriteString("restarted\n")
			}
		}
	}()

	client := officialClient{
		Facts:         facts,
		HostWorkspace: filepath.Join(docker, "workspace/app"),
		// What the container must not see: the supervisor's directory, its
		// state root, runsc's root, the holders' sockets, the bundles, the
		// image, and the host tree the binds come from.
		Hidden:    []string{run, socket, state, filepath.Join(state, "runsc"), supervisor.HolderDir(state), filepath.Join(state, "bundles"), e.image.Rootfs, sc.Host, sc.State},
		HolderDir: supervisor.HolderDir(state),
		SocketGID: officialSocketGID,
	}
	// Without the socket's group the container cannot even connect.
	client.Mode = "no-group"
	if out, err := runOfficialContainer(t, sc.Host, socket, client, nil, nil); err != nil {
		t.Fatalf("the container without group_add: %v\n%s", err, out)
	}
	client.Mode = "daemon"
	pub, err := published.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	out, err := runOfficialContainer(t, sc.Host, socket, client, []uint32{officialSocketGID}, []*os.File{pub, askW, doneR})
	askW.Close()
	doneR.Close()
	t.Logf("the official container's daemon:\n%s", out)
	if err != nil {
		dumpHolderLogs(t, state) // before the supervisors' shutdowns remove them
		t.Fatalf("the official container's daemon failed: %v", err)
	}
	if !strings.Contains(out, "official-client: done") {
		t.Fatal("the client did not finish")
	}

	// What the host sees afterwards: the agent's file in the mapped host
	// workspace, owned by the container's user; the session log in the
	// mapped state dir, naming the container cwd; the model got the key.
	made := filepath.Join(docker, "workspace/app/made-in-container.txt")
	if got, err := os.ReadFile(made); err != nil || string(got) != "from the official container\n" {
		t.Errorf("the agent's file on the host: %q %v", got, err)
	}
	if uid, gid := ownerOf(t, made); uid != 1000 || gid != 1000 {
		t.Errorf("the agent's file is owned by %d:%d on the host, want the container's 1000:1000", uid, gid)
	}
	logs, _ := filepath.Glob(filepath.Join(docker, "state/pi-sessions/agent-b2", "*.jsonl"))
	if len(logs) != 1 {
		t.Fatalf("the session log did not land in the mapped host dir: %v", logs)
	}
	if head, _ := os.ReadFile(logs[0]); !bytes.Contains(head, []byte(`"cwd":"/workspace/app"`)) {
		t.Errorf("the agent did not run at the container path: %.200s", head)
	}
	reqs := e.requests()
	if len(reqs) < 4 {
		t.Errorf("the model saw %d requests, want the 4 of two turns", len(reqs))
	}
	for _, r := range reqs {
		if !r.Authorized {
			t.Errorf("the model saw a request without the injected key: %s %s", r.Method, r.Path)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(state, "bundles")); len(left) != 0 {
		t.Errorf("bundles left after the client's delete: %v", left)
	}
}

// officialClient is what the test tells the daemon in the container.
type officialClient struct {
	Mode          string // "daemon", or "no-group": only try to connect
	Facts         json.RawMessage
	HostWorkspace string
	Hidden        []string
	HolderDir     string
	SocketGID     uint32
}

const envOfficialClient = "PASEO_E2E_OFFICIAL_CLIENT"

// runOfficialContainer runs TestHelperOfficialContainer as the container's
// daemon and returns its output.
func runOfficialContainer(t *testing.T, host, socket string, client officialClient, groups []uint32, extra []*os.File) (string, error) {
	t.Helper()
	data, err := json.Marshal(client)
	if err != nil {
		t.Fatal(err)
	}
	docker := filepath.Join(host, "srv/paseo-docker")
	spec := testcontainer.Spec{
		Root:  t.TempDir(),
		Tmpfs: []string{"/run"},
		Binds: []testcontainer.Bind{
			{Host: filepath.Join(docker, "workspace"), Container: "/workspace"},
			{Host: filepath.Join(host, "home/paseo"), Container: "/home/paseo"},
			{Host: filepath.Join(docker, "state"), Container: "/paseo-state"},
			{Host: filepath.Join(docker, "tmp"), Container: "/tmp"},
			// The socket alone, not its directory.
			{Host: socket, Container: containerSocket},
		},
		UID: 1000, GID: 1000, Groups: groups,
		Argv: []string{"paseo-daemon", "-test.run=^TestHelperOfficialContainer$", "-test.v", "-test.timeout=5m"},
		Env:  []string{"HOME=/home/paseo", "PATH=/usr/bin:/bin", envOfficialClient + "=" + string(data)},
	}
	spec.ExtraFiles = extra
	out, err := testcontainer.Run(spec, 6*time.Minute)
	return string(out), err
}

// listenActivated makes the socket as systemd's socket unit does
// (SocketMode=0660, SocketGroup=gid) and keeps it for the whole test.
func listenActivated(t *testing.T, socket string, gid int) *net.UnixListener {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := os.Chown(socket, 0, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(socket, 0o660); err != nil {
		t.Fatal(err)
	}
	return ln
}

// dockerSecrets holds the docker deployment's secrets only.
func dockerSecrets(deployment, ref string) ([]byte, error) {
	if deployment != dockerID {
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

// dumpHolderLogs shows a failed test the holders' own diagnostics.
func dumpHolderLogs(t *testing.T, state string) {
	logs, _ := filepath.Glob(filepath.Join(supervisor.HolderDir(state), "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		t.Logf("holder log %s:\n%s", filepath.Base(l), data)
	}
}
