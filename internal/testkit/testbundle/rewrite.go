package testbundle

import (
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// Rewrite edits one file of a compiled bundle and records its new digest
// in the manifest, and the new manifest's digest in pins.json, as someone
// who can write the bundle dir could: the bundle still verifies, so what
// refuses it must be a check of its own.
func Rewrite(t testing.TB, dir, name string, edit func([]byte) []byte) {
	t.Helper()
	files, err := bundle.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	data := edit(files[name])
	if string(data) == string(files[name]) {
		t.Fatalf("rewriting %s changed nothing", name)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), data, 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := data
	if name != bundle.ManifestFile {
		m, err := files.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		m.Outputs[name] = bundle.Digest(data)
		if manifest, err = bundle.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, bundle.ManifestFile), manifest, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := files[bundle.PinsFile]; !ok {
		return
	}
	pins, err := files.Pins()
	if err != nil {
		t.Fatal(err)
	}
	pins.Manifest = bundle.Digest(manifest)
	out, err := bundle.Marshal(pins)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, bundle.PinsFile), out, 0o644); err != nil {
		t.Fatal(err)
	}
}
