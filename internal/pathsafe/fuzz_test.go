package pathsafe

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathform"
)

// FuzzResolve: whatever path the fuzzer makes up, a successful resolution
// names an object inside the registered root, never anything a symlink
// in the tree points at.
func FuzzResolve(f *testing.F) {
	base := f.TempDir()
	root := filepath.Join(base, "srv/ws")
	for _, d := range []string{"srv/ws/a/b", "srv/ws/c", "srv/secret"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for link, target := range map[string]string{"srv/ws/up": "../secret", "srv/ws/a/abs": "/srv/secret", "srv/ws/c/loop": "loop"} {
		if err := os.Symlink(target, filepath.Join(base, link)); err != nil {
			f.Fatal(err)
		}
	}
	inside := map[[2]uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			inside[[2]uint64{st.Dev, st.Ino}] = true
		}
		return nil
	})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"/srv/ws/a/b", "/srv/ws/up", "/srv/ws/a/abs", "/srv/ws/c/loop", "/srv/ws/../secret", "/srv/ws/a/../../secret"} {
		f.Add(s)
	}
	r := Resolver{Base: base}
	f.Fuzz(func(t *testing.T, p string) {
		if code, _ := pathform.Check(p); code != "" || !pathform.Beneath("/srv/ws", p) {
			return
		}
		id, err := r.Resolve("/srv/ws", p)
		if err != nil {
			return
		}
		if !inside[[2]uint64{id.Dev, id.Ino}] {
			t.Fatalf("%q resolved to an object outside the root", p)
		}
	})
}
