package compiler

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/render/oci"
)

// The bundle's rendering takes the plan and nothing else.
var _ func(*bundle.Plan) (bundle.Files, *bundle.Manifest, error) = oci.Render

// Every rendering is a function of the plan alone: a plan rebuilt from the
// manifest's decoded grants and the plan's own fields (no compilation, no
// registry, no host) renders the compile's bytes, twice over.
func TestRenderFromPlanAlone(t *testing.T) {
	for _, name := range []string{"host-pi-session-api-key", "host-pi-session-oauth", "host-dns-resolver", "host-pi-session-erofs", "host-network-none", "docker-git-worktree"} {
		t.Run(name, func(t *testing.T) {
			_, in, res := caseInputs(t, name)
			r, diags := Compile(in, Options{Resolver: res})
			if len(diags) > 0 {
				t.Fatal(diags)
			}
			m, err := r.Files.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(r.Plan.Grants, m.Grants); diff != "" {
				t.Fatalf("manifest grants do not decode to the plan's (-plan +manifest):\n%s", diff)
			}
			header := *m
			header.Grants, header.Outputs = nil, nil
			rebuilt := &bundle.Plan{Plan: grant.Plan{Grants: m.Grants}, Header: header, DNS: r.Plan.DNS, Pins: r.Plan.Pins, Models: r.Plan.Models}
			for i := range 2 {
				files, _, err := oci.Render(rebuilt)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(r.Files.Names(), files.Names()); diff != "" {
					t.Fatalf("render %d: files (-compile +render):\n%s", i, diff)
				}
				for _, n := range files.Names() {
					if !bytes.Equal(files[n], r.Files[n]) {
						t.Errorf("render %d: %s differs from the compile's", i, n)
					}
				}
			}
		})
	}
}

// The plan's non-grant fields are plain data: they survive JSON, so
// nothing the renderers read hides behind a pointer into the compilation.
func TestPlanFieldsAreData(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	r, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	data, err := json.Marshal(r.Plan)
	if err != nil {
		t.Fatal(err)
	}
	var back bundle.Plan
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	files, _, err := oci.Render(&back)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range files.Names() {
		if !bytes.Equal(files[n], r.Files[n]) {
			t.Errorf("%s differs after the plan's JSON round trip", n)
		}
	}
}
