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
// environment, env=<placeholder of ref> in config.json and the credential
// env grant in the manifest, which the launcher fills from its secrets.
// Compile the scene with credential mode none (its model host is then a
// plain egress destination, as it was) and this is the old launch whole:
// the control of the model-key attacks.
func KeyInEnv(t testing.TB, dir, env, ref string) {
	t.Helper()
	slot := env + "=" + bundle.SecretPlaceholder(ref)
	Rewrite(t, dir, bundle.ConfigFile, func(b []byte) []byte {
		var spec map[string]any
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		proc := spec["process"].(map[string]any)
		proc["env"] = append(proc["env"].([]any), slot)
		out, err := bundle.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
	Rewrite(t, dir, bundle.ManifestFile, func([]byte) []byte {
		files, err := bundle.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		m, err := files.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		m.Grants = append(m.Grants, grant.Env{Name: env, Value: bundle.SecretPlaceholder(ref),
			Provenance: grant.Provenance{Reason: "provider API key; a placeholder the launcher replaces in its private copy", Fact: "credential.secretRef"}})
		out, err := bundle.MarshalManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
}
