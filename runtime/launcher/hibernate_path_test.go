package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

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
	if _, err := os.Lstat(statedir.HibernateDir(s.state, id)); !os.IsNotExist(err) {
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
