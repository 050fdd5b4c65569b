package pathsafe

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// tree builds base/srv/ws/{proj/sub,file} and returns base.
func tree(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{"srv/ws/proj/sub", "srv/other"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "srv/ws/file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return base
}

func codeOf(err error) diag.Code {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func TestResolveIdentity(t *testing.T) {
	base := tree(t)
	r := Resolver{Base: base}
	id, err := r.Resolve("/srv/ws", "/srv/ws/proj/sub")
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(base, "srv/ws/proj/sub"), &st); err != nil {
		t.Fatal(err)
	}
	if id.Ino != st.Ino || id.Dev != st.Dev || id.Kind != Dir {
		t.Errorf("identity %+v does not match stat ino %d dev %d", id, st.Ino, st.Dev)
	}
	if id, err := r.Resolve("/srv/ws", "/srv/ws/file"); err != nil || id.Kind != File {
		t.Errorf("file: %+v %v", id, err)
	}
	if id, err := r.Resolve("/srv/ws", "/srv/ws"); err != nil || id.Kind != Dir {
		t.Errorf("root itself: %+v %v", id, err)
	}
}

func TestResolveRefusals(t *testing.T) {
	cases := []struct {
		name       string
		setup      func(base string) error
		root, path string
		want       diag.Code
	}{
		{"missing", nil, "/srv/ws", "/srv/ws/nope", diag.PathMissing},
		{"outside root", nil, "/srv/ws", "/srv/other", diag.PathOutsideRoot},
		{"sibling prefix is not beneath", nil, "/srv/ws", "/srv/wsx", diag.PathOutsideRoot},
		{"file as directory", nil, "/srv/ws", "/srv/ws/file/x", diag.PathType},
		{"symlink leaf", func(b string) error { return os.Symlink("/srv/other", filepath.Join(b, "srv/ws/link")) }, "/srv/ws", "/srv/ws/link", diag.PathSymlink},
		{"symlink component", func(b string) error { return os.Symlink("proj", filepath.Join(b, "srv/ws/link")) }, "/srv/ws", "/srv/ws/link/sub", diag.PathSymlink},
		{"relative symlink escaping", func(b string) error { return os.Symlink("../../..", filepath.Join(b, "srv/ws/up")) }, "/srv/ws", "/srv/ws/up", diag.PathSymlink},
		{"root is a symlink", func(b string) error { return os.Symlink("/srv/other", filepath.Join(b, "srv/lnroot")) }, "/srv/lnroot", "/srv/lnroot", diag.PathSymlink},
		{"swapped for a symlink", func(b string) error {
			p := filepath.Join(b, "srv/ws/proj")
			if err := os.Rename(p, filepath.Join(b, "srv/ws/moved")); err != nil {
				return err
			}
			return os.Symlink("moved", p)
		}, "/srv/ws", "/srv/ws/proj/sub", diag.PathSymlink},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := tree(t)
			if tc.setup != nil {
				if err := tc.setup(base); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Resolver{Base: base}.Resolve(tc.root, tc.path)
			if got := codeOf(err); got != tc.want {
				t.Errorf("got %v (%v), want %s", got, err, tc.want)
			}
		})
	}
}

// A directory swapped for another at the same path resolves, but to a
// different identity: that is what the launcher's pin check catches.
func TestSwappedDirectoryChangesIdentity(t *testing.T) {
	base := tree(t)
	r := Resolver{Base: base}
	before, err := r.Resolve("/srv/ws", "/srv/ws/proj")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(base, "srv/ws/proj")
	if err := os.Rename(p, p+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	after, err := r.Resolve("/srv/ws", "/srv/ws/proj")
	if err != nil {
		t.Fatal(err)
	}
	if before == after {
		t.Errorf("identity did not change across a swap: %+v", after)
	}
	// OpenPinned refuses the new object against the old pin and opens it
	// against its own.
	if _, err := r.OpenPinned("/srv/ws", "/srv/ws/proj", before); codeOf(err) != diag.PathReplaced {
		t.Errorf("swapped: got %v, want %s", err, diag.PathReplaced)
	}
	fd, err := r.OpenPinned("/srv/ws", "/srv/ws/proj", after)
	if err != nil {
		t.Fatalf("the object pinned: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != after.Ino {
		t.Errorf("descriptor of inode %d (%v), pinned %d", st.Ino, err, after.Ino)
	}
	unix.Close(fd)
	kind := after
	kind.Kind = File
	if _, err := r.OpenPinned("/srv/ws", "/srv/ws/proj", kind); codeOf(err) != diag.PathReplaced {
		t.Errorf("same inode, another kind: got %v, want %s", err, diag.PathReplaced)
	}
}

// Magic links (/proc/self/root and friends) are refused on the real host.
func TestMagicLinkRefused(t *testing.T) {
	_, err := Resolver{}.Resolve("/proc/self", "/proc/self/root")
	if got := codeOf(err); got != diag.PathSymlink {
		t.Errorf("got %v (%v), want %s", got, err, diag.PathSymlink)
	}
}

// A bind mount nested beneath a root (bind-style nesting) is refused: the
// registered root must be the mount point itself.
func TestNestedBindMountRefused(t *testing.T) {
	skip.UnlessRoot(t, "it bind-mounts a directory")
	base := tree(t)
	target := filepath.Join(base, "srv/ws/proj/sub")
	if err := unix.Mount(filepath.Join(base, "srv/other"), target, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	r := Resolver{Base: base}
	if _, err := r.Resolve("/srv/ws", "/srv/ws/proj/sub"); codeOf(err) != diag.PathCrossMount {
		t.Errorf("mount point: got %v, want %s", err, diag.PathCrossMount)
	}
	if _, err := r.Resolve("/srv/ws", "/srv/ws/proj"); err != nil {
		t.Errorf("the parent of a mount point still resolves: %v", err)
	}
	// Registering the mount point itself as the root works.
	if _, err := r.Resolve("/srv/ws/proj/sub", "/srv/ws/proj/sub"); err != nil {
		t.Errorf("mount point as root: %v", err)
	}
}
