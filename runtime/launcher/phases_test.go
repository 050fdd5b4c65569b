package launcher

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// A launch that fails after its network and route proxy exist (here a
// directory takes the run copy's place once the network is up, so the
// start phase cannot write config.json) is refused, undoes everything it
// made, and still reports what the network and the proxy counted, as a
// launch that ran does.
func TestLaunchFailureAfterNetworkUndoesEverything(t *testing.T) {
	world := testnet.New(t)
	model := world.Host("model")
	sc := testbundle.New(t, testbundle.Options{Argv: append(testbundle.Script("echo started > $PASEO_AGENT_CWD/started"), "mcp-test", "slot:mcp-config"),
		RegistryPatch: `{"network":{"mode":"sandbox"}}`,
		FactsPatch:    `{"mcp":{"agentsURL":"http://127.0.0.1:9/mcp/agents"}}`})
	s := &sandbox{host: sc.Host, bundle: sc.Bundle, state: sc.State, runsc: sc.Runsc, uplink: world.Uplink,
		resolve: func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{model.Addr}, nil }}
	secrets := func(deployment, ref string) ([]byte, error) {
		if deployment == "host-alice" && ref == "paseo/mcp-token" {
			return []byte("run-token"), nil
		}
		return staticSecret("v")(deployment, ref)
	}
	const id = "pp-phases-test"
	networked := false
	res, err := Launch(context.Background(), Options{
		BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc, ID: id,
		Secrets: secrets, Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{},
		Uplink: s.uplink, Resolve: s.resolve,
		OnNetwork: func(*sandboxnet.Network) {
			networked = true
			if err := os.Mkdir(filepath.Join(s.state, "run", id, "config.json"), 0o700); err != nil {
				t.Error(err)
			}
		},
	})
	if !networked {
		t.Fatalf("the launch ended before its network existed: %v", err)
	}
	wantUnavailableIs(t, err, diag.LaunchHost)
	if res.ID != id || len(res.Packets) == 0 {
		t.Errorf("result %+v: want the id and the network's packet counters", res)
	}
	if st, ok := res.Routes["mcp"]; !ok || !reflect.DeepEqual(st, RouteStats{}) {
		t.Errorf("route stats %+v: want the mcp proxy's, all zero", res.Routes)
	}
	s.assertNotStarted(t)
	if recs, err := statedir.Records(s.state); err != nil || len(recs) != 0 {
		t.Errorf("records left behind: %v %v", recs, err)
	}
}
