package compiler

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/profiles"
	"paseo.dev/paseo-policy/policy/schema"
)

func codes(l diag.List) []diag.Code {
	var out []diag.Code
	for _, d := range l {
		out = append(out, d.Code)
	}
	return out
}

// withProfile returns the embedded profiles with pi-session replaced.
func withProfile(t *testing.T, edit func(string) string) fstest.MapFS {
	t.Helper()
	fs := fstest.MapFS{}
	for _, n := range []string{"pi-session", "pi-catalog-probe", "pi-adapter-probe"} {
		data, err := profiles.FS.ReadFile(n + ".cue")
		if err != nil {
			t.Fatal(err)
		}
		if n == "pi-session" {
			data = []byte(edit(string(data)))
		}
		fs[n+".cue"] = &fstest.MapFile{Data: data}
	}
	return fs
}

// A profile can never grant a capability, whatever it says.
func TestProfileCapabilityRefused(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	fs := withProfile(t, func(s string) string {
		return strings.Replace(s, "capabilities: []", `capabilities: ["CAP_NET_ADMIN"]`, 1)
	})
	_, diags := Compile(in, Options{Resolver: res, Profiles: fs})
	if !slices.Contains(codes(diags), diag.ProfileInvalid) {
		t.Fatalf("got %v, want %s", diags, diag.ProfileInvalid)
	}
	if !strings.Contains(diags.Error(), "PP-CAPABILITY") {
		t.Errorf("the profile diagnostic should carry the capability code: %v", diags)
	}
}

// Profile limits only narrow: a cap above the registry changes nothing, a
// cap below it wins, and the manifest names both facts.
func TestProfileLimitsOnlyNarrow(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	fs := withProfile(t, func(s string) string {
		return strings.Replace(s, "limits: {}", "limits: {pids: 100000, wallSeconds: 60}", 1)
	})
	r, diags := Compile(in, Options{Resolver: res, Profiles: fs})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	got := map[string]grant.Grant{}
	for _, g := range r.Plan.Grants {
		got[g.Key()] = g
	}
	if g, _ := got["cgroup pids"].(grant.CgroupMax); g.Max != 512 || !strings.Contains(g.Fact, "profile.pi-session.limits.pids") {
		t.Errorf("pids: %+v (registry 512 must win over a larger cap)", g)
	}
	if g, _ := got["limit wallSeconds"].(grant.WallLimit); g.Wall != 60*time.Second {
		t.Errorf("wallSeconds: %+v (a smaller cap must win)", g)
	}
}

// The registry may be CUE as well as JSON, with the same result.
func TestRegistryAsCUE(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	want, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	// JSON is CUE; a comment and unquoted labels make it CUE proper.
	cue := "// operator registry\n" + strings.Replace(string(in.Registry.Data), `"apiVersion":`, "apiVersion:", 1)
	in.Registry = schema.Input{Name: "registry.cue", Data: []byte(cue)}
	got, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	for _, f := range want.Files.Names() {
		if !bytes.Equal(want.Files[f], got.Files[f]) {
			t.Errorf("%s differs between JSON and CUE registry", f)
		}
	}
}

// Every rendered file is covered by the manifest and verifies.
func TestBundleVerifies(t *testing.T) {
	_, in, res := caseInputs(t, "docker-pi-session")
	r, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	if err := r.Files.Verify(); err != nil {
		t.Fatal(err)
	}
	r.Files[bundle.EgressFile] = append(r.Files[bundle.EgressFile], ' ')
	if err := r.Files.Verify(); err == nil {
		t.Fatal("a modified egress.json verified")
	}
}

// The secret placeholder is the only credential material in a bundle.
func TestOnlyPlaceholderForSecrets(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	r, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	// The provider key has no placeholder either (issue 24): the model
	// route adds it, and the sandbox's variable holds the route's public
	// stand-in.
	cfg := string(r.Files[bundle.ConfigFile])
	if !strings.Contains(cfg, `"FAKE_LLM_KEY=`+bundle.ModelRoutePlaceholder+`"`) {
		t.Errorf("config.json lacks the model route's placeholder key")
	}
	for _, name := range r.Files.Names() {
		if strings.Contains(string(r.Files[name]), bundle.SecretMarker) {
			t.Errorf("%s carries a secret placeholder; nothing in an api-key bundle is filled at launch", name)
		}
	}
	if models := string(r.Files[bundle.ModelsFile]); !strings.Contains(models, `"apiKey": "`+bundle.ModelRoutePlaceholder+`"`) || !strings.Contains(models, `"baseUrl": "http://`+gatewayName+`:18080/v1"`) {
		t.Errorf("files/models.json does not point the provider at the route:\n%s", models)
	}
	// The MCP bearer has no placeholder: the route proxy adds it, so no
	// file of the bundle carries one or a header for it.
	mcp := string(r.Files[bundle.MCPConfigFile])
	if mcp == "" || strings.Contains(mcp, "Authorization") || strings.Contains(mcp, "headers") {
		t.Errorf("files/mcp.json is missing or carries a header:\n%s", mcp)
	}
	for _, name := range r.Files.Names() {
		if strings.Contains(string(r.Files[name]), "Bearer") || strings.Contains(string(r.Files[name]), bundle.SecretPlaceholder("paseo/mcp-token")) {
			t.Errorf("%s mentions a bearer token", name)
		}
	}
}

// Compiles on separate goroutines share nothing mutable (make test runs
// this under the race detector).
func TestConcurrentCompiles(t *testing.T) {
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	want, diags := Compile(in, Options{Resolver: res})
	if len(diags) > 0 {
		t.Fatal(diags)
	}
	errs := make(chan string, 8)
	for range 8 {
		go func() {
			got, diags := Compile(in, Options{Resolver: res})
			if len(diags) > 0 {
				errs <- diags.Error()
				return
			}
			// Every file: the renderer's pooled buffers and the
			// remembered registry are shared between these compiles.
			for _, name := range want.Files.Names() {
				if !bytes.Equal(got.Files[name], want.Files[name]) {
					errs <- "a concurrent compile gave different bytes for " + name
					return
				}
			}
			if len(got.Files) != len(want.Files) {
				errs <- "a concurrent compile gave different files"
				return
			}
			errs <- ""
		}()
	}
	for range 8 {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}
