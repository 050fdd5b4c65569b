package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
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
		path, refusal string
	}{
		{good, ""},
		{sticky, ""},
		{filepath.Join(rootLink, "state"), ""},
		{stickyOther, "not root's"},
		{groupW, "writable by group or others"},
		{worldW, "writable by group or others"},
		{owned, "not root's"},
		{otherLink, "not root's"},
		{filepath.Join(badTarget, "state"), "writable by group or others"},
	} {
		err := checkRootChain(c.path, 0)
		if c.refusal == "" && err != nil {
			t.Errorf("%s: refused (%v), want accepted", c.path, err)
		}
		if c.refusal != "" && (err == nil || !strings.Contains(err.Error(), c.refusal)) {
			t.Errorf("%s: %v, want refused (%s)", c.path, err, c.refusal)
		}
	}
}

// With a directory above the state root writable by others, a checkpoint
// is refused before runsc writes an image (the sandbox runs on), and a
// wake of an image taken before the chain was opened is refused
// (sandbox-unavailable); with the chain restored the wake succeeds.
func TestCheckpointRefusesAnOpenChain(t *testing.T) {
	s := compileScript(t, "while read line; do echo \"got $line\"; done", "")
	id := "pp-hibpath-" + fmt.Sprint(os.Getpid())
	key := staticSecret("v")
	above := filepath.Dir(s.state)
	r := s.startRun(t, id, key, false)
	if got := r.line(t, "one"); got != "got one" {
		t.Fatalf("first run: %q", got)
	}
	if err := os.Chmod(above, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc}); !errors.Is(err, diag.LaunchHibernatePath) {
		t.Fatalf("checkpoint under a world-writable %s: %v, want refused", above, err)
	}
	if _, err := os.Lstat(HibernateDir(s.state, id)); !os.IsNotExist(err) {
		t.Errorf("a refused checkpoint left its dir (%v)", err)
	}
	if got := r.line(t, "two"); got != "got two" {
		t.Fatalf("after the refused checkpoint the sandbox answered %q", got)
	}
	if err := os.Chmod(above, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc}); err != nil {
		t.Fatal(err)
	}
	r.ended(t)

	if err := os.Chmod(above, 0o777); err != nil {
		t.Fatal(err)
	}
	r = s.startRun(t, id, key, true)
	r.ended(t)
	var ue *UnavailableError
	if !errors.As(r.err, &ue) || !errors.Is(r.err, diag.LaunchHibernatePath) || !hasCode(ue.Diagnostics(), diag.LaunchHibernatePath) {
		t.Fatalf("wake under a world-writable %s: %v, want sandbox-unavailable", above, r.err)
	}
	if err := os.Chmod(above, 0o700); err != nil {
		t.Fatal(err)
	}
	r = s.startRun(t, id, key, true)
	if r.err != nil {
		t.Fatalf("wake with the chain restored: %v", r.err)
	}
	if got := r.line(t, "three"); got != "got three" {
		t.Fatalf("woken: %q", got)
	}
	r.in.Close()
	r.ended(t)
	s.assertClean(t)
}
