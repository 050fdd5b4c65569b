package preflight

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// The cache saves the hash only while the binary's identity is unchanged:
// any write to runsc changes its ctime and forces a full hash, and a cache
// file others can write is ignored.
func TestDigestCache(t *testing.T) {
	skip.UnlessRoot(t, "the digest cache is root-only")
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	if err := os.WriteFile(bin, []byte("first"), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "state", "runsc-digest.json")
	sum := func(b string) string { s := sha256.Sum256([]byte(b)); return hex.EncodeToString(s[:]) }

	if got := inspectRunscCached(bin, cache).sha256; got != sum("first") {
		t.Fatalf("first inspection %s, want %s", got, sum("first"))
	}
	// Plant a different digest for the same identity: a cache hit returns it,
	// which shows the binary was not read again.
	var e digestEntry
	data, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("no cache written: %v", err)
	}
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatal(err)
	}
	e.SHA256 = sum("planted")
	data, _ = json.Marshal(e)
	if err := os.WriteFile(cache, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := inspectRunscCached(bin, cache).sha256; got != sum("planted") {
		t.Fatalf("cache not used: %s", got)
	}
	// Tampering with the binary changes its identity: the real digest wins.
	// Same size, so only the times tell; file times come from the kernel's
	// coarse clock, so the write waits past one tick (at most 10 ms).
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(bin, []byte("evil!"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := inspectRunscCached(bin, cache).sha256; got != sum("evil!") {
		t.Fatalf("after a write the cached digest was used: %s", got)
	}
	// A cache file others may write is not trusted.
	info := inspectRunscCached(bin, cache) // refresh the entry for the new identity
	data, _ = os.ReadFile(cache)
	_ = json.Unmarshal(data, &e)
	e.SHA256 = sum("planted")
	data, _ = json.Marshal(e)
	if err := os.WriteFile(cache, data, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cache, 0o666); err != nil {
		t.Fatal(err)
	}
	if got := inspectRunscCached(bin, cache).sha256; got != info.sha256 || got != sum("evil!") {
		t.Fatalf("a world-writable cache was trusted: %s", got)
	}
}
