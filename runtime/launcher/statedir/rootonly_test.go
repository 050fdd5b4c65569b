package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// The chain of directories to a checkpoint must keep its entries for
// root: each root's, none writable by group or others unless sticky, and
// a symlink on the way root's with a target that passes too.
func TestCheckRootChain(t *testing.T) {
	skip.UnlessRoot(t, "it chowns the chain's entries to root and others")
	base := t.TempDir()
	mk := func(rel string, mode os.FileMode, uid int) string {
		t.Helper()
		p := filepath.Join(base, rel)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(rel, target string, uid int) string {
		t.Helper()
		p := filepath.Join(base, rel)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := mk("good/state", 0o700, 0)
	mk("sticky", 0o777|os.ModeSticky, 0)
	sticky := mk("sticky/state", 0o700, 0)
	mk("stickyother", 0o777|os.ModeSticky, 0)
	stickyOther := mk("stickyother/state", 0o700, 4242)
	groupW := mk("groupw/state", 0o700, 0)
	if err := os.Chmod(filepath.Dir(groupW), 0o770); err != nil {
		t.Fatal(err)
	}
	worldW := mk("worldw/state", 0o700, 0)
	if err := os.Chmod(filepath.Dir(worldW), 0o777); err != nil {
		t.Fatal(err)
	}
	mk("owned", 0o755, 4242)
	owned := mk("owned/state", 0o700, 0)
	rootLink := link("rootlink", filepath.Join(base, "good"), 0)
	otherLink := link("sticky/otherlink", good, 4242)
	badTarget := link("badtarget", filepath.Dir(worldW), 0)
	for _, c := range []struct {
		path    string
		refusal error
	}{
		{good, nil},
		{sticky, nil},
		{filepath.Join(rootLink, "state"), nil},
		{stickyOther, ErrNotRootOwned},
		{groupW, ErrOpenToOthers},
		{worldW, ErrOpenToOthers},
		{owned, ErrNotRootOwned},
		{otherLink, ErrNotRootOwned},
		{filepath.Join(badTarget, "state"), ErrOpenToOthers},
	} {
		err := checkRootChain(c.path, 0)
		if c.refusal == nil && err != nil {
			t.Errorf("%s: refused (%v), want accepted", c.path, err)
		}
		if c.refusal != nil && !errors.Is(err, c.refusal) {
			t.Errorf("%s: %v, want refused (%v)", c.path, err, c.refusal)
		}
	}
}
