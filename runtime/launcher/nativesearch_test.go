package launcher

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/ocicheck"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
)

// searchOn is the registry patch of a deployment that turns the native
// search on (grant search workspace), in network mode sandbox.
const searchOn = `{"network":{"mode":"sandbox"},"deployments":{"host-alice":{"search":"native"}}}`

// launchRefused launches s and returns the refusal, checking nothing ran
// and nothing was left.
func launchRefused(t *testing.T, s *sandbox) error {
	t.Helper()
	var out, errb, log bytes.Buffer
	_, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Log: &log})
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("launch: %v, want a refusal", err)
	}
	if out.Len() > 0 || log.Len() > 0 {
		t.Errorf("output %q, log %q", out.String(), log.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(s.state, "records")); len(entries) > 0 {
		t.Errorf("records left: %v", entries)
	}
	s.assertClean(t)
	return err
}

// A plan that grants the search with no sandbox network (a bundle
// rewritten to network mode none; the compiler refuses to make one,
// PP-SEARCH-GATEWAY) has no gateway to serve searches on: the plan's
// validator refuses it (check search) before anything is made or run.
func TestNativeSearchRefusedWithoutGateway(t *testing.T) {
	s := compileScript(t, "echo ran", searchOn)
	testbundle.Rewrite(t, s.bundle, bundle.EgressFile, func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"mode": "sandbox"`), []byte(`"mode": "none"`), 1)
	})
	err := launchRefused(t, s)
	if !strings.Contains(err.Error(), ocicheck.CheckSearch+": the search is served on the sandbox network's gateway, and the network mode is not sandbox") {
		t.Fatalf("launch: %v, want the validator's check %s", err, ocicheck.CheckSearch)
	}
}

// The jail runs the image's own rg: a plan that grants the search for an
// image without one (the test scene's busybox root) is refused with
// PP-SEARCH-JAIL at launch.search before anything runs, never served
// another way.
func TestNativeSearchRefusedWithoutTheImagesRg(t *testing.T) {
	if err := nativesearch.Probe(); err != nil {
		t.Fatalf("this machine cannot build the search jail: %v", err)
	}
	err := launchRefused(t, compileScript(t, "echo ran", searchOn))
	var ue *UnavailableError
	errors.As(err, &ue)
	if d := ue.Diagnostics(); len(d) != 1 || d[0].Code != diag.SearchJail || d[0].Path != "launch.search" || !strings.Contains(d[0].Message, "has no rg") {
		t.Fatalf("launch: %v, diagnostics %v, want %s at launch.search", err, d, diag.SearchJail)
	}
}
