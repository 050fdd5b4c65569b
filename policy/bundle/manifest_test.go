package bundle

import (
	"errors"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/grant"
)

// A manifest of another version or kind is refused as such, before its
// grants are looked at; a grant the decoder does not know is refused
// with its own code.
func TestManifestDecodeRefuses(t *testing.T) {
	const rest = `"compiler":"c","profile":"p","deployment":"d","topology":"host","agent":"a","image":{"version":"","digest":"","rootfs":""},"inputs":{},"outputs":{}`
	cases := []struct {
		name, doc string
		code      diag.Code
	}{
		{"v1alpha1", `{"apiVersion":"paseo.dev/policy/v1alpha1","kind":"Manifest",` + rest + `,"grants":[{"kind":"limit","subject":"wallSeconds","access":"max","value":"60","reason":"r","fact":"f"}]}`, diag.ManifestVersion},
		{"future version", `{"apiVersion":"paseo.dev/policy/v2","kind":"Manifest",` + rest + `,"grants":[]}`, diag.ManifestVersion},
		{"wrong kind", `{"apiVersion":"` + ManifestAPIVersion + `","kind":"Egress",` + rest + `,"grants":[]}`, diag.ManifestVersion},
		{"unknown grant kind", `{"apiVersion":"` + ManifestAPIVersion + `","kind":"Manifest",` + rest + `,"grants":[{"kind":"device","subject":"/dev/kvm","access":"rw","reason":"r","fact":"f"}]}`, diag.GrantUnknownKind},
		{"string limit", `{"apiVersion":"` + ManifestAPIVersion + `","kind":"Manifest",` + rest + `,"grants":[{"kind":"limit","subject":"wallSeconds","access":"max","value":"60","reason":"r","fact":"f"}]}`, diag.GrantInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Files{ManifestFile: []byte(tc.doc)}.Manifest()
			var ge *grant.Error
			switch {
			case err == nil:
				t.Fatal("decoded")
			case tc.code == diag.ManifestVersion && !errors.Is(err, ErrManifestVersion):
				t.Fatalf("got %v, want %s", err, tc.code)
			case tc.code != diag.ManifestVersion && (!errors.As(err, &ge) || ge.Code != tc.code):
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if !strings.Contains(err.Error(), string(tc.code)) {
				t.Errorf("error %q does not name %s", err, tc.code)
			}
		})
	}
	ok := `{"apiVersion":"` + ManifestAPIVersion + `","kind":"Manifest",` + rest + `,"grants":[{"kind":"limit","subject":"wallSeconds","access":"max","value":60,"reason":"r","fact":"f"}]}`
	m, err := Files{ManifestFile: []byte(ok)}.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := m.Grants[0].(grant.WallLimit); w.Wall.Seconds() != 60 {
		t.Errorf("decoded %+v, want a 60 s wall limit", m.Grants[0])
	}
}

// MarshalManifest is Marshal, byte for byte.
func TestMarshalManifestIsMarshal(t *testing.T) {
	m := &Manifest{APIVersion: ManifestAPIVersion, Kind: ManifestKind, Inputs: map[string]string{"facts": "sha256:x"}, Outputs: map[string]string{},
		Grants: grant.List{grant.Env{Name: "A", Value: "<b> & c"}, grant.WallLimit{Wall: 60e9}, grant.Argv{Words: []string{"pi"}}}}
	for _, m := range []*Manifest{m, {}} {
		want, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := MarshalManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("MarshalManifest:\n%s\nMarshal:\n%s", got, want)
		}
	}
}
