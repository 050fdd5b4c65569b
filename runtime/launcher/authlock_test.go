package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// The auth.json lock (authlock.go) against the pinned runsc: oauth-file
// bundles whose auth.json is one host object, reached by one path or by
// two (a hard link), and bundles whose auth.json files differ.

// authStore is an auth.json of OAuth entries only, as oauth-file needs.
const authStore = `{"anthropic":{"type":"oauth","access":"at-redacted","refresh":"rt-redacted","expires":1}}` + "\n"

// authLockScript answers each line it reads, so a test can tell the
// sandbox runs, and records each start in the workspace.
const authLockScript = `echo start >> "$PASEO_AGENT_CWD/starts"
while read line; do echo "got $line"; done`

const oauthFacts = `{"credential":{"mode":"oauth-file","env":null,"secretRef":null,
"authFile":"/srv/paseo/state/pi-agents/agent-7f3c/auth.json","refreshURLs":["https://auth.example.test/oauth/token"]},
"state":{"agentDir":"/srv/paseo/state/pi-agents/agent-7f3c"}}`

// oauthSandbox compiles an oauth-file bundle (network none) in a fresh
// host whose auth.json is linkTo when given (a hard link: the same host
// object at another path), else a new file.
func oauthSandbox(t *testing.T, linkTo string) *sandbox {
	t.Helper()
	host := filepath.Join(t.TempDir(), "host")
	dir := filepath.Join(host, "srv/paseo/state/pi-agents/agent-7f3c")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	if linkTo != "" {
		err = os.Link(linkTo, filepath.Join(dir, "auth.json"))
	} else {
		err = os.WriteFile(filepath.Join(dir, "auth.json"), []byte(authStore), 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	sc := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(authLockScript), FactsPatch: strings.ReplaceAll(oauthFacts, `"/srv/`, `"`+host+`/srv/`)})
	return sceneSandbox(sc)
}

// run starts a launch (or wake) that ends when the test closes its stdin,
// or at the test's end if it fails first.
func (s *sandbox) run(t *testing.T, id string, wakeUp bool) *hibernateRun {
	t.Helper()
	r := s.startRun(t, id, nil, wakeUp)
	t.Cleanup(func() {
		r.in.Close()
		<-r.done
	})
	select {
	case <-r.done:
		t.Fatalf("launch %s ended before it started: %+v %v", id, r.res, r.err)
	default:
	}
	return r
}

// oauthID is a container id of this test process: a failed run's
// leftovers never collide with the next run's.
func oauthID(name string) string { return fmt.Sprintf("pp-oauth-%s-%d", name, os.Getpid()) }

func (s *sandbox) authFile() string {
	return filepath.Join(s.host, "srv/paseo/state/pi-agents/agent-7f3c/auth.json")
}

func (s *sandbox) starts(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/starts"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Count(string(data), "start\n")
}

// lockFile is the lock's path for the auth.json at p.
func lockFile(t *testing.T, state, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(state, "locks", fmt.Sprintf("authfile-%d-%d", st.Dev, st.Ino))
}

// wantAuthInUse checks that err refuses the launch because sandbox owner
// holds the auth.json as hold.
func wantAuthInUse(t *testing.T, err error, owner string, hold AuthFileHold) {
	t.Helper()
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("second launch: got %v, want sandbox-unavailable", err)
	}
	wantUnavailableIs(t, err, diag.LaunchAuthFileInUse)
	var ae *AuthFileInUseError
	if !errors.Is(err, ErrAuthFileInUse) || !errors.As(err, &ae) || ae.Owner != owner || ae.Hold != hold || !strings.Contains(ue.Reason, owner) {
		t.Errorf("%v: not ErrAuthFileInUse by %s (%s), or the reason does not name the owner", err, owner, hold)
	}
}

// A second launch of the same bundle, and a launch of another bundle whose
// auth.json is a hard link to the first's, are refused while the first
// runs, before their agent starts; the first keeps running. Once it has
// ended a new launch starts, and the lock file is gone.
func TestAuthFileLockRefusesSecondSandbox(t *testing.T) {
	s := oauthSandbox(t, "")
	linked := oauthSandbox(t, s.authFile())
	linked.state = s.state // one launcher state root
	first := s.run(t, oauthID("first"), false)
	if got := first.line(t, "one"); got != "got one" {
		t.Fatalf("first sandbox answered %q (launch: %v)", got, first.err)
	}
	for _, second := range []*sandbox{s, linked} {
		_, _, _, err := second.launch(t, nil)
		wantAuthInUse(t, err, oauthID("first"), AuthFileRunning)
	}
	lock := lockFile(t, s.state, s.authFile())
	if fi, err := os.Stat(lock); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("lock file %s: %v %v, want root's 0600 file", lock, fi, err)
	}
	if fi, err := os.Stat(filepath.Dir(lock)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("locks dir: %v %v, want 0700", fi, err)
	}
	if n := s.starts(t) + linked.starts(t); n != 1 {
		t.Errorf("%d agents started, want only the first", n)
	}
	if got := first.line(t, "two"); got != "got two" {
		t.Fatalf("after the refusals the first sandbox answered %q", got)
	}
	first.in.Close()
	first.ended(t)
	if first.err != nil || first.res.ExitCode != 0 {
		t.Fatalf("first sandbox ended with %+v %v", first.res, first.err)
	}
	if _, err := os.Stat(lock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock file outlived its sandbox: %v", err)
	}

	res, _, stderr, err := linked.launch(t, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a launch after the first ended: %+v %v\nstderr: %s", res, err, stderr)
	}
	if n := linked.starts(t); n != 1 {
		t.Errorf("the later launch did not start its agent (%d starts)", n)
	}
	s.assertClean(t)
}

// Agents with different auth.json files run at once.
func TestAuthFileLockDifferentFilesRunTogether(t *testing.T) {
	a, b := oauthSandbox(t, ""), oauthSandbox(t, "")
	b.state = a.state
	ra := a.run(t, oauthID("a"), false)
	rb := b.run(t, oauthID("b"), false)
	for _, r := range []*hibernateRun{ra, rb} {
		if got := r.line(t, "x"); got != "got x" {
			t.Fatalf("sandbox answered %q (launch: %v)", got, r.err)
		}
	}
	for _, r := range []*hibernateRun{ra, rb} {
		r.in.Close()
		r.ended(t)
		if r.err != nil {
			t.Errorf("launch: %v", r.err)
		}
	}
	a.assertClean(t)
}

// A hibernated sandbox still owns its auth.json: a fresh launch is
// refused, naming it, until it is woken (the wake takes the lock again,
// and then refuses a fresh launch as any running sandbox does) or
// deleted.
func TestAuthFileLockHibernated(t *testing.T) {
	s := oauthSandbox(t, "")
	id := oauthID("hib")
	r := s.run(t, id, false)
	if got := r.line(t, "one"); got != "got one" {
		t.Fatalf("sandbox answered %q (launch: %v)", got, r.err)
	}
	if _, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc}); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	r.ended(t)
	_, _, _, err := s.launch(t, nil)
	wantAuthInUse(t, err, id, AuthFileHibernated)
	// Only a wake takes the lock back, not a fresh start under its id.
	_, err = Launch(context.Background(), Options{BundleDir: s.bundle, ID: id, StateRoot: s.state, RunscPath: s.runsc, Stdin: strings.NewReader("")})
	wantAuthInUse(t, err, id, AuthFileHibernated)
	if n := s.starts(t); n != 1 {
		t.Errorf("%d agents started while the first was hibernated, want only the first", n)
	}

	r = s.run(t, id, true)
	if r.err != nil {
		t.Fatalf("wake: %v", r.err)
	}
	if got := r.line(t, "two"); got != "got two" {
		t.Fatalf("woken sandbox answered %q", got)
	}
	_, _, _, err = s.launch(t, nil)
	wantAuthInUse(t, err, id, AuthFileRunning)
	r.in.Close()
	r.ended(t)

	// Hibernated once more, then deleted: the auth.json is free again.
	r = s.run(t, id+"-2", false)
	if got := r.line(t, "three"); got != "got three" {
		t.Fatalf("sandbox answered %q (launch: %v)", got, r.err)
	}
	if _, err := Checkpoint(CheckpointOptions{ID: id + "-2", StateRoot: s.state, RunscPath: s.runsc}); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	r.ended(t)
	if err := RemoveHibernation(s.state, id+"-2"); err != nil {
		t.Fatal(err)
	}
	if res, _, stderr, err := s.launch(t, nil); err != nil {
		t.Fatalf("launch once the hibernated owner was deleted: %+v %v\nstderr: %s", res, err, stderr)
	}
	s.assertClean(t)
}

// A record left by a launcher that died without teardown keeps the
// auth.json its sandbox may still write: a fresh launch is refused until
// gc removes the record.
func TestAuthFileLockDeadLauncherRecord(t *testing.T) {
	s := oauthSandbox(t, "")
	lock := lockFile(t, s.state, s.authFile())
	if err := os.MkdirAll(filepath.Dir(lock), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lock, []byte(oauthID("orphan")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := statedir.WriteRecord(s.state, statedir.Record{ID: oauthID("orphan"), LauncherPID: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := s.launch(t, nil)
	wantAuthInUse(t, err, oauthID("orphan"), AuthFileRecorded)
	if _, err := (inventory.Inventory{StateRoot: s.state, RunscPath: s.runsc}).GC(); err != nil {
		t.Fatal(err)
	}
	if _, _, stderr, err := s.launch(t, nil); err != nil {
		t.Fatalf("launch after gc: %v\nstderr: %s", err, stderr)
	}
	if n := s.starts(t); n != 1 {
		t.Errorf("%d starts, want 1", n)
	}
}

// A locks dir someone else could write is refused, not used.
func TestAuthFileLockDirRootOnly(t *testing.T) {
	s := oauthSandbox(t, "")
	if err := os.MkdirAll(filepath.Join(s.state, "locks"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(s.state, "locks"), 0o777); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := s.launch(t, nil)
	wantUnavailableIs(t, err, diag.LaunchStateDir)
	s.assertNotStartedOAuth(t)
}

func (s *sandbox) assertNotStartedOAuth(t *testing.T) {
	t.Helper()
	if n := s.starts(t); n != 0 {
		t.Errorf("%d agents started, want none", n)
	}
	s.assertClean(t)
}
