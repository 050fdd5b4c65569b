package launcher

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

// goldenBundle is a bundle with the one secret slot the launcher fills:
// the compiler's reviewed bundle without a credential, with the key's
// slot added as api-key bundles had it before the model route
// (testbundle.KeyInEnv; the compiler writes no slot now, issue 24), and an
// MCP config without a bearer.
func goldenBundle(t *testing.T) bundle.Files {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, os.DirFS(testbundle.Repo(t, "testdata/host-pi-session-direct-model/golden"))); err != nil {
		t.Fatal(err)
	}
	testbundle.KeyInEnv(t, dir, "FAKE_LLM_KEY", "alice/fake-llm")
	files, err := bundle.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// fillSecrets fills the slots of files as a launch does, through the
// launch plan of those bytes: the run copy of the spec and the MCP config.
func fillSecrets(files bundle.Files, src SecretSource) (*rspec.Spec, []byte, error) {
	return fillSlots(launchplan.FromFiles("", files), src)
}

// recordingSource answers every ref of deployment host-alice and records
// what it was asked.
type recordingSource struct{ asked []string }

func (r *recordingSource) get(deployment, ref string) ([]byte, error) {
	r.asked = append(r.asked, deployment+" "+ref)
	if deployment != "host-alice" {
		return nil, errors.New("unknown deployment")
	}
	return []byte("value-of-" + ref), nil
}

// The credential env is the one slot: the MCP bearer has none (the route
// proxy adds it outside the sandbox), so mcp.tokenRef is never looked up
// to fill a file.
func TestSecretSlotsAreTheCompilersOne(t *testing.T) {
	slots, err := bundle.SecretSlots(goldenBundle(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []bundle.SecretSlot{{Kind: bundle.SlotCredentialEnv, Ref: "alice/fake-llm", Env: "FAKE_LLM_KEY"}}
	if diff := cmp.Diff(want, slots, cmpopts.IgnoreUnexported(bundle.SecretSlot{})); diff != "" {
		t.Errorf("slots (-want +got):\n%s", diff)
	}
}

func TestFillSecretsSubstitutesOnlyTheSlots(t *testing.T) {
	files := goldenBundle(t)
	src := &recordingSource{}
	plan := launchplan.FromFiles("", files)
	spec, mcp, err := fillSlots(plan, src.get)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"host-alice alice/fake-llm"}, src.asked); diff != "" {
		t.Errorf("lookups (-want +got):\n%s", diff)
	}
	var orig rspec.Spec
	_ = json.Unmarshal(files[bundle.ConfigFile], &orig)
	// The plan's spec is the reviewed one still: the slot is filled in
	// the run copy only.
	if diff := cmp.Diff(&orig, plan.Spec); diff != "" {
		t.Errorf("filling changed the plan's spec (-compiled +plan):\n%s", diff)
	}
	for i, e := range orig.Process.Env {
		want := e
		if strings.HasPrefix(e, "FAKE_LLM_KEY=") {
			want = "FAKE_LLM_KEY=value-of-alice/fake-llm"
		}
		if spec.Process.Env[i] != want {
			t.Errorf("env[%d] = %q, want %q", i, spec.Process.Env[i], want)
		}
	}
	// Everything but the env entry is the compiled spec.
	filled, _ := bundle.Marshal(spec)
	spec.Process.Env = orig.Process.Env
	if diff := cmp.Diff(&orig, spec); diff != "" {
		t.Errorf("config.json changed beyond the slot (-compiled +filled):\n%s", diff)
	}
	if string(mcp) != string(files[bundle.MCPConfigFile]) {
		t.Errorf("the MCP config changed: %s", mcp)
	}
	if strings.Contains(string(mcp), "Authorization") {
		t.Errorf("the MCP config carries a bearer: %s", mcp)
	}
	for name, data := range map[string][]byte{bundle.ConfigFile: filled, bundle.MCPConfigFile: mcp} {
		if strings.Contains(string(data), bundle.SecretMarker) {
			t.Errorf("%s still holds a placeholder", name)
		}
	}
}

// A placeholder anywhere the compiler puts none is refused before any
// secret is looked up, however it is written.
func TestFillSecretsRefusesStrayPlaceholders(t *testing.T) {
	ph := bundle.SecretPlaceholder("alice/fake-llm")
	edits := map[string]struct {
		file string
		edit func(string) string
	}{
		"in argv (model id)": {bundle.ConfigFile, func(s string) string {
			return strings.Replace(s, `"pi",`, `"pi", "--model", "fake/x`+ph+`",`, 1)
		}},
		"in argv, JSON-escaped": {bundle.ConfigFile, func(s string) string {
			return strings.Replace(s, `"pi",`, `"pi", "\u0040\u0040paseo-secret:alice/fake-llm@@",`, 1)
		}},
		"in another env entry": {bundle.ConfigFile, func(s string) string {
			return strings.Replace(s, `"HOME=/home/sandbox"`, `"HOME=`+ph+`"`, 1)
		}},
		"credential env under another name": {bundle.ConfigFile, func(s string) string {
			return strings.Replace(s, `"FAKE_LLM_KEY=`, `"OTHER_KEY=`, 1)
		}},
		"in a key": {bundle.ConfigFile, func(s string) string {
			return strings.Replace(s, `"ociVersion"`, `"`+ph+`": 1, "ociVersion"`, 1)
		}},
		"in the hostname": {bundle.ConfigFile, func(s string) string {
			return strings.Replace(s, `"hostname": "paseo-sandbox"`, `"hostname": "`+ph+`"`, 1)
		}},
		"in the MCP url": {bundle.MCPConfigFile, func(s string) string {
			return strings.Replace(s, `callerAgentId=agent-7f3c`, `callerAgentId=`+ph, 1)
		}},
		"in the hosts file": {bundle.HostsFile, func(s string) string { return s + "# " + ph + "\n" }},
		"in egress.json": {bundle.EgressFile, func(s string) string {
			return strings.Replace(s, `"purpose": "model"`, `"purpose": "`+ph+`"`, 1)
		}},
		"in another manifest grant": {bundle.ManifestFile, func(s string) string {
			return strings.Replace(s, `"value": "/home/sandbox"`, `"value": "`+ph+`"`, 1)
		}},
		"in another manifest grant, JSON-escaped": {bundle.ManifestFile, func(s string) string {
			return strings.Replace(s, `"value": "/home/sandbox"`, `"value": "\u0040\u0040paseo-secret:bob/x@@"`, 1)
		}},
		"in the manifest's deployment": {bundle.ManifestFile, func(s string) string {
			return strings.Replace(s, `"deployment": "host-alice"`, `"deployment": "host-alice`+ph+`"`, 1)
		}},
	}
	for name, c := range edits {
		t.Run(name, func(t *testing.T) {
			files := goldenBundle(t)
			edited := c.edit(string(files[c.file]))
			if edited == string(files[c.file]) {
				t.Fatal("the edit changed nothing: the golden layout moved")
			}
			files[c.file] = []byte(edited)
			src := &recordingSource{}
			if _, _, err := fillSecrets(files, src.get); !errors.Is(err, ErrStrayPlaceholder) {
				t.Fatalf("got %v, want ErrStrayPlaceholder", err)
			}
			if len(src.asked) > 0 {
				t.Errorf("looked up %v before refusing", src.asked)
			}
		})
	}
}

// An MCP config with any header (a bearer written in by hand, or a
// placeholder the launcher would once have filled) is refused: nothing
// may put a credential in a file the agent reads.
func TestFillSecretsRefusesAnMCPHeader(t *testing.T) {
	for name, hdr := range map[string]string{
		"literal bearer": `"headers": {"Authorization": "Bearer leaked"}, `,
		"placeholder":    `"headers": {"Authorization": "Bearer ` + bundle.SecretPlaceholder("paseo/mcp-token") + `"}, `,
		"other header":   `"headers": {"X-Key": "k"}, `,
	} {
		t.Run(name, func(t *testing.T) {
			files := goldenBundle(t)
			edited := strings.Replace(string(files[bundle.MCPConfigFile]), `"auth": false`, hdr+`"auth": false`, 1)
			if edited == string(files[bundle.MCPConfigFile]) {
				t.Fatal("the edit changed nothing: the golden layout moved")
			}
			files[bundle.MCPConfigFile] = []byte(edited)
			if _, _, err := fillSecrets(files, (&recordingSource{}).get); err == nil {
				t.Fatal("an MCP config with a header was accepted")
			}
		})
	}
}

// BenchmarkFillSecrets is what slot filling, with the plan's decode and
// stray-placeholder walk, adds to a launch (the golden api-key bundle).
func BenchmarkFillSecrets(b *testing.B) {
	files, err := bundle.Read(testbundle.Repo(b, "testdata/host-pi-session-api-key/golden"))
	if err != nil {
		b.Fatal(err)
	}
	src := func(_, ref string) ([]byte, error) { return []byte("value-of-" + ref), nil }
	for b.Loop() {
		if _, _, err := fillSecrets(files, src); err != nil {
			b.Fatal(err)
		}
	}
}
