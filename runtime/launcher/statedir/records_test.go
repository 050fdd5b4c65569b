package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Lookup finds a record by its id alone; an id that cannot name a record
// has none, and a damaged record is an error, not a missing one.
func TestLookup(t *testing.T) {
	root := t.TempDir()
	if _, ok, err := Lookup(root, "pp-a"); ok || err != nil {
		t.Fatalf("lookup with no records dir: %v %v", ok, err)
	}
	rec := Record{ID: "pp-a", Network: "none", LauncherPID: 1 << 30}
	if err := WriteRecord(root, rec); err != nil {
		t.Fatal(err)
	}
	if err := WriteRecord(root, rec); !errors.Is(err, os.ErrExist) {
		t.Errorf("second record of one id: %v, want refused (fs.ErrExist)", err)
	}
	got, ok, err := Lookup(root, "pp-a")
	if err != nil || !ok || got.ID != "pp-a" || got.Network != "none" {
		t.Fatalf("lookup: %+v %v %v", got, ok, err)
	}
	if !got.Ended() {
		t.Error("a record whose launcher does not exist is not ended")
	}
	for _, id := range []string{"pp-b", "", ".", "..", "../records/pp-a", "a/b"} {
		if _, ok, err := Lookup(root, id); ok || err != nil {
			t.Errorf("lookup of %q: %v %v, want none", id, ok, err)
		}
	}
	if err := os.WriteFile(filepath.Join(RecordsDir(root), "pp-c.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := Lookup(root, "pp-c"); ok || err == nil {
		t.Errorf("lookup of a damaged record: %v %v, want an error", ok, err)
	}
	if err := RemoveRecord(root, "pp-a"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := Lookup(root, "pp-a"); ok || err != nil {
		t.Errorf("lookup after remove: %v %v", ok, err)
	}
}
