package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/ocicheck"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

// goldenDir is a copy of the compiler's reviewed bundle without a
// credential (and with an MCP config without a bearer), to edit.
func goldenDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, os.DirFS(testbundle.Repo(t, "testdata/host-pi-session-direct-model/golden"))); err != nil {
		t.Fatal(err)
	}
	return dir
}

func goldenBundle(t *testing.T) bundle.Files {
	t.Helper()
	files, err := bundle.Read(goldenDir(t))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// markerRefusal is the launch plan's refusal of files' placeholders: the
// MarkerError and the verdict's finding, which preflight reports.
func markerRefusal(t *testing.T, files bundle.Files) *bundle.MarkerError {
	t.Helper()
	plan := launchplan.FromFiles("", files)
	var me *bundle.MarkerError
	if !errors.As(plan.MarkersErr, &me) {
		t.Fatalf("the plan's marker check: %v, want a *bundle.MarkerError", plan.MarkersErr)
	}
	if f := plan.Verdict.Failed(ocicheck.CheckSecretPlaceholders); len(f) != 1 || !strings.Contains(f[0].Detail, string(me.Code)) {
		t.Errorf("verdict findings %+v, want one %s naming %s", f, ocicheck.CheckSecretPlaceholders, me.Code)
	}
	return me
}

// The compiler's bundle holds no placeholder: the plan finds nothing.
func TestGoldenBundleHoldsNoPlaceholder(t *testing.T) {
	plan := launchplan.FromFiles("", goldenBundle(t))
	if plan.MarkersErr != nil || len(plan.Verdict.Failed(ocicheck.CheckSecretPlaceholders)) > 0 {
		t.Fatalf("the golden bundle refused: %v", plan.MarkersErr)
	}
}

// A bundle with the secret slot compilers wrote before the model route is
// refused as one (PP-SECRET-SLOT, ErrSecretSlot) at its manifest grant:
// no launcher fills it now.
func TestLegacySecretSlotRefused(t *testing.T) {
	dir := goldenDir(t)
	testbundle.SecretSlot(t, dir, "FAKE_LLM_KEY", "alice/fake-llm")
	files, err := bundle.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	me := markerRefusal(t, files)
	if me.Code != diag.SecretSlot || me.File != bundle.ManifestFile || !errors.Is(me, ErrSecretSlot) {
		t.Errorf("got %+v (%v), want %s in %s", *me, me, diag.SecretSlot, bundle.ManifestFile)
	}
}

// A placeholder anywhere in the bundle is refused, however it is written,
// with PP-SECRET-MARKER at its place.
func TestStrayPlaceholdersRefused(t *testing.T) {
	ph := bundle.SecretPlaceholder("alice/fake-llm")
	edits := map[string]struct {
		file, at string
		edit     func(string) string
	}{
		"in argv (model id)": {bundle.ConfigFile, "process.args.[5]", func(s string) string {
			return strings.Replace(s, `"pi",`, `"pi", "--model", "fake/x`+ph+`",`, 1)
		}},
		"in argv, JSON-escaped": {bundle.ConfigFile, "process.args.[4]", func(s string) string {
			return strings.Replace(s, `"pi",`, `"pi", "\u0040\u0040paseo-secret:alice/fake-llm@@",`, 1)
		}},
		"in an env entry": {bundle.ConfigFile, "", func(s string) string {
			return strings.Replace(s, `"HOME=/home/sandbox"`, `"HOME=`+ph+`"`, 1)
		}},
		"in a key": {bundle.ConfigFile, ph, func(s string) string {
			return strings.Replace(s, `"ociVersion"`, `"`+ph+`": 1, "ociVersion"`, 1)
		}},
		"in the hostname": {bundle.ConfigFile, "hostname", func(s string) string {
			return strings.Replace(s, `"hostname": "paseo-sandbox"`, `"hostname": "`+ph+`"`, 1)
		}},
		"in the MCP url": {bundle.MCPConfigFile, "mcpServers.paseo.url", func(s string) string {
			return strings.Replace(s, `callerAgentId=agent-7f3c`, `callerAgentId=`+ph, 1)
		}},
		"in the hosts file": {bundle.HostsFile, "", func(s string) string { return s + "# " + ph + "\n" }},
		"in egress.json": {bundle.EgressFile, "", func(s string) string {
			return strings.Replace(s, `"purpose": "model"`, `"purpose": "`+ph+`"`, 1)
		}},
		"in a manifest grant": {bundle.ManifestFile, "", func(s string) string {
			return strings.Replace(s, `"value": "/home/sandbox"`, `"value": "`+ph+`"`, 1)
		}},
		"in a manifest grant, JSON-escaped": {bundle.ManifestFile, "", func(s string) string {
			return strings.Replace(s, `"value": "/home/sandbox"`, `"value": "\u0040\u0040paseo-secret:bob/x@@"`, 1)
		}},
		"in the manifest's deployment": {bundle.ManifestFile, "deployment", func(s string) string {
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
			me := markerRefusal(t, files)
			if me.Code != diag.SecretMarker || me.File != c.file || (c.at != "" && me.At != c.at) || !errors.Is(me, ErrStrayPlaceholder) {
				t.Errorf("got %+v, want %s in %s at %q", *me, diag.SecretMarker, c.file, c.at)
			}
		})
	}
}

// An MCP config with any header (a bearer written in by hand, or a
// placeholder the launcher would once have filled) is refused: nothing
// may put a credential in a file the agent reads. Control: the
// compiler's config passes unchanged.
func TestCheckMCPRefusesAHeader(t *testing.T) {
	orig := goldenBundle(t)[bundle.MCPConfigFile]
	if got, err := checkMCP(orig); err != nil || string(got) != string(orig) {
		t.Fatalf("the compiler's MCP config: %v (changed: %v)", err, string(got) != string(orig))
	}
	for name, hdr := range map[string]string{
		"literal bearer": `"headers": {"Authorization": "Bearer leaked"}, `,
		"placeholder":    `"headers": {"Authorization": "Bearer ` + bundle.SecretPlaceholder("paseo/mcp-token") + `"}, `,
		"other header":   `"headers": {"X-Key": "k"}, `,
	} {
		t.Run(name, func(t *testing.T) {
			edited := strings.Replace(string(orig), `"auth": false`, hdr+`"auth": false`, 1)
			if edited == string(orig) {
				t.Fatal("the edit changed nothing: the golden layout moved")
			}
			if _, err := checkMCP([]byte(edited)); err == nil {
				t.Fatal("an MCP config with a header was accepted")
			}
		})
	}
}
