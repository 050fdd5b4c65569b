package compiler

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The monitor's Git setting comes after the profile's own: a profile
// without Git settings gets a count of one; a profile whose env names
// core.fsmonitor itself (any case) is refused, never overridden; without
// the profile's ask there is no monitor grant, hook or setting at all.
func TestFSMonitorGitSettings(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	envOf := func(r *Result) map[string]string {
		m := map[string]string{}
		for _, g := range r.Plan.Grants {
			if e, ok := g.(grant.Env); ok {
				m[e.Name] = e.Value
			}
		}
		return m
	}

	r, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	if e := envOf(r); e["GIT_CONFIG_COUNT"] != "5" || e["GIT_CONFIG_KEY_4"] != "core.fsmonitor" || e["GIT_CONFIG_VALUE_4"] != bundle.FSMonitorHookPath {
		t.Errorf("the shipped profile: %v", e)
	}
	// The vouched index: compiled empty, bound read-only where the
	// profile's start script looks for it.
	if data, ok := r.Files[bundle.FSMonitorIndexFile]; !ok || len(data) != 0 {
		t.Errorf("%s compiled as %q (present %v), want empty", bundle.FSMonitorIndexFile, data, ok)
	}
	if !slices.ContainsFunc(r.Plan.Grants, func(g grant.Grant) bool {
		m, ok := g.(grant.Mount)
		return ok && m.Destination == bundle.FSMonitorIndexPath && m.Source == bundle.FSMonitorIndexFile && slices.Contains(m.Options, "ro")
	}) {
		t.Error("the vouched index is not bound read-only")
	}
	if !slices.ContainsFunc(r.Plan.Grants, func(g grant.Grant) bool {
		a, ok := g.(grant.Argv)
		return ok && slices.ContainsFunc(a.Words, func(w string) bool { return strings.Contains(w, "[ -s "+bundle.FSMonitorIndexPath+" ]") })
	}) {
		t.Errorf("the start script does not seed from %s", bundle.FSMonitorIndexPath)
	}

	noGit := withProfile(t, func(s string) string {
		var kept []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.Contains(l, "GIT_CONFIG_") {
				kept = append(kept, l)
			}
		}
		return strings.Join(kept, "\n")
	})
	r, diags = Compile(in, Options{Resolver: res, Profiles: noGit})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	if e := envOf(r); e["GIT_CONFIG_COUNT"] != "1" || e["GIT_CONFIG_KEY_0"] != "core.fsmonitor" {
		t.Errorf("a profile without Git settings: %v", e)
	}

	own := withProfile(t, func(s string) string {
		// The key as the profile spells it, whatever its alignment.
		return regexp.MustCompile(`GIT_CONFIG_KEY_3:\s+"core.preloadIndex"`).ReplaceAllLiteralString(s, `GIT_CONFIG_KEY_3: "Core.FSMonitor"`)
	})
	if _, diags = Compile(in, Options{Resolver: res, Profiles: own}); !slices.Contains(codes(diags), diag.ProfileInvalid) {
		t.Errorf("a profile naming core.fsmonitor: %v, want %s", diags, diag.ProfileInvalid)
	}

	none := withProfile(t, func(s string) string { return strings.Replace(s, "fsmonitor: true", "fsmonitor: false", 1) })
	r, diags = Compile(in, Options{Resolver: res, Profiles: none})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	if len(r.Plan.Of(grant.KindFSMonitor)) > 0 || r.Files[bundle.FSMonitorHookFile] != nil || r.Files[bundle.FSMonitorIndexFile] != nil || envOf(r)["GIT_CONFIG_COUNT"] != "4" {
		t.Errorf("a profile that does not ask: %v, hook %v, env %v", r.Plan.Of(grant.KindFSMonitor), r.Files[bundle.FSMonitorHookFile] != nil, envOf(r))
	}
}
