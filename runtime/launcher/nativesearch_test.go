package launcher

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
)

// The search client's additions to the run copy: its read-only bind, and
// its directory first on PATH (so `rg` is the client); a compiled env
// without PATH is refused.
func TestWithNativeSearch(t *testing.T) {
	spec := &rspec.Spec{Process: &rspec.Process{Env: []string{"HOME=/h", "PATH=/usr/local/bin:/usr/bin:/bin"}}}
	if err := withNativeSearch(spec, &nativeSearchState{dir: "/run-dir/search"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Process.Env, "PATH="+nativesearch.Dir+":/usr/local/bin:/usr/bin:/bin") {
		t.Errorf("PATH: %q", spec.Process.Env)
	}
	m := spec.Mounts[len(spec.Mounts)-1]
	if m.Destination != nativesearch.Dir || m.Source != "/run-dir/search" || !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") {
		t.Errorf("the bind: %+v", m)
	}
	if err := withNativeSearch(&rspec.Spec{Process: &rspec.Process{Env: []string{"HOME=/h"}}}, &nativeSearchState{dir: "/d"}); err == nil {
		t.Error("an env without PATH was not refused")
	}
}

// The search port is NativeSearchPort unless a route or the monitor has it.
func TestNativeSearchPort(t *testing.T) {
	if p := nativeSearchPort(nil); p != NativeSearchPort {
		t.Errorf("no routes: %d", p)
	}
	if p := nativeSearchPort([]bundle.Route{{Port: NativeSearchPort}}, NativeSearchPort+1); p != NativeSearchPort+2 {
		t.Errorf("a route and the monitor on the next two: %d", p)
	}
	const monitor = 18090 // the compiler's monitor port when no route has it
	if nativeSearchPort(nil, monitor) == monitor || nativeSearchPort(nil, NativeSearchPort) == NativeSearchPort {
		t.Error("the search server took the monitor's port")
	}
}

// A bundle without a sandbox network has no gateway to serve searches on:
// the launch is refused before anything is made or run.
func TestNativeSearchRefusedWithoutGateway(t *testing.T) {
	s := compileScript(t, "echo ran", "")
	var out, errb, log bytes.Buffer
	_, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Log: &log, NativeSearch: true})
	var ue *UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, ErrNativeSearchNoGateway) {
		t.Fatalf("launch: %v, want ErrNativeSearchNoGateway", err)
	}
	if out.Len() > 0 || log.Len() > 0 {
		t.Errorf("output %q, log %q", out.String(), log.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(s.state, "records")); len(entries) > 0 {
		t.Errorf("records left: %v", entries)
	}
	s.assertClean(t)
}
