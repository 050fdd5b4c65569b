package bundle

import (
	"errors"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/grant"
)

func TestPlaceholderRef(t *testing.T) {
	for s, want := range map[string]string{
		"@@paseo-secret:alice/fake-llm@@": "alice/fake-llm",
		"x@@paseo-secret:a@@":             "",
		"@@paseo-secret:a@@x":             "",
		"@@paseo-secret:@@":               "",
		"@@paseo-secret:a@@b@@":           "",
		"Bearer @@paseo-secret:a@@":       "",
	} {
		got, ok := PlaceholderRef(s)
		if got != want || ok != (want != "") {
			t.Errorf("PlaceholderRef(%q) = %q, %v; want %q", s, got, ok, want)
		}
	}
}

// A bundle may hold no marker anywhere, in any spelling: each is refused
// with PP-SECRET-MARKER at its place. The clean bundle passes.
func TestCheckNoSecretMarkers(t *testing.T) {
	base := func() Files {
		return Files{
			ManifestFile: []byte(`{"apiVersion":"paseo.dev/policy/v1alpha2","kind":"Manifest","compiler":"c","profile":"p","deployment":"d","topology":"host","agent":"a","image":{"version":"","digest":"","rootfs":""},"inputs":{},"outputs":{},"grants":[]}`),
			ConfigFile:   []byte(`{"process":{"args":["pi"],"env":["HOME=/home/sandbox"]}}`),
			EgressFile:   []byte(`{"rules":[]}`),
			HostsFile:    []byte("127.0.0.1\tlocalhost\n"),
		}
	}
	check := func(f Files) error {
		m, err := f.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		return CheckNoSecretMarkers(f, m)
	}
	if err := check(base()); err != nil {
		t.Fatalf("clean bundle: %v", err)
	}
	for name, c := range map[string]struct {
		edit     func(Files)
		file, at string
	}{
		"argv":          {func(f Files) { f[ConfigFile] = []byte(`{"process":{"args":["pi","@@paseo-secret:a@@"]}}`) }, ConfigFile, "process.args.[1]"},
		"escaped argv":  {func(f Files) { f[ConfigFile] = []byte(`{"process":{"args":["pi","\u0040@paseo-secret:a@@"]}}`) }, ConfigFile, "process.args.[1]"},
		"env, no grant": {func(f Files) { f[ConfigFile] = []byte(`{"process":{"env":["K_KEY=@@paseo-secret:a@@"]}}`) }, ConfigFile, "process.env.[0]"},
		"hosts":         {func(f Files) { f[HostsFile] = []byte("# @@paseo-secret:a@@\n") }, HostsFile, ""},
		"egress key":    {func(f Files) { f[EgressFile] = []byte(`{"@@paseo-secret:a@@":1}`) }, EgressFile, "@@paseo-secret:a@@"},
	} {
		f := base()
		c.edit(f)
		err := check(f)
		var me *MarkerError
		if !errors.As(err, &me) || !errors.Is(err, ErrStrayPlaceholder) {
			t.Errorf("%s: got %v, want a MarkerError for ErrStrayPlaceholder", name, err)
			continue
		}
		if want := (MarkerError{Code: diag.SecretMarker, File: c.file, At: c.at}); *me != want {
			t.Errorf("%s: got %+v, want %+v", name, *me, want)
		}
	}
}

// A legacy secret slot (the credential's env grant holding a placeholder,
// as compilers wrote it before the model route) is refused as a slot,
// PP-SECRET-SLOT at the grant, not filled and not started.
func TestCheckNoSecretMarkersRefusesALegacySlot(t *testing.T) {
	ph := SecretPlaceholder("alice/fake-llm")
	m := &Manifest{Deployment: "d", Grants: []grant.Grant{
		grant.Env{Name: "HOME", Value: "/home/sandbox", Provenance: grant.Provenance{Reason: "r", Fact: "profile.p.env.HOME"}},
		grant.Env{Name: "FAKE_LLM_KEY", Value: ph, Provenance: grant.Provenance{Reason: "r", Fact: "credential.secretRef"}},
	}}
	files := Files{ConfigFile: []byte(`{"process":{"env":["FAKE_LLM_KEY=` + ph + `"]}}`)}
	err := CheckNoSecretMarkers(files, m)
	var me *MarkerError
	if !errors.As(err, &me) || !errors.Is(err, ErrSecretSlot) || errors.Is(err, ErrStrayPlaceholder) {
		t.Fatalf("got %v, want a MarkerError for ErrSecretSlot", err)
	}
	if want := (MarkerError{Code: diag.SecretSlot, File: ManifestFile, At: "grants.[1].value"}); *me != want {
		t.Errorf("got %+v, want %+v", *me, want)
	}
	// Control: the same grant with a plain value is no slot.
	m.Grants[1] = grant.Env{Name: "FAKE_LLM_KEY", Value: "paseo-model-route", Provenance: grant.Provenance{Reason: "r", Fact: "credential.secretRef"}}
	if err := CheckNoSecretMarkers(Files{ConfigFile: []byte(`{"process":{"env":["FAKE_LLM_KEY=paseo-model-route"]}}`)}, m); err != nil {
		t.Errorf("the model route's stand-in refused: %v", err)
	}
}
