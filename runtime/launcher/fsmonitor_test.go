package launcher

import (
	"slices"
	"strings"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
)

// The monitor's additions to the run copy: its read-only bind, and
// core.fsmonitor as one more Git setting after the profile's; a compiled
// env that already names core.fsmonitor, or a count that is not one, is
// refused rather than overridden.
func TestWithFSMonitor(t *testing.T) {
	spec := &rspec.Spec{Process: &rspec.Process{Env: []string{"PATH=/bin", "GIT_CONFIG_COUNT=2",
		"GIT_CONFIG_KEY_0=core.checkStat", "GIT_CONFIG_VALUE_0=minimal", "GIT_CONFIG_KEY_1=core.untrackedCache", "GIT_CONFIG_VALUE_1=true"}}}
	if err := withFSMonitor(spec, &fsmonitorState{dir: "/run-dir/fsmonitor"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"GIT_CONFIG_COUNT=3", "GIT_CONFIG_KEY_2=core.fsmonitor", "GIT_CONFIG_VALUE_2=" + fsmonitor.HookPath} {
		if !slices.Contains(spec.Process.Env, want) {
			t.Errorf("env lacks %s: %q", want, spec.Process.Env)
		}
	}
	if slices.Contains(spec.Process.Env, "GIT_CONFIG_COUNT=2") {
		t.Error("the old count is still there")
	}
	m := spec.Mounts[len(spec.Mounts)-1]
	if m.Destination != fsmonitor.Dir || m.Source != "/run-dir/fsmonitor" || !slices.Contains(m.Options, "ro") {
		t.Errorf("the bind: %+v", m)
	}

	none := &rspec.Spec{Process: &rspec.Process{Env: []string{"PATH=/bin"}}}
	if err := withFSMonitor(none, &fsmonitorState{dir: "/d"}); err != nil || !slices.Contains(none.Process.Env, "GIT_CONFIG_COUNT=1") ||
		!slices.Contains(none.Process.Env, "GIT_CONFIG_KEY_0=core.fsmonitor") {
		t.Errorf("no Git settings before: %v, %q", err, none.Process.Env)
	}
	for _, env := range [][]string{
		{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.fsmonitor", "GIT_CONFIG_VALUE_0=/x"},
		{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=Core.FSMonitor", "GIT_CONFIG_VALUE_0=/x"},
		{"GIT_CONFIG_COUNT=x"},
		{"GIT_CONFIG_COUNT=-1"},
	} {
		s := &rspec.Spec{Process: &rspec.Process{Env: env}}
		if err := withFSMonitor(s, &fsmonitorState{dir: "/d"}); err == nil || !strings.Contains(err.Error(), "fsmonitor") {
			t.Errorf("env %q: %v, want a refusal", env, err)
		}
	}
}
