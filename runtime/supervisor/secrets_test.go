package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// The supervisor resolves a bundle's secrets in the deployment the facts
// and the peer are bound to: host-alice's facts naming host-bob's ref get
// no sandbox, and the refusal carries neither B's value nor its refs;
// the same facts with their own ref start. The key is the model route's
// (issue 24), so the sandbox has a network: a test world's uplink and
// the model's name resolved to a test host.
func TestSupervisorScopesSecretsToTheDeployment(t *testing.T) {
	world := testnet.New(t)
	model := world.Host("model")
	testSupervisorScopesSecrets(t, func(f *fixture) {
		var reg map[string]any
		if err := json.Unmarshal(f.sc.Registry, &reg); err != nil {
			t.Fatal(err)
		}
		reg["network"] = map[string]any{"mode": "sandbox", "dns": "pinned"}
		data, _ := json.Marshal(reg)
		f.cfg.Registry = schema.Input{Name: "registry.json", Data: data}
		f.cfg.Uplink = world.Uplink
		f.cfg.Resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
			if host == "llm.example.test" {
				return []netip.Addr{model.Addr}, nil
			}
			return nil, fmt.Errorf("unknown host %s", host)
		}
	})
}

func testSupervisorScopesSecrets(t *testing.T, network func(*fixture)) {
	dir := filepath.Join(t.TempDir(), "secrets")
	for p, v := range map[string]string{
		"host-alice/alice/fake-llm": "alice-key",
		"host-bob/bob/fake-llm":     "bob-key",
		"host-bob/bob/other":        "bob-other",
	} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := newFixture(t, 200)
	f.stop()
	f.cfg.Secrets, f.cfg.SecretsDir = launcher.SecretsDir(dir), dir
	network(f)
	f.start(t)
	c := f.dial(t)

	for _, ref := range []string{"bob/fake-llm", "host-bob/bob/fake-llm"} {
		facts := bytes.Replace(f.sc.Facts, []byte(`"alice/fake-llm"`), []byte(`"`+ref+`"`), 1)
		if bytes.Equal(facts, f.sc.Facts) {
			t.Fatal("the facts name no alice/fake-llm to replace")
		}
		err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: facts}, nil)
		var e *Error
		if !asError(err, &e) || e.Code != rpcerr.Unavailable {
			t.Fatalf("host-alice naming %s: %v, want %s", ref, err, rpcerr.Unavailable)
		}
		if len(e.Diagnostics) != 1 || e.Diagnostics[0].Code != diag.LaunchSecret || e.Diagnostics[0].Path != "launch.secret" {
			t.Errorf("host-alice naming %s: diagnostics %+v, want one %s at launch.secret", ref, e.Diagnostics, diag.LaunchSecret)
		}
		for _, leak := range []string{"bob-key", "bob-other", "bob/other"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("the refusal names %q: %v", leak, err)
			}
		}
	}
	var list []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 0 {
		t.Fatalf("a refused create left a sandbox: %+v %v", list, err)
	}

	in := f.create(t, c)
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}

// A launch step's refusal reaches the caller as data, as a preflight
// check's does: the model provider's name does not resolve, so the
// launcher in the holder refuses with PP-LAUNCH-RESOLVE at
// launch.resolve, carried through the holder's ready pipe; nothing is
// left.
func TestLaunchRefusalCodesAsData(t *testing.T) {
	world := testnet.New(t)
	f := newFixture(t, 200)
	f.stop()
	var reg map[string]any
	if err := json.Unmarshal(f.sc.Registry, &reg); err != nil {
		t.Fatal(err)
	}
	reg["network"] = map[string]any{"mode": "sandbox", "dns": "pinned"}
	data, _ := json.Marshal(reg)
	f.cfg.Registry = schema.Input{Name: "registry.json", Data: data}
	f.cfg.Uplink = world.Uplink
	f.cfg.Resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		return nil, fmt.Errorf("unknown host %s", host)
	}
	f.start(t)
	c := f.dial(t)
	err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: f.sc.Facts}, nil)
	var e *Error
	if !asError(err, &e) || e.Code != rpcerr.Unavailable {
		t.Fatalf("createSandbox: %v, want unavailable", err)
	}
	if len(e.Diagnostics) != 1 || e.Diagnostics[0].Code != diag.LaunchResolve || e.Diagnostics[0].Path != "launch.resolve" || !strings.Contains(e.Diagnostics[0].Message, "llm.example.test") {
		t.Errorf("diagnostics %+v, want one %s at launch.resolve naming the host", e.Diagnostics, diag.LaunchResolve)
	}
	var list []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 0 {
		t.Errorf("after the refusal: %v %v", list, err)
	}
	entries, err := inventory.Inventory{StateRoot: f.sc.State, RunscPath: f.sc.Runsc}.PS()
	if err != nil || len(entries) != 0 {
		t.Errorf("left after the refusal: %+v %v", entries, err)
	}
}
