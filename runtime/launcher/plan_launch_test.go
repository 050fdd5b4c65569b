package launcher

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
)

// A launch reads the reviewed bundle once: from start to teardown, every
// bundle file, config.json first among them, is opened exactly once, by
// anyone (inotify counts the kernel's opens, runsc's included). Preflight,
// the EROFS check, bind staging, the network and runsc's start all work
// from the launch plan.
func TestLaunchOpensTheBundleOnce(t *testing.T) {
	for _, mode := range []string{"none", "sandbox"} {
		t.Run(mode, func(t *testing.T) {
			patch := ""
			if mode == "sandbox" {
				patch = `{"network":{"mode":"sandbox"}}`
			}
			s := compileScript(t, "echo ran", patch)
			if mode == "sandbox" {
				world := testnet.New(t)
				model := world.Host("model")
				s.uplink = world.Uplink
				s.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
					if host == "llm.example.test" {
						return []netip.Addr{model.Addr}, nil
					}
					return nil, fmt.Errorf("unknown host %s", host)
				}
			}
			stop := testbundle.WatchOpens(t, s.bundle)
			res, out, stderr, err := s.launch(t, staticSecret("v"))
			opens := stop()
			if err != nil || res.ExitCode != 0 || !strings.Contains(out, "ran") {
				t.Fatalf("launch: %v (exit %d)\nstdout: %s\nstderr: %s", err, res.ExitCode, out, stderr)
			}
			files, err := bundle.Read(s.bundle)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]int{}
			for _, name := range files.Names() {
				want[name] = 1
			}
			if want[bundle.ConfigFile] != 1 || want[bundle.PinsFile] != 1 {
				t.Fatalf("the test bundle lacks config.json or pins.json: %v", files.Names())
			}
			if diff := cmp.Diff(want, opens); diff != "" {
				t.Errorf("opens per bundle file during a launch (-want +got):\n%s", diff)
			}
			s.assertClean(t)
		})
	}
}
