package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/mounts"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// lineWaiter is a stdout that reports when a line containing want appears.
type lineWaiter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func newLineWaiter(want string) *lineWaiter {
	return &lineWaiter{want: want, seen: make(chan struct{})}
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	// A whole line, not a substring: a library's warning ("not supported
	// yet") once passed for the sandbox's "up".
	lines := strings.Split(w.buf.String(), "\n")
	if slices.Contains(lines[:len(lines)-1], w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *lineWaiter) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-w.seen:
	case <-time.After(d):
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("no %q within %s; output so far: %q", w.want, d, w.buf.String())
	}
}

func (s *sandbox) inventory() inventory.Inventory {
	return inventory.Inventory{StateRoot: s.state, RunscPath: s.runsc}
}

// ps shows a running sandbox with a live launcher; kill ends it and the
// launcher tears down as after any other exit.
func TestPSAndKill(t *testing.T) {
	s := compileScript(t, "echo up; /bin/busybox sleep 60; echo never", "")
	out := newLineWaiter("up")
	type result struct {
		res Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
			ID: "ps-kill", Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: out})
		done <- result{res, err}
	}()
	out.wait(t, 30*time.Second)

	entries, err := s.inventory().PS()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].ID != "ps-kill" || entries[0].Status != "running" || entries[0].Launcher != "alive" || entries[0].Garbage {
		t.Fatalf("ps: %+v", entries)
	}
	if entries[0].Profile != "pi-session" || entries[0].Agent != "agent-7f3c" {
		t.Errorf("ps lacks the manifest's profile and agent: %+v", entries[0])
	}
	if err := s.inventory().Kill("nope", unix.SIGKILL); !errors.Is(err, inventory.ErrNoSandbox) {
		t.Errorf("kill of an unknown id: %v, want refused (%v)", err, inventory.ErrNoSandbox)
	}
	if err := s.inventory().Kill("ps-kill", unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.res.ExitCode == 0 {
			t.Errorf("killed launch: %+v %v", r.res, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("launch did not end after kill")
	}
	if entries, _ := s.inventory().PS(); len(entries) != 0 {
		t.Errorf("ps after kill: %+v", entries)
	}
	s.assertClean(t)
}

// A signal sent the moment runsc is started, before runsc knows the
// container (a client cancelling right after createSandbox), reaches the
// agent: kill waits for the container instead of failing inside runsc.
func TestKillWhileStarting(t *testing.T) {
	s := compileScript(t, "echo up; /bin/busybox sleep 60; echo never", "")
	killed := make(chan error, 1)
	res, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		ID: "kill-starting", Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: io.Discard,
		OnStart: func() {
			if known, _ := (&runsc.Runner{Root: statedir.RunscRoot(s.state)}).Knows("kill-starting"); known {
				t.Error("runsc knew the container when OnStart ran: the test no longer signals before it does")
			}
			go func() { killed <- s.inventory().Kill("kill-starting", unix.SIGKILL) }()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-killed; err != nil {
		t.Fatalf("kill right after the start: %v", err)
	}
	if res.ExitCode == 0 {
		t.Errorf("the agent was not killed: %+v", res)
	}
	s.assertClean(t)
}

type helperLaunch struct{ Bundle, State, Runsc, ID, Uplink string }

// The helper process is a launcher that the test kills with SIGKILL, as a
// crash would, leaving its sandbox behind for gc.
func TestHelperLauncherProcess(t *testing.T) {
	cfg := os.Getenv("PASEO_TEST_LAUNCHER")
	if cfg == "" {
		return // only meaningful as the child of TestGCAfterLauncherCrash
	}
	var h helperLaunch
	if err := json.Unmarshal([]byte(cfg), &h); err != nil {
		t.Fatal(err)
	}
	// The script only sleeps: the pinned address is never contacted.
	resolve := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("10.77.9.2")}, nil
	}
	_, err := Launch(context.Background(), Options{BundleDir: h.Bundle, StateRoot: h.State, RunscPath: h.Runsc, ID: h.ID,
		Uplink: h.Uplink, Resolve: resolve, Secrets: staticSecret("v"), Stdout: os.Stdout, Stdin: strings.NewReader("")})
	t.Fatalf("the helper launcher returned (%v); it should have been killed", err)
}

// A crashed launcher leaves a running container, its netns, veth, table,
// lease, cgroup, run dir and record; ps calls it garbage and gc removes
// every piece.
func TestGCAfterLauncherCrash(t *testing.T) {
	world := testnet.New(t)
	s := compileScript(t, "echo up; /bin/busybox sleep 60", `{"network":{"mode":"sandbox"}}`)
	cfg, _ := json.Marshal(helperLaunch{Bundle: s.bundle, State: s.state, Runsc: s.runsc, ID: "crashed", Uplink: world.Uplink})
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLauncherProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "PASEO_TEST_LAUNCHER="+string(cfg))
	out := newLineWaiter("up")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out.wait(t, 30*time.Second)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()

	inv := s.inventory()
	entries, err := inv.PS()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Launcher != "dead" || !entries[0].Garbage || entries[0].Status != "running" {
		t.Fatalf("ps after a launcher crash: %+v", entries)
	}
	// Its launcher gone, the sandbox is an orphan: kill refuses to signal
	// it (gc's business), and runsc still runs it (TestPSAndKill is the
	// control: a live launch's sandbox is signalled).
	if err := inv.Kill("crashed", unix.SIGKILL); !errors.Is(err, inventory.ErrLaunchEnded) {
		t.Fatalf("kill of an orphaned sandbox: %v, want refused (%v)", err, inventory.ErrLaunchEnded)
	}
	if entries, err := inv.PS(); err != nil || len(entries) != 1 || entries[0].Status != "running" {
		t.Fatalf("ps after the refused kill: %+v %v", entries, err)
	}
	peer, _, table := sandboxnet.Names("crashed")
	if _, err := os.Stat(sandboxnet.NetnsPath(filepath.Join(s.state, "net"), "crashed")); err != nil {
		t.Fatalf("the crash left no netns to collect (%v); the test proves nothing", err)
	}
	// The crash also left the staged bind sources mounted in the run dir;
	// gc must unmount them before it removes the dir, or it would delete
	// the workspace through its mount.
	if staged := mounts.Beneath(filepath.Join(s.state, "run", "crashed", "binds")); len(staged) == 0 {
		t.Fatal("the crash left no staged bind to collect; the test proves nothing about them")
	}
	keep := filepath.Join(s.host, "srv/paseo/workspace/proj-feature/keep")
	if err := os.WriteFile(keep, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := inv.GC()
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(keep); err != nil || string(data) != "kept" {
		t.Errorf("gc removed workspace contents through a staged bind: %q %v", data, err)
	}
	if len(rep.Errors) > 0 || len(rep.Removed) != 1 || rep.Removed[0] != "crashed" {
		t.Errorf("gc report: %+v", rep)
	}
	s.assertClean(t)
	if entries, _ := os.ReadDir(filepath.Join(s.state, "records")); len(entries) > 0 {
		t.Errorf("records left: %v", entries)
	}
	assertNoUplinkObjects(t, world.Uplink, peer, table)
	for _, m := range mounts.Cgroups() {
		if _, err := os.Stat(filepath.Join(m, statedir.CgroupParent, "crashed")); err == nil {
			t.Errorf("cgroup left in %s", m)
		}
	}
}

// A half-created container (runsc create without start, no launcher) is
// garbage; a launch may not reuse its id, and gc removes it.
func TestGCHalfCreatedAndDuplicateID(t *testing.T) {
	s := compileScript(t, "echo hi", "")
	root := filepath.Join(s.state, "runsc")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	// The container keeps the stdio runsc create was given; a file, not a
	// pipe, so nothing waits for it to close.
	logf, err := os.Create(filepath.Join(t.TempDir(), "create.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	create := exec.Command(s.runsc, "--root", root, "--network=none", "--directfs=false", "create", "--bundle", s.bundle, "half")
	create.Stdout, create.Stderr = logf, logf
	if err := create.Run(); err != nil {
		log, _ := os.ReadFile(logf.Name())
		t.Fatalf("runsc create: %v: %s", err, log)
	}
	t.Cleanup(func() { _ = exec.Command(s.runsc, "--root", root, "delete", "--force", "half").Run() })
	_, err = Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
		ID: "half", Secrets: staticSecret("v"), Stdout: io.Discard})
	wantUnavailableIs(t, err, diag.LaunchID)
	entries, err := s.inventory().PS()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].ID != "half" || entries[0].Status != "created" || entries[0].Launcher != "none" || !entries[0].Garbage {
		t.Fatalf("ps: %+v", entries)
	}
	rep, err := s.inventory().GC()
	if err != nil || len(rep.Errors) > 0 {
		t.Fatalf("gc: %+v %v", rep, err)
	}
	s.assertClean(t)
}

func assertNoUplinkObjects(t *testing.T, uplink, peer, table string) {
	t.Helper()
	for _, left := range testnet.Leftovers(t, uplink, peer, table) {
		t.Errorf("%s left in the uplink", left)
	}
}
