package testbundle

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
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

// KeyInEnv makes a compiled bundle launch as every api-key launch did
// before the model route (issue 24): the provider key in the sandbox's
// environment, config.json's process.env given env=key. The product has
// no path for this (the launcher fills no secret into a bundle and
// refuses a placeholder); a control is a deliberately unsafe setup, so
// the test writes the key into the spec it launches itself. Compile the
// scene with credential mode none (its model host is then a plain egress
// destination, as it was) and this is the old launch whole: the control
// of the model-key attacks.
func KeyInEnv(t testing.TB, dir, env, key string) {
	t.Helper()
	Rewrite(t, dir, bundle.ConfigFile, func(b []byte) []byte {
		var spec map[string]any
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		proc := spec["process"].(map[string]any)
		proc["env"] = append(proc["env"].([]any), env+"="+key)
		out, err := bundle.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
}

// SecretSlot gives a compiled bundle the secret slot compilers wrote
// before the model route: env=<placeholder of ref> in config.json and the
// credential's env grant holding the placeholder in the manifest. The
// launcher fills no slot and refuses such a bundle (PP-SECRET-SLOT).
func SecretSlot(t testing.TB, dir, env, ref string) {
	t.Helper()
	ph := bundle.SecretPlaceholder(ref)
	Rewrite(t, dir, bundle.ConfigFile, func(b []byte) []byte {
		var spec map[string]any
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		proc := spec["process"].(map[string]any)
		proc["env"] = append(proc["env"].([]any), env+"="+ph)
		out, err := bundle.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
	Rewrite(t, dir, bundle.ManifestFile, func(b []byte) []byte {
		m, err := bundle.Files{bundle.ManifestFile: b}.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		m.Grants = append(m.Grants, grant.Env{Name: env, Value: ph,
			Provenance: grant.Provenance{Reason: "provider API key; a placeholder the launcher replaced in its private copy", Fact: "credential.secretRef"}})
		out, err := bundle.MarshalManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
}
