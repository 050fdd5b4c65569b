package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"paseo.dev/paseo-policy/internal/nsutil"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/render/kubernetes"
	"paseo.dev/paseo-policy/runtime/gateway"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// Addresses on the node's pod network (the CNI bridge pkube0, whose IPAM
// hands Pods 198.18.0.2-199): the gateway's, standing in for its
// Service's cluster IP, and the model provider's, a host the Pod could
// route to if nothing stopped it.
var (
	gatewayAddr = netip.MustParseAddr("198.18.0.250")
	providerIP  = netip.MustParseAddr("198.18.0.251")
)

const providerName = "llm.example.test" // the reference facts' model host

// TestGatewayOnContainerdRunsc runs the cluster gateway (runtime/gateway,
// in process) for a bundle with the model route, on the node's pod
// network, and the bundle's rendered Pod through the CRI on the runsc
// shim beside it. From inside the Pod:
//
//   - a model request to the gateway's route (by the name the rendering's
//     hostAliases give it) reaches the fake model over TLS with the key
//     added, which the Pod never had;
//   - the same request straight to the model's address is dropped by the
//     test's own nftables rule in the node's network namespace, which
//     stands in for the rendered NetworkPolicy (this node's CNI enforces
//     none): it admits the Pod's packets to the gateway on the
//     NetworkPolicy's route ports and drops the rest. Control: before the
//     rule, the same request reaches the model (which refuses it: no key);
//   - no file the Pod can read and no process environment in it holds the
//     key. Control: a copy of the key planted in the workspace is found.
func TestGatewayOnContainerdRunsc(t *testing.T) {
	nodePrerequisites(t)
	argv := []string{"/bin/busybox", "sleep", "600"}
	// Network mode sandbox: the plan has the model route (api-key) and the
	// MCP route, both served by the gateway.
	s := testbundle.New(t, testbundle.Options{Argv: argv, RegistryPatch: `{"network":{"mode":"sandbox"}}`})
	files, err := bundle.Read(s.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := files.Verify(); err != nil {
		t.Fatal(err)
	}
	opts := kubernetes.Options{Image: "paseo.test/gw-probe@sha256:" + strings.Repeat("0", 64), GatewayIP: gatewayAddr.String()}
	first, err := kubernetes.Render(files, opts)
	if err != nil {
		t.Fatal(err)
	}
	imgDir := t.TempDir()
	entries := treeEntries(t, s.Rootfs)
	addMountPoints(entries, first.Pod)
	entries["etc/hosts"] = layerEntry{mode: 0o644} // the kubelet's etc-hosts mount
	probe := buildImage(t, imgDir, "paseo.test/gw-probe:1", entries, nil)
	pause := buildImage(t, imgDir, "paseo.test/pause:1", map[string]layerEntry{
		"bin": {dir: true, mode: 0o755}, "bin/busybox": {data: readFile(t, "/bin/busybox"), mode: 0o755},
		"proc": {dir: true, mode: 0o755}, "dev": {dir: true, mode: 0o755}, "sys": {dir: true, mode: 0o755},
	}, []string{"/bin/busybox", "sleep", "2147483647"})
	opts.Image = probe.ByDigest()
	r, err := kubernetes.Render(files, opts)
	if err != nil {
		t.Fatal(err)
	}
	pod := r.Pod
	if len(pod.Spec.HostAliases) != 1 || pod.Spec.HostAliases[0].IP != gatewayAddr.String() {
		t.Fatalf("the rendering names the gateway %+v; want %s", pod.Spec.HostAliases, gatewayAddr)
	}

	vols := materialize(t, pod, r.ConfigMap)
	n := startNode(t, pause.Name)
	n.importImage(t, pause)
	n.importImage(t, probe)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	waitForImage(ctx, t, n, pod.Spec.Containers[0].Image)

	g := startGatewayNode(ctx, t, n, pod, s.Bundle, fakemodel.Text("hello through the cluster gateway"))
	key, fm, modelConns, model, podIP := g.key, g.fm, g.modelConns, g.model, g.podIP
	ctrID := g.startContainer(ctx, t, pod, vols)
	inPod := func(args ...string) (stdout, stderr string, code int32) {
		t.Helper()
		return g.exec(ctx, t, ctrID, 30, args...)
	}
	// One chat request as Pi sends it, with the placeholder for a key.
	body := `{"model":"fake-1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	// A direct request gives up after 5 s (a dropped SYN is never answered).
	request := func(url string, extra ...string) (string, string, int32) {
		limit := "5"
		if !strings.HasPrefix(url, "https://") {
			limit = "20"
		}
		args := []string{"/bin/busybox", "timeout", limit, "/bin/busybox", "wget", "-q", "-O", "-",
			"--header", "Authorization: Bearer " + bundle.ModelRoutePlaceholder, "--header", "Content-Type: application/json",
			"--post-data", body}
		return inPod(append(append(args, extra...), url)...)
	}
	throughGateway := "http://" + pod.Spec.HostAliases[0].Hostnames[0] + ":" + strconv.Itoa(model.Route.Port) + model.Route.Path + "/chat/completions"
	direct := "https://" + providerIP.String() + ":8443/v1/chat/completions"

	// Control: with nothing standing in for the NetworkPolicy, the Pod
	// reaches the model's address itself: the model's listener accepts a
	// connection from the Pod's address (busybox's TLS then fails the
	// handshake with Go's server, which does not matter here: the packets
	// got there).
	t.Run("control-direct-reaches-the-model", func(t *testing.T) {
		before := modelConns.from(podIP)
		_, errOut, code := request(direct, "--no-check-certificate")
		if modelConns.from(podIP) == before {
			t.Fatalf("without the rule the Pod's direct request did not reach the model (exit %d %q)", code, errOut)
		}
	})

	// The stand-in for the rendered NetworkPolicy, in the node's namespace.
	ports := gatewayPorts(t, r)
	nodeRule(t, g.nodeNS, ports)

	t.Run("direct-to-the-model-dropped", func(t *testing.T) {
		before, seen := modelConns.from(podIP), len(fm.Requests())
		_, errOut, code := request(direct, "--no-check-certificate")
		if code == 0 || modelConns.from(podIP) != before || len(fm.Requests()) != seen {
			t.Errorf("with the rule the Pod's direct request still reached the model (exit %d %q)", code, errOut)
		}
	})

	t.Run("model-route-adds-the-key", func(t *testing.T) {
		before, direct := len(fm.Requests()), modelConns.from(podIP)
		out, errOut, code := request(throughGateway)
		if code != 0 || !strings.Contains(out, "hello thr") || !strings.Contains(out, "data: [DONE]") {
			t.Fatalf("the model route from the Pod: exit %d %q\n%s", code, errOut, out)
		}
		reqs := fm.Requests()[before:]
		if modelConns.from(podIP) != direct {
			t.Error("a connection from the Pod's address reached the model")
		}
		if len(reqs) != 1 || !reqs[0].Authorized || !reqs[0].TLS || reqs[0].ServerName != providerName {
			t.Fatalf("the model saw %+v; want one request with the key, over TLS for %s", reqs, providerName)
		}
		if strings.Contains(out, key) {
			t.Error("the answer in the Pod carries the key")
		}
	})

	g.checkNoKey(t, ctrID, pod, "/bin/busybox ")
}

// gatewayNode is a node running one rendered Pod's sandbox beside the
// cluster gateway serving the Pod's bundle (runtime/gateway, in the test's
// process) and the fake model, both on the pod network.
type gatewayNode struct {
	n          *node
	sb         string
	sandboxCfg *cri.PodSandboxConfig
	podIP      string
	nodeNS     int
	// key is the provider key, random per run, in a 0400 file only the
	// gateway reads.
	key        string
	fm         *fakemodel.Server
	modelConns *countingListener
	gw         *gateway.Gateway
	model      *gateway.Route
}

// startGatewayNode runs pod's sandbox on n (RunPodSandbox on the runsc
// handler), gives the gateway and the model their addresses on the pod
// network in the node's namespace, and starts the fake model (TLS, a
// certificate of a test CA for the provider's name) answering script and
// the gateway for bundleDir with the key and the MCP route's bearer.
func startGatewayNode(ctx context.Context, t *testing.T, n *node, pod *corev1.Pod, bundleDir string, script ...fakemodel.Turn) *gatewayNode {
	t.Helper()
	g := &gatewayNode{n: n}
	// The key, random per run, in a 0400 file (what the gateway's Pod
	// mounts from a Secret); the daemon's bearer likewise (the MCP route).
	g.key = "sk-node-gateway-" + randomHex(t)
	secrets := t.TempDir()
	keyFile := writeSecret(t, secrets, "model-key", g.key)
	tokenFile := writeSecret(t, secrets, "mcp-token", mcpBearer)

	g.sandboxCfg = podSandboxConfig(t, pod, n.dir)
	sb, err := n.CRI.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: g.sandboxCfg, RuntimeHandler: runtimeHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	g.sb = sb.PodSandboxId
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := n.CRI.StopPodSandbox(c, &cri.StopPodSandboxRequest{PodSandboxId: g.sb}); err != nil {
			t.Errorf("StopPodSandbox: %v", err)
		}
		if _, err := n.CRI.RemovePodSandbox(c, &cri.RemovePodSandboxRequest{PodSandboxId: g.sb}); err != nil {
			t.Errorf("RemovePodSandbox: %v", err)
		}
	})
	st, err := n.CRI.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: g.sb})
	if err != nil || st.Status.GetNetwork().GetIp() == "" {
		t.Fatalf("PodSandboxStatus: no Pod IP (%v)", err)
	}
	g.podIP = st.Status.Network.Ip

	// The node's network namespace (containerd's): the CNI made pkube0
	// there for the Pod; the gateway and the model get their addresses on it.
	nodeNS, err := nsutil.Open(fmt.Sprintf("/proc/%d/ns/net", n.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	g.nodeNS = nodeNS
	t.Cleanup(func() { unix.Close(nodeNS) })
	for _, a := range []netip.Addr{gatewayAddr, providerIP} {
		cmd := exec.Command("/bin/busybox", "ip", "addr", "add", a.String()+"/24", "dev", "pkube0")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := nsutil.Do(nodeNS, cmd.Run); err != nil {
			t.Fatalf("ip addr add %s dev pkube0 in the node's namespace: %v\n%s", a, err, out.String())
		}
	}

	// The fake model, over TLS with a certificate of the test's CA for the
	// provider's name, on its own address of the pod network.
	ca, err := fakemodel.NewTestCA(providerName)
	if err != nil {
		t.Fatal(err)
	}
	g.fm = fakemodel.New(fakemodel.Options{APIKey: g.key, Script: script})
	var modelLn net.Listener
	if err := nsutil.Do(nodeNS, func() (err error) {
		modelLn, err = net.Listen("tcp4", providerIP.String()+":8443")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	g.modelConns = &countingListener{Listener: modelLn}
	go g.fm.ServeTLS(g.modelConns, ca.Cert)
	t.Cleanup(func() { g.fm.Close() })

	// The gateway, listening in the node's namespace on its address. Its
	// dialer is the production one (sandboxnet.SafeDialer: the provider's
	// addresses checked at each dial), run from the node's namespace (the
	// gateway's own egress, which no rule of the Pod's touches), with the
	// provider's name resolved to the model's address as a cluster's DNS
	// would.
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host != providerName {
			return nil, fmt.Errorf("%s: no such host", host)
		}
		return []netip.Addr{providerIP}, nil
	}
	safeDial := sandboxnet.SafeDialer(resolve)
	if err := nsutil.Do(nodeNS, func() (err error) {
		g.gw, err = gateway.Start(gateway.Options{Bundle: bundleDir, Listen: gatewayAddr, ModelKeyFile: keyFile, MCPTokenFile: tokenFile,
			ModelRoots: ca.Roots, Resolve: resolve, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := nsutil.Do(nodeNS, func() (err error) {
					c, err = safeDial(ctx, network, addr)
					return err
				})
				return c, err
			}})
		return err
	}); err != nil {
		t.Fatalf("gateway.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := g.gw.Close(); err != nil {
			t.Error(err)
		}
	})
	for i := range g.gw.Routes {
		if g.gw.Routes[i].Route.Purpose == "model" {
			g.model = &g.gw.Routes[i]
		}
	}
	if g.model == nil {
		t.Fatal("the gateway serves no model route")
	}
	return g
}

// mcpBearer is the daemon's bearer the gateway's MCP route adds.
const mcpBearer = "mcp-bearer-node-gateway"

// startContainer creates and starts pod's container in the sandbox, with
// its volumes' host sides vols and /etc/hosts as the kubelet writes it
// (the Pod's address and the rendering's hostAliases); Cleanup stops and
// removes it.
func (g *gatewayNode) startContainer(ctx context.Context, t *testing.T, pod *corev1.Pod, vols map[string]string) string {
	t.Helper()
	hosts := filepath.Join(t.TempDir(), "etc-hosts")
	if err := os.WriteFile(hosts, []byte(etcHosts(pod.Spec.Hostname, g.podIP, pod.Spec.HostAliases[0].IP, pod.Spec.HostAliases[0].Hostnames)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctrCfg := containerConfig(t, pod, vols)
	ctrCfg.Mounts = append(ctrCfg.Mounts, &cri.Mount{ContainerPath: "/etc/hosts", HostPath: hosts, Readonly: true, Propagation: cri.MountPropagation_PROPAGATION_PRIVATE})
	cc, err := g.n.CRI.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: g.sb, Config: ctrCfg, SandboxConfig: g.sandboxCfg})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := g.n.CRI.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := g.n.CRI.StopContainer(c, &cri.StopContainerRequest{ContainerId: cc.ContainerId, Timeout: 5}); err != nil {
			t.Errorf("StopContainer: %v", err)
		}
		if _, err := g.n.CRI.RemoveContainer(c, &cri.RemoveContainerRequest{ContainerId: cc.ContainerId}); err != nil {
			t.Errorf("RemoveContainer: %v", err)
		}
	})
	return cc.ContainerId
}

// exec runs args in the container through the CRI's ExecSync (the
// kubelet's exec probes), for at most timeout seconds.
func (g *gatewayNode) exec(ctx context.Context, t *testing.T, id string, timeout int64, args ...string) (stdout, stderr string, code int32) {
	t.Helper()
	res, err := g.n.CRI.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: args, Timeout: timeout})
	if err != nil {
		t.Fatalf("ExecSync %v: %v", args, err)
	}
	return string(res.Stdout), string(res.Stderr), res.ExitCode
}

// checkNoKey checks that the key is nowhere in the Pod: no file under /
// (but the kernel's trees, which the environments below cover, and
// imageOnly) and no process's environment, searched from inside with the
// image's grep and tr (tools is the prefix that runs them: "/bin/busybox "
// or ""). imageOnly are top-level directories that hold the image's bytes
// alone: the root is read-only and no mount of the Pod lies in them
// (checked here), so what they hold was fixed when the image was built,
// before this run made its key. The pattern is the key with its first
// character in a bracket, so the probe's own argv (in /proc) does not
// match it. Control: a copy of the key planted in the workspace (the Pod's
// working dir) is found.
func (g *gatewayNode) checkNoKey(t *testing.T, id string, pod *corev1.Pod, tools string, imageOnly ...string) {
	t.Helper()
	pattern := "[" + g.key[:1] + "]" + g.key[1:]
	skip := "/proc|/sys|/dev"
	for _, d := range imageOnly {
		if !*pod.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem {
			t.Fatal("the root is writable: no directory of it holds the image's bytes alone")
		}
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.MountPath == d || strings.HasPrefix(m.MountPath, d+"/") {
				t.Fatalf("%s is mounted under %s, which the search leaves out", m.MountPath, d)
			}
		}
		skip += "|" + d
	}
	// A top-level symlink (a merged /usr's /bin, /lib, /sbin) is left out:
	// grep follows a link it is given, and what the link leads to is
	// searched (or left out) under its own name.
	search := `for d in /*; do [ -L "$d" ] && continue; case "$d" in ` + skip + `) ;; *) ` + tools + `grep -rl -e "$1" "$d";; esac; done
for f in /proc/[0-9]*/environ; do ` + tools + `tr '\0' '\n' < "$f"; done | ` + tools + `grep -c -e "$1"`
	sh := "/bin/sh"
	if tools != "" {
		sh = strings.TrimSpace(tools)
	}
	run := func() (string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		args := []string{sh, "-c", search, "sh", pattern}
		if tools != "" {
			args = []string{sh, "sh", "-c", search, "sh", pattern}
		}
		out, errOut, _ := g.exec(ctx, t, id, 150, args...)
		return out, errOut
	}
	t.Run("no-key-in-the-pod", func(t *testing.T) {
		if out, errOut := run(); strings.TrimSpace(out) != "0" {
			t.Errorf("the key is in the Pod: %q %q", out, errOut)
		}
	})
	t.Run("control-a-planted-key-is-found", func(t *testing.T) {
		planted := filepath.Join(pod.Spec.Containers[0].WorkingDir, "planted-key")
		if err := os.WriteFile(planted, []byte(g.key+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(planted)
		if out, _ := run(); !strings.Contains(out, "/planted-key") {
			t.Errorf("the search did not find a key planted in the workspace: %q", out)
		}
	})
}

// waitForImage waits until the CRI lists the image (it learns of an
// import from containerd's events).
func waitForImage(ctx context.Context, t *testing.T, n *node, image string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, err := n.Img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: image}})
		if err == nil && st.Image != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("image %s is not on the node (%v)", image, err)
		}
	}
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// writeSecret writes value to dir/name, mode 0400.
func writeSecret(t *testing.T, dir, name, value string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	return p
}

// etcHosts is the kubelet's managed /etc/hosts for a Pod with one host
// alias (kubelet_pods.go managedHostsFileContent).
func etcHosts(hostname, podIP, aliasIP string, aliases []string) string {
	return "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n" +
		podIP + "\t" + hostname + "\n\n# Entries added by HostAliases.\n" + aliasIP + "\t" + strings.Join(aliases, "\t") + "\n"
}

// gatewayPorts are the TCP ports the rendered NetworkPolicy lets the Pod
// reach on the gateway's pods; the plan here has no other egress, and a
// rule of another kind fails the test (the stand-in would not cover it).
func gatewayPorts(t *testing.T, r *kubernetes.Rendering) []uint16 {
	t.Helper()
	var ports []uint16
	for i, e := range r.NetworkPolicy.Spec.Egress {
		if len(e.To) != 1 || e.To[0].PodSelector == nil || e.To[0].PodSelector.MatchLabels[kubernetes.LabelRole] != kubernetes.RoleGateway || len(e.Ports) != 1 {
			t.Fatalf("egress rule %d is not a rule to the gateway's pods: %+v", i, e)
		}
		ports = append(ports, uint16(e.Ports[0].Port.IntValue()))
	}
	if len(ports) == 0 {
		t.Fatal("the rendered NetworkPolicy admits no gateway port")
	}
	return ports
}

// nodeRule installs, in the node's network namespace, what the rendered
// NetworkPolicy asks of a CNI for this Pod: its packets (they arrive on
// the bridge pkube0) reach the gateway's address on the route ports, and
// nothing else. The node test's CNI enforces no NetworkPolicy, so this
// rule of the test's own stands in for one.
func nodeRule(t *testing.T, nodeNS int, ports []uint16) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(nodeNS))
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "paseo-test-networkpolicy"})
	accept := nftables.ChainPolicyAccept
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookInput, nftables.ChainHookForward} {
		ch := c.AddChain(&nftables.Chain{Name: "pod-egress-" + strconv.Itoa(int(*hook)), Table: tb, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: nftables.ChainPriorityFilter, Policy: &accept})
		fromPods := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("pkube0")},
		}
		for _, p := range ports {
			c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: append(append([]expr.Any{}, fromPods...),
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gatewayAddr.AsSlice()},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
				&expr.Verdict{Kind: expr.VerdictAccept})})
		}
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: append(append([]expr.Any{}, fromPods...), &expr.Verdict{Kind: expr.VerdictDrop})})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("the NetworkPolicy's stand-in: %v", err)
	}
}

func ifname(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

// countingListener counts the connections the model accepts, by the
// client's address.
type countingListener struct {
	net.Listener
	mu sync.Mutex
	by map[string]int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		if l.by == nil {
			l.by = map[string]int{}
		}
		l.by[host]++
		l.mu.Unlock()
	}
	return c, err
}

// from is how many connections came from ip.
func (l *countingListener) from(ip string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.by[ip]
}
