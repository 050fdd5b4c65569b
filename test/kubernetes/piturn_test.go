package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	httpstreamspdy "k8s.io/apimachinery/pkg/util/httpstream/spdy"
	"k8s.io/client-go/tools/remotecommand"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"paseo.dev/paseo-policy/internal/nsutil"
	"paseo.dev/paseo-policy/internal/testkit/fakemcp"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
)

// piImageInfo is what the test reads of the built Pi image (.image, `make
// image`): its version and digest (the registry's image) and its rootfs.
type piImageInfo struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
	Pi      string `json:"pi"`
	Rootfs  string `json:"-"`
}

// piImage reads .image/image.json; a missing image fails the test (it is
// a prerequisite of make kubernetes, not a reason to skip).
func piImage(t *testing.T) piImageInfo {
	t.Helper()
	p, err := filepath.Abs(repo(".image/image.json"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("the Pi image is missing (%v): run `make image`", err)
	}
	var im piImageInfo
	if err := json.Unmarshal(data, &im); err != nil {
		t.Fatal(err)
	}
	im.Rootfs = filepath.Join(filepath.Dir(p), "rootfs")
	if _, err := os.Stat(filepath.Join(im.Rootfs, "usr/local/bin/node")); err != nil {
		t.Fatalf("the Pi image's rootfs has no node (%v): run `make image`", err)
	}
	return im
}

// TestPiTurnThroughGatewayOnContainerdRunsc is issue 37's done-when on the
// node: the real Pi (the image of `make image`) in the rendered Pod, run by
// containerd's CRI on the runsc shim, takes one prompt over its stdio and
// answers it through the cluster gateway, with no key in the Pod.
//
// The reference facts with the pi-session profile, the api-key model route
// and network mode sandbox are compiled against the Pi image's rootfs and
// rendered with --gateway-ip; the Pod runs the profile's start script
// (/bin/sh -c '…; exec pi "$@"' pi --mode rpc …) as the rendering writes
// it. Its image is the Pi rootfs as one layer (cached between runs,
// treeimage_test.go) with a layer of the Pod's mount points above it. The
// prompt goes in as a kubelet's `kubectl attach -i` does: CRI Attach on
// the container (whose stdin the rendering opens, stdin: true) gives a URL
// on containerd's streaming server, spoken to over SPDY with client-go's
// remotecommand (the kubelet's and kubectl's client). Pi's answer comes
// back on the same stream's stdout.
//
//   - before the NetworkPolicy's stand-in (the gateway test's nftables
//     rule), the Pod reaches the model's address itself (control); with
//     it, it does not;
//   - Pi's turn (a prompt, then its events up to agent_end) carries the
//     fake model's answer, and every request the model saw came over TLS
//     for the provider's name with the key the gateway added;
//   - no file the Pod can read and no process environment in it holds the
//     key, Pi's included (control: a planted copy is found).
func TestPiTurnThroughGatewayOnContainerdRunsc(t *testing.T) {
	nodePrerequisites(t)
	im := piImage(t)

	// The daemon's MCP endpoint (a stand-in, on the host's loopback): the
	// plan's MCP route, which the gateway serves too, leads there.
	daemon := fakemcp.New(mcpBearer, "agents listed by paseo")
	mcpSrv := httptest.NewServer(daemon)
	t.Cleanup(mcpSrv.Close)
	mcpPort := mcpSrv.Listener.Addr().(*net.TCPAddr).Port

	s := testbundle.New(t, testbundle.Options{Rootfs: im.Rootfs, Profile: "pi-session",
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q}}`, im.Version, im.Digest),
		FactsPatch:    fmt.Sprintf(`{"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, mcpPort),
		// The daemon's files Pi reads, before the compile (the model
		// route's models.json is made from the daemon's).
		Prepare: func(t testing.TB, host string) {
			agent := filepath.Join(host, "srv/paseo/state/pi-agent")
			writeFile(t, filepath.Join(agent, "models.json"), `{"providers":{"fake":{"baseUrl":"https://`+providerName+`:8443/v1","api":"openai-completions",
 "apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},
 "models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}`)
			writeFile(t, filepath.Join(agent, "settings.json"), `{"packages":["/opt/pi/node_modules/pi-mcp-adapter"]}`)
			writeFile(t, filepath.Join(host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"), "export default function () {}\n")
		}})
	// The sandbox user's state, as the daemon leaves it.
	for _, d := range []string{"pi-agent", "pi-sessions/agent-7f3c", "pi-git/agent-7f3c"} {
		chownTree(t, filepath.Join(s.Host, "srv/paseo/state", d), 1000, 1000)
	}
	files, err := bundle.Read(s.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := files.Verify(); err != nil {
		t.Fatal(err)
	}
	opts := kubernetes.Options{Image: "paseo.test/pi@sha256:" + strings.Repeat("0", 64), GatewayIP: gatewayAddr.String()}
	first, err := kubernetes.Render(files, opts)
	if err != nil {
		t.Fatal(err)
	}

	// The image: the Pi rootfs's layer (cached) and the Pod's mount points
	// above it (a read-only root cannot make them at start).
	tree := cachedTreeImage(t, im.Rootfs, "paseo.test/pi-rootfs", treeCacheDir(t))
	t.Logf("the Pi rootfs's layer (%d MB, %d entries): %.1f s (cached: %v)", tree.Layer.size>>20, len(tree.Paths), tree.Seconds, tree.Cached)
	entries := treeStandIns(tree)
	addMountPoints(entries, first.Pod)
	imgDir := t.TempDir()
	piImg := overTree(t, imgDir, "paseo.test/pi:1", tree, entries)
	pause := buildImage(t, imgDir, "paseo.test/pause:1", map[string]layerEntry{
		"bin": {dir: true, mode: 0o755}, "bin/busybox": {data: readFile(t, "/bin/busybox"), mode: 0o755},
		"proc": {dir: true, mode: 0o755}, "dev": {dir: true, mode: 0o755}, "sys": {dir: true, mode: 0o755},
	}, []string{"/bin/busybox", "sleep", "2147483647"})
	opts.Image = piImg.ByDigest()
	r, err := kubernetes.Render(files, opts)
	if err != nil {
		t.Fatal(err)
	}
	pod := r.Pod
	c := &pod.Spec.Containers[0]
	if !c.Stdin || c.TTY || len(c.Command) < 4 || c.Command[0] != "/bin/sh" || !strings.Contains(strings.Join(c.Command, " "), "pi --mode rpc") {
		t.Fatalf("the rendered container does not run Pi's RPC on its stdin: stdin %v tty %v command %q", c.Stdin, c.TTY, c.Command)
	}

	vols := materialize(t, pod, r.ConfigMap)
	n := startNode(t, pause.Name)
	n.importImage(t, pause)
	start := time.Now()
	n.importImage(t, tree.ociImage)
	n.importImage(t, piImg)
	t.Logf("importing the Pi image into the node: %.1f s", time.Since(start).Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	waitForImage(ctx, t, n, c.Image)

	// The model's script: the first prompt's answer, then (the second
	// prompt) a call of the daemon's list_agents through Pi's mcp tool and
	// an answer after it.
	g := startGatewayNode(ctx, t, n, pod, s.Bundle, fakemodel.Text(piAnswer),
		fakemodel.Turn{ToolCalls: []fakemodel.ToolCall{{Name: "mcp", Arguments: map[string]any{"tool": "paseo_list_agents", "args": "{}"}}}},
		fakemodel.Text("called"))
	start = time.Now()
	ctrID := g.startContainer(ctx, t, pod, vols)

	// Control, then the NetworkPolicy's stand-in: the model's address from
	// the Pod, by Node's own connect (the image has no wget).
	connect := func() (string, int32) {
		out, errOut, code := g.exec(ctx, t, ctrID, 30, "/usr/local/bin/node", "-e", tcpProbe, providerIP.String())
		return strings.TrimSpace(out + errOut), code
	}
	t.Run("control-direct-reaches-the-model", func(t *testing.T) {
		before := g.modelConns.from(g.podIP)
		if out, code := connect(); code != 0 || g.modelConns.from(g.podIP) == before {
			t.Fatalf("without the rule the Pod did not reach the model's address (exit %d %q)", code, out)
		}
	})
	nodeRule(t, g.nodeNS, gatewayPorts(t, r))
	afterRule := g.modelConns.from(g.podIP)
	t.Run("direct-to-the-model-dropped", func(t *testing.T) {
		before := g.modelConns.from(g.podIP)
		if out, code := connect(); code == 0 || g.modelConns.from(g.podIP) != before {
			t.Errorf("with the rule the Pod still reached the model's address (exit %d %q)", code, out)
		}
	})

	// Attach, as the kubelet serves `kubectl attach -i`: the CRI's URL on
	// containerd's streaming server, which listens on the node's loopback
	// (its own network namespace), so the dial is made from there.
	att, err := n.CRI.Attach(ctx, &cri.AttachRequest{ContainerId: ctrID, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	stdio, stderr := attach(ctx, t, g.nodeNS, att.Url)
	pi := piproto.New(stdio.r, stdio.w)
	turn := func(t *testing.T, prompt string) []piproto.Frame {
		t.Helper()
		resp, _, err := pi.Call(ctx, map[string]any{"type": "prompt", "message": prompt})
		if err != nil || !resp.OK() {
			t.Fatalf("prompt: %v %s\nPi's stderr: %s", err, resp.Raw, stderr.String())
		}
		_, events, err := pi.Until(ctx, piproto.Event("agent_end"))
		if err != nil {
			t.Fatalf("waiting for agent_end: %v (events %v)\nPi's stderr: %s", err, piproto.Types(events), stderr.String())
		}
		return events
	}

	t.Run("pi-turn-through-the-gateway", func(t *testing.T) {
		events := turn(t, piPrompt)
		t.Logf("the container's start to Pi's agent_end: %.1f s", time.Since(start).Seconds())
		var raw bytes.Buffer
		for _, f := range events {
			raw.Write(f.Raw)
			raw.WriteByte('\n')
		}
		if bytes.Contains(raw.Bytes(), []byte(`"stopReason":"error"`)) || !bytes.Contains(raw.Bytes(), []byte(piAnswer)) {
			t.Fatalf("Pi's turn did not carry the model's answer %q:\n%.2000s\nPi's stderr: %s", piAnswer, raw.String(), stderr.String())
		}
		if bytes.Contains(raw.Bytes(), []byte(g.key)) {
			t.Error("Pi's output carries the key")
		}
		reqs := g.fm.Requests()
		chats := 0
		for _, q := range reqs {
			if !q.Authorized || !q.TLS || q.ServerName != providerName {
				t.Errorf("the model saw %s %s without the key, or not over TLS for %s: %+v", q.Method, q.Path, providerName, q)
			}
			if strings.HasSuffix(q.Path, "/chat/completions") {
				chats++
			}
		}
		if chats != 1 {
			t.Errorf("the model saw %d chat requests, want Pi's one", chats)
		}
		if g.modelConns.from(g.podIP) != afterRule {
			t.Error("a connection from the Pod's address reached the model after the rule")
		}
	})

	// The MCP route through the same gateway: Pi's mcp tool reaches the
	// daemon as this agent, with the bearer the gateway added, and the
	// daemon's answer goes back to the model as the tool's result.
	t.Run("mcp-tool-through-the-gateway", func(t *testing.T) {
		before := len(g.fm.Requests())
		turn(t, "call the paseo tool")
		seen := daemon.Requests()
		calls := 0
		for _, q := range seen {
			if !strings.HasPrefix(q, "POST /mcp/agents?callerAgentId=agent-7f3c Bearer "+mcpBearer) {
				t.Errorf("the daemon saw a request not as this agent with the gateway's bearer: %.80q", q)
			}
			if strings.Contains(q, "tools/call") {
				calls++
			}
		}
		if calls != 1 {
			t.Errorf("the daemon saw %d tool calls, want 1 (of %d requests)", calls, len(seen))
		}
		var result bool
		for _, q := range g.fm.Requests()[before:] {
			result = result || bytes.Contains(q.Body, []byte("agents listed by paseo"))
		}
		if !result {
			t.Error("the daemon's answer did not reach the model as the tool's result")
		}
	})

	// The exposure a cluster's RBAC must close (threat 109): the kubelet's
	// attach fences no writer, so a second attach to the same container
	// drives the same Pi (on a host the supervisor's bridge admits one
	// writer per attachment epoch, threat 34). Its command is answered.
	t.Run("a-second-attach-drives-pi", func(t *testing.T) {
		att2, err := n.CRI.Attach(ctx, &cri.AttachRequest{ContainerId: ctrID, Stdin: true, Stdout: true, Stderr: true})
		if err != nil {
			t.Fatalf("a second Attach: %v", err)
		}
		stdio2, _ := attach(ctx, t, g.nodeNS, att2.Url)
		second := piproto.New(stdio2.r, stdio2.w)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if resp, _, err := second.Call(sctx, map[string]any{"type": "get_state"}); err != nil || !resp.OK() {
			t.Fatalf("the second attach's get_state: %v %s", err, resp.Raw)
		}
	})

	// Pi is the Pod's process (the start script exec'd it), and its session
	// log, on the node's hostPath, has the turn.
	t.Run("pi-is-the-pods-process", func(t *testing.T) {
		// Pi sets its process title ("pi", over its argv), so its argv is
		// not there to read: process 1 is Node (the start script's sh exec'd
		// the pi bundle, whose #! names node) titled pi.
		exe, _, _ := g.exec(ctx, t, ctrID, 30, "/bin/readlink", "/proc/1/exe")
		title, _, _ := g.exec(ctx, t, ctrID, 30, "/bin/cat", "/proc/1/cmdline")
		if strings.TrimSpace(exe) != "/usr/local/bin/node" || strings.Fields(strings.ReplaceAll(title, "\x00", " "))[0] != "pi" {
			t.Errorf("the Pod's process 1 is %q titled %q, not Pi", exe, title)
		}
		var logged bool
		sessions := filepath.Join(s.Host, "srv/paseo/state/pi-sessions/agent-7f3c")
		_ = filepath.WalkDir(sessions, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
				data, _ := os.ReadFile(p)
				logged = logged || bytes.Contains(data, []byte(piAnswer))
			}
			return nil
		})
		if !logged {
			t.Errorf("no session log under %s holds the turn", sessions)
		}
	})

	// /usr and /opt are the image's (Node, Pi, the Debian tree: most of
	// its 532 MB, whose search through the gofer took about 80 s here).
	g.checkNoKey(t, ctrID, pod, "", "/usr", "/opt")
}

const (
	piPrompt = "say hello from the node"
	piAnswer = "hello from Pi on the node, through the cluster gateway"
	// tcpProbe connects to argv[1]:8443 and says whether it got there
	// (exit 0) or not within 5 s.
	tcpProbe = `const s=require("net").connect(8443,process.argv[1]);` +
		`s.on("connect",()=>{console.log("connected");s.destroy();process.exit(0)});` +
		`s.on("error",e=>{console.log(e.code);process.exit(1)});` +
		`setTimeout(()=>{console.log("no answer");process.exit(2)},5000)`
)

// pipe is an in-memory pipe: what is written to w is read from r.
type pipe struct {
	r *io.PipeReader
	w *io.PipeWriter
}

// attach speaks to the CRI's attach URL as the kubelet's client does
// (client-go remotecommand over SPDY, the stream protocols v4 down to v1
// containerd's streaming server offers), dialling from the node's network
// namespace. It returns a pipe whose w is the container's stdin and whose
// r its stdout, and the stderr collected; Cleanup ends the stream.
func attach(ctx context.Context, t *testing.T, nodeNS int, rawURL string) (pipe, *lockedBuffer) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := nsutil.Do(nodeNS, func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	rt, err := httpstreamspdy.NewRoundTripperWithConfig(httpstreamspdy.RoundTripperConfig{
		PingPeriod: 5 * time.Second, UpgradeTransport: &http.Transport{DialContext: dial}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := remotecommand.NewSPDYExecutorForTransports(rt, rt, http.MethodPost, u)
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errBuf := &lockedBuffer{}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: errBuf})
		outW.CloseWithError(fmt.Errorf("the attach stream ended: %v", err))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		inW.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the attach stream did not end")
		}
	})
	return pipe{r: outR, w: inW}, errBuf
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

func writeFile(t testing.TB, p, s string) {
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
