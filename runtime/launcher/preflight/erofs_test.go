package preflight

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// erofsBundle writes a bundle whose config mounts file at /opt as EROFS and
// whose manifest grant records digest (no grant when digest is empty).
func erofsBundle(t *testing.T, file, digest string) string {
	t.Helper()
	dir := t.TempDir()
	spec := specs.Spec{Version: specs.Version, Root: &specs.Root{Path: "rootfs", Readonly: true},
		Mounts: []specs.Mount{{Destination: "/opt", Type: "erofs", Source: file, Options: []string{"ro", "nosuid", "nodev"}}}}
	config, err := bundle.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	writeBundle(t, dir, config, nil)
	if digest == "" {
		return dir
	}
	// The same bundle with the grant in its manifest.
	files, err := bundle.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := files.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m.Grants = grant.List{grant.Mount{Destination: "/opt", Type: "erofs", Source: file, Digest: digest, Options: []string{"ro"}}}
	if files[bundle.ManifestFile], err = bundle.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := files.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// An EROFS file is used only with the digest the bundle was compiled for,
// only when nobody but root can change it, and a cached digest is reused
// only while the file's identity is unchanged.
func TestErofsDigests(t *testing.T) {
	skip.UnlessRoot(t, "the EROFS checks require root-owned files")
	images := filepath.Join(realTempDir(t), "images")
	if err := os.Mkdir(images, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(images, "opt.erofs")
	if err := os.WriteFile(file, []byte("image bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256([]byte("image bytes"))
	good := "sha256:" + hex.EncodeToString(s[:])
	cache := filepath.Join(t.TempDir(), "image-digests")

	if _, err := checkErofs(erofsBundle(t, file, good), cache); err != nil {
		t.Fatalf("matching file refused: %v", err)
	}
	wantIs(t, errOf(checkErofs(erofsBundle(t, file, "sha256:"+hex.EncodeToString(make([]byte, 32))), cache)), ErrDigestDiffers)
	wantIs(t, errOf(checkErofs(erofsBundle(t, file, ""), cache)), ErrNoDigestGrant)

	// A cache hit is used: a planted digest for the same identity wins...
	ents, err := os.ReadDir(cache)
	if err != nil || len(ents) != 1 {
		t.Fatalf("want one cache file, got %v (%v)", ents, err)
	}
	cf := filepath.Join(cache, ents[0].Name())
	var e digestEntry
	data, _ := os.ReadFile(cf)
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatal(err)
	}
	e.SHA256 = hex.EncodeToString(make([]byte, 32))
	data, _ = json.Marshal(e)
	if err := os.WriteFile(cf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	wantIs(t, errOf(checkErofs(erofsBundle(t, file, good), cache)), ErrDigestDiffers)
	// ...but rewriting the file changes its identity, so it is hashed again.
	if err := os.WriteFile(file, []byte("image bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := checkErofs(erofsBundle(t, file, good), cache); err != nil {
		t.Fatalf("after a rewrite the stale cache entry was used: %v", err)
	}

	// Files others could change between the check and runsc's open.
	if err := os.Chmod(file, 0o666); err != nil {
		t.Fatal(err)
	}
	wantIs(t, errOf(checkErofs(erofsBundle(t, file, good), cache)), ErrWritable)
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(images, 0o777); err != nil {
		t.Fatal(err)
	}
	wantIs(t, errOf(checkErofs(erofsBundle(t, file, good), cache)), ErrWritable)
	if err := os.Chmod(images, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(images, "link.erofs")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	wantIs(t, errOf(checkErofs(erofsBundle(t, link, good), cache)), syscall.ELOOP) // O_NOFOLLOW

	// A bundle with no EROFS mount passes.
	plain := t.TempDir()
	writeBundle(t, plain, minimalConfig(t, nil), nil)
	if detail, err := checkErofs(plain, cache); err != nil || detail != "no EROFS mounts" {
		t.Fatalf("plain bundle: %q, %v", detail, err)
	}
}

func errOf(_ string, err error) error { return err }
