package compiler

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The native search as the compile decides it: with the registry's switch
// the grant is on at its port for the cwd, config.json's PATH starts with
// the client's directory, the client is bound read-only under each of its
// names and is the bundle's client for that port and workspace, and the
// hosts file names the gateway. Without the switch the grant is off, with
// no client and PATH as the image's; a profile that does not declare it
// and a deployment that does not ask leave the plan silent.
func TestSearchGrant(t *testing.T) {
	search := func(r *Result) *grant.Search {
		for _, g := range r.Plan.Of(grant.KindSearch) {
			s := g.(grant.Search)
			return &s
		}
		return nil
	}
	path := func(r *Result) string {
		for _, g := range r.Plan.Of(grant.KindEnv) {
			if e := g.(grant.Env); e.Name == "PATH" {
				return e.Value
			}
		}
		return ""
	}
	clientMounts := func(r *Result) []string {
		var out []string
		for _, g := range r.Plan.Of(grant.KindMount) {
			if m := g.(grant.Mount); m.Source == bundle.SearchClientFile {
				if !slices.Contains(m.Options, "ro") {
					t.Errorf("the client's mount at %s is not read-only: %v", m.Destination, m.Options)
				}
				out = append(out, m.Destination)
			}
		}
		return out
	}

	_, in, res := caseInputs(t, "host-search-native")
	r, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	s := search(r)
	if s == nil || !s.On || s.Port != searchPort || s.Path != "/srv/paseo/workspace/proj-feature" {
		t.Fatalf("the search grant: %+v", s)
	}
	if p := path(r); !strings.HasPrefix(p, bundle.SearchDir+":") {
		t.Errorf("PATH %q does not start with %s", p, bundle.SearchDir)
	}
	var want []string
	for _, n := range bundle.SearchClientNames {
		want = append(want, bundle.SearchDir+"/"+n)
	}
	if got := clientMounts(r); !slices.Equal(got, want) {
		t.Errorf("the client's mounts %v, want %v", got, want)
	}
	if !bytes.Equal(r.Files[bundle.SearchClientFile], bundle.SearchClient(bundle.GatewayName, s.Port, s.Path)) {
		t.Error("files/search-client is not the client for the grant's port and workspace")
	}
	// The spool: compiled empty, bound read-only and not executable at
	// its path, nowhere else.
	if data, ok := r.Files[bundle.SearchSpoolFile]; !ok || len(data) != 0 {
		t.Errorf("%s compiled as %q (present %v), want empty", bundle.SearchSpoolFile, data, ok)
	}
	var spools []string
	for _, g := range r.Plan.Of(grant.KindMount) {
		if m := g.(grant.Mount); m.Source == bundle.SearchSpoolFile {
			if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "noexec") {
				t.Errorf("the spool's mount at %s: %v, want read-only and noexec", m.Destination, m.Options)
			}
			spools = append(spools, m.Destination)
		}
	}
	if !slices.Equal(spools, []string{bundle.SearchSpoolPath}) {
		t.Errorf("the spool is bound at %v, want %s only", spools, bundle.SearchSpoolPath)
	}
	if !bytes.Contains(r.Files[bundle.EgressFile], []byte(`"gateway": {`)) || !bytes.Contains(r.Files[bundle.EgressFile], []byte(`"name": "`+bundle.GatewayName+`"`)) {
		t.Errorf("egress.json does not name the gateway %s, where the search is served", bundle.GatewayName)
	}

	_, in, res = caseInputs(t, "host-pi-session-api-key")
	if r, diags = Compile(in, Options{Resolver: res}); len(diags) > 0 {
		t.Fatal(diags)
	}
	if s := search(r); s == nil || s.On || !strings.Contains(s.Reason, "opt-in") {
		t.Errorf("without the switch: %+v, want the grant off with its reason", s)
	}
	if p := path(r); strings.Contains(p, bundle.SearchDir) || r.Files[bundle.SearchClientFile] != nil || r.Files[bundle.SearchSpoolFile] != nil || len(clientMounts(r)) > 0 {
		t.Errorf("without the switch: PATH %q, client %v, mounts %v", p, r.Files[bundle.SearchClientFile] != nil, clientMounts(r))
	}

	none := withProfile(t, func(s string) string { return strings.Replace(s, "nativeSearch: true", "nativeSearch: false", 1) })
	if r, diags = Compile(in, Options{Resolver: res, Profiles: none}); len(diags) > 0 {
		t.Fatal(diags)
	}
	if s := search(r); s != nil {
		t.Errorf("a profile that does not declare it, no switch: %+v", s)
	}
}
