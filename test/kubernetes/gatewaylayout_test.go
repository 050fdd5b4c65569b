package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/gateway"
)

// layout is the rendered gateway Pod's files as a kubelet lays them out
// under root: each volume mount at its mountPath, a ConfigMap key or a
// Secret key with the volume's mode. With subPath the kubelet binds the
// file itself, so each is a plain file; asVolume instead lays the bundle's
// ConfigMap out as a ConfigMap volume without subPath is (the atomic
// writer's ..data links), the control.
type layout struct {
	root     string
	args     []string
	asVolume bool
	// secretMode, when not zero, replaces the Secret volume's defaultMode.
	secretMode os.FileMode
}

func (l layout) make(t *testing.T, o objects) gateway.Options {
	t.Helper()
	d := o.gw.deployment
	spec := d.Spec.Template.Spec
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	ctr := spec.Containers[0]
	bundleDir := filepath.Join(l.root, ctr.Args[len(ctr.Args)-1])
	for _, m := range ctr.VolumeMounts {
		v := vols[m.Name]
		dst := filepath.Join(l.root, m.MountPath)
		switch {
		case v.ConfigMap != nil && l.asVolume:
			continue // below
		case v.ConfigMap != nil:
			write(t, dst, []byte(o.gw.cm.Data[m.SubPath]), os.FileMode(*v.ConfigMap.DefaultMode))
		case v.Secret != nil:
			mode := os.FileMode(*v.Secret.DefaultMode)
			if l.secretMode != 0 {
				mode = l.secretMode
			}
			write(t, dst, []byte(fmt.Sprintf("sk-layout-%s-%016x", m.SubPath, rand.Uint64())), mode)
		default:
			t.Fatalf("a mount of volume %s, neither ConfigMap nor Secret", m.Name)
		}
	}
	if l.asVolume {
		// The atomic writer: every file under a timestamped dir, ..data
		// linking to it, each top-level name linking through ..data.
		ts := filepath.Join(bundleDir, "..2026_12_03_00_00_00.000000001")
		top := map[string]bool{}
		for _, m := range ctr.VolumeMounts {
			if vols[m.Name].ConfigMap == nil {
				continue
			}
			rel := strings.TrimPrefix(m.MountPath, filepath.Clean(ctr.Args[len(ctr.Args)-1])+"/")
			write(t, filepath.Join(ts, rel), []byte(o.gw.cm.Data[m.SubPath]), 0o444)
			top[strings.Split(rel, "/")[0]] = true
		}
		if err := os.Symlink(filepath.Base(ts), filepath.Join(bundleDir, "..data")); err != nil {
			t.Fatal(err)
		}
		for name := range top {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(bundleDir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	opt := gateway.Options{Bundle: bundleDir}
	for i := 0; i+1 < len(ctr.Args); i++ {
		switch ctr.Args[i] {
		case "--model-key-file":
			opt.ModelKeyFile = filepath.Join(l.root, ctr.Args[i+1])
		case "--mcp-token-file":
			opt.MCPTokenFile = filepath.Join(l.root, ctr.Args[i+1])
		case "--listen":
			if ctr.Args[i+1] != "0.0.0.0" {
				t.Fatalf("the gateway listens on %s, not the Pod's every address", ctr.Args[i+1])
			}
		}
	}
	// 0.0.0.0 in the Pod; here an address of loopback of this run's own,
	// so that no other test's listener on this shared machine takes the
	// route ports.
	opt.Listen = netip.AddrFrom4([4]byte{127, byte(rand.IntN(200) + 20), byte(rand.IntN(250) + 1), byte(rand.IntN(250) + 1)})
	// The provider is never dialled: no request is sent. Dial set also
	// skips the start's lookup of the provider's name (not a name this
	// machine resolves); gateway's own tests hold that check.
	opt.Dial = func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no provider in the layout test")
	}
	return opt
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestRenderedGatewayLayoutStarts runs `paseo-policy gateway`'s code
// (gateway.Start) on the golden gateway Pod's files laid out as its
// Deployment mounts them: the bundle's ConfigMap keys by subPath at their
// paths, the Secret's keys by subPath with the volume's 0440. It reads and
// verifies the bundle, accepts both credential files and listens on every
// route port the Service forwards. Controls: the same ConfigMap as a volume
// without subPath (its ..data links) is refused as a bundle, and the
// Secret's files open to others are refused as credentials.
func TestRenderedGatewayLayoutStarts(t *testing.T) {
	o := decode(t, gatewayCase)
	if o.gw.deployment == nil {
		t.Fatal("the gateway case renders no gateway")
	}
	opt := layout{root: t.TempDir()}.make(t, o)
	gw, err := gateway.Start(opt)
	if err != nil {
		t.Fatalf("the gateway refused its rendered layout: %v", err)
	}
	defer gw.Close()
	served := map[int32]bool{}
	for _, r := range gw.Routes {
		served[int32(r.Addr.Port())] = true
		c, err := net.DialTimeout("tcp", r.Addr.String(), 5*time.Second)
		if err != nil {
			t.Errorf("route %s: %v", r.Route.Purpose, err)
			continue
		}
		c.Close()
	}
	for _, p := range o.gw.service.Spec.Ports {
		if !served[p.TargetPort.IntVal] {
			t.Errorf("the Service forwards port %d, which the gateway does not serve", p.TargetPort.IntVal)
		}
	}
	if len(served) != len(o.gw.service.Spec.Ports) {
		t.Errorf("the gateway serves %d ports, the Service forwards %d", len(served), len(o.gw.service.Spec.Ports))
	}

	controls := map[string]struct {
		l    layout
		code diag.Code
	}{
		"the ConfigMap as a volume, without subPath": {layout{asVolume: true}, diag.GatewayBundle},
		"the Secret's files open to others":          {layout{secretMode: 0o444}, diag.GatewaySecret},
	}
	for name, c := range controls {
		t.Run(name, func(t *testing.T) {
			c.l.root = t.TempDir()
			gw, err := gateway.Start(c.l.make(t, o))
			if err == nil {
				gw.Close()
				t.Fatal("the gateway started")
			}
			if !errors.Is(err, c.code) {
				t.Fatalf("refused with %v, want %s", err, c.code)
			}
			t.Logf("refused: %v", err)
		})
	}
}
