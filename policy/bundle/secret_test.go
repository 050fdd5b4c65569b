package bundle

import (
	"errors"
	"testing"
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

// A bundle without secret grants may hold no marker anywhere, in any
// spelling.
func TestCheckSecretPlaceholdersWithoutSlots(t *testing.T) {
	base := func() Files {
		return Files{
			ManifestFile: []byte(`{"apiVersion":"paseo.dev/policy/v1alpha2","kind":"Manifest","compiler":"c","profile":"p","deployment":"d","topology":"host","agent":"a","image":{"version":"","digest":"","rootfs":""},"inputs":{},"outputs":{},"grants":[]}`),
			ConfigFile:   []byte(`{"process":{"args":["pi"],"env":["HOME=/home/sandbox"]}}`),
			EgressFile:   []byte(`{"rules":[]}`),
			HostsFile:    []byte("127.0.0.1\tlocalhost\n"),
		}
	}
	dep, slots, err := CheckSecretPlaceholders(base())
	if err != nil || dep != "d" || len(slots) != 0 {
		t.Fatalf("clean bundle: %q %v %v", dep, slots, err)
	}
	for name, edit := range map[string]func(Files){
		"argv":          func(f Files) { f[ConfigFile] = []byte(`{"process":{"args":["pi","@@paseo-secret:a@@"]}}`) },
		"escaped argv":  func(f Files) { f[ConfigFile] = []byte(`{"process":{"args":["pi","\u0040@paseo-secret:a@@"]}}`) },
		"env, no grant": func(f Files) { f[ConfigFile] = []byte(`{"process":{"env":["K_KEY=@@paseo-secret:a@@"]}}`) },
		"hosts":         func(f Files) { f[HostsFile] = []byte("# @@paseo-secret:a@@\n") },
		"egress key":    func(f Files) { f[EgressFile] = []byte(`{"@@paseo-secret:a@@":1}`) },
	} {
		f := base()
		edit(f)
		if _, _, err := CheckSecretPlaceholders(f); !errors.Is(err, ErrStrayPlaceholder) {
			t.Errorf("%s: got %v, want ErrStrayPlaceholder", name, err)
		}
	}
}
