package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runtimeHandler is the containerd runtime the gvisor RuntimeClass names
// (docs/kubernetes.md registers the same).
const runtimeHandler = "runsc"

// node is a containerd of the test's own, as a Kubernetes node runs it for
// the gvisor RuntimeClass: the runsc shim built from the pinned gVisor,
// running the pinned runsc, with CNI pod networking. It has its own root,
// state, socket and config, and runs in a network namespace and a private
// mount namespace of its own, so its bridge, its pod namespaces and its
// mounts go when it does.
type node struct {
	dir  string
	sock string
	cmd  *exec.Cmd
	log  string
	ctr  string
	// hadRunDir: /run/containerd was there before this node
	hadRunDir bool
	CRI       cri.RuntimeServiceClient
	Img       cri.ImageServiceClient
}

// repo is the repository root (this module lives in test/kubernetes).
func repo(rel string) string { return filepath.Join("..", "..", rel) }

// tools are the node's binaries: the pinned containerd and ctr
// (tools/containerd), runsc and its shim (tools/runsc), all under bin/.
type tools struct{ containerd, ctr, runsc, shim string }

// nodePrerequisites fails, saying what is missing and how to get it,
// unless containerd can be started here: root, the pinned binaries, the
// CNI plugins and a static busybox.
func nodePrerequisites(t *testing.T) tools {
	t.Helper()
	skip.UnlessRoot(t, "the node runtime test starts containerd and runsc")
	var b tools
	for p, name := range map[*string]string{&b.containerd: "containerd", &b.ctr: "ctr", &b.runsc: "runsc", &b.shim: "containerd-shim-runsc-v1"} {
		abs, err := filepath.Abs(repo("bin/" + name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(abs); err != nil {
			t.Fatalf("%s missing: make runsc shim containerd (%v)", abs, err)
		}
		*p = abs
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Fatal("CNI plugins missing at /usr/lib/cni: make deps (containernetworking-plugins)")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatal("static busybox missing at /bin/busybox: make deps (busybox-static)")
	}
	return b
}

// startNode writes the node's config and starts containerd; Cleanup stops
// it and reports what it left.
func startNode(t *testing.T, pauseImage string) *node {
	t.Helper()
	b := nodePrerequisites(t)
	// Short: the socket path must fit sun_path, and the shims' sockets are
	// named from it.
	dir, err := os.MkdirTemp("", "pkube")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{dir: dir, sock: filepath.Join(dir, "ctd.sock"), log: filepath.Join(dir, "containerd.log"), ctr: b.ctr}
	if _, err := os.Stat("/run/containerd"); err == nil {
		n.hadRunDir = true
	}
	for _, d := range []string{"root", "state", "net.d", "ipam", "runsc-root", "bin", "opt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// containerd finds a shim by name on its PATH.
	if err := os.Symlink(b.shim, filepath.Join(dir, "bin", "containerd-shim-runsc-v1")); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The runsc flags every launch of the launcher uses that a Pod cannot
	// say: the gofer keeps file access (directfs off), gVisor's own network
	// stack. docs/kubernetes.md gives the same file to operators.
	write("runsc.toml", fmt.Sprintf(`binary_name = %q
root = %q
log_level = "debug"
log_path = %q

[runsc_config]
  directfs = "false"
  network = "sandbox"
  debug-log = %q
`, b.runsc, filepath.Join(dir, "runsc-root"), filepath.Join(dir, "shim-%ID%.log"), filepath.Join(dir, "runsc-%ID%-%COMMAND%.log")))
	write("config.toml", fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
# Nothing of the host's: no NRI socket, no other snapshotters.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.native", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  level = "debug"

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[6]q

[plugins."io.containerd.cri.v1.runtime"]
  # No score below containerd's own (userns_test.go): this machine lets no
  # process lower one.
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir, not the host's /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = %[7]q
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.%[7]s]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.%[7]s.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = %[8]q
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %[9]q
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.sock, n.sock+".ttrpc", filepath.Join(dir, "opt"),
		pauseImage, runtimeHandler, filepath.Join(dir, "runsc.toml"), filepath.Join(dir, "net.d")))
	// A bridge with no gateway and no masquerade, in the node's own
	// network namespace, addressed from the benchmarking range: pods get an
	// eth0 as the kubelet's CNI gives them, and no packet leaves. Pods take
	// .2-.199; the gateway test gives the rest to its servers.
	write("net.d/10-paseo-test.conflist", fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "paseo-kube-test",
  "plugins": [{
    "type": "bridge", "bridge": "pkube0", "isGateway": false, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.0.0/24", "rangeEnd": "198.18.0.199"}]], "dataDir": %q}
  }]
}
`, filepath.Join(dir, "ipam")))

	logf, err := os.Create(n.log)
	if err != nil {
		t.Fatal(err)
	}
	// Its own network namespace (lo up, for the CRI's stream server), mount
	// namespace and user namespace (userns.go says why).
	n.cmd = exec.Command("/bin/sh", "-c", `/bin/busybox ip link set lo up && exec "$1" --config "$2"`, "sh", b.containerd, filepath.Join(dir, "config.toml"))
	n.cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"))
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	n.cmd.SysProcAttr = nodeNamespaces()
	// containerd dies (Pdeathsig) when the thread that forked it exits, and
	// the Go runtime ends a thread whose goroutine returns locked to it, as
	// every namespace switch does (nsutil.Do): the fork happens on a thread
	// held until the node stops.
	started, release := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		started <- n.cmd.Start()
		<-release
	}()
	if err := <-started; err != nil {
		close(release)
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(t); close(release); logf.Close() })

	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n.CRI, n.Img = cri.NewRuntimeServiceClient(conn), cri.NewImageServiceClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := n.CRI.Version(ctx, &cri.VersionRequest{})
		cancel()
		if err == nil {
			t.Logf("containerd CRI %s %s, runtime API %s", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
			break
		}
		if time.Now().After(deadline) || n.cmd.ProcessState != nil {
			t.Fatalf("containerd did not answer on its CRI socket: %v\n%s", err, n.tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return n
}

// tail is the end of containerd's log, for a failure's message.
func (n *node) tail() string {
	data, _ := os.ReadFile(n.log)
	if len(data) > 8000 {
		data = data[len(data)-8000:]
	}
	return string(data)
}

// importImage loads a local OCI archive into the CRI's namespace.
func (n *node) importImage(t *testing.T, img ociImage) {
	t.Helper()
	out, err := exec.Command(n.ctr, "--address", n.sock, "--namespace", "k8s.io", "images", "import", "--base-name", strings.SplitN(img.Name, ":", 2)[0], img.Archive).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", img.Name, err, out)
	}
	// A pull by digest records the image under name@digest too, which is
	// how the CRI finds a Pod's image by digest; an import records the tag
	// alone.
	out, err = exec.Command(n.ctr, "--address", n.sock, "--namespace", "k8s.io", "images", "tag", img.Name, img.ByDigest()).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images tag %s %s: %v\n%s", img.Name, img.ByDigest(), err, out)
	}
}

// stop ends containerd (SIGTERM, then SIGKILL) and removes its dirs; every
// failure is reported.
func (n *node) stop(t *testing.T) {
	if n.cmd.Process != nil && n.cmd.ProcessState == nil {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- n.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = n.cmd.Process.Kill()
			<-done
		}
	}
	// Every shim ends with its sandbox; one still serving this node's
	// socket is a leak, ended here by its pid and reported.
	for _, pid := range processesNaming(n.sock) {
		t.Errorf("a process of this node outlived it (pid %d); ending it", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if !n.hadRunDir {
		// The shims' sockets live in containerd's fixed /run/containerd/s;
		// it was made for this node, so it goes with it (empty, or reported).
		for _, d := range []string{"/run/containerd/s", "/run/containerd"} {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("removing %s: %v", d, err)
			}
		}
	}
	if t.Failed() {
		t.Logf("containerd log:\n%s", n.tail())
		for _, l := range globLogs(n.dir) {
			t.Logf("%s", l)
		}
	}
	if os.Getenv("KEEPNODE") != "" {
		return
	}
	if err := os.RemoveAll(n.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removing the node's dir: %v", err)
	}
}

// globLogs is the tail of each runsc and shim log, for a failure.
func globLogs(dir string) []string {
	var out []string
	paths, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, p := range paths {
		if strings.HasSuffix(p, "containerd.log") {
			continue
		}
		data, _ := os.ReadFile(p)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		out = append(out, "== "+filepath.Base(p)+"\n"+string(data))
	}
	return out
}

// processesNaming lists the pids whose argv holds arg as one word: the
// shims this node started name its socket.
func processesNaming(arg string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		argv, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && slices.Contains(strings.Split(string(argv), "\x00"), arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}
