package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Racing a bind source from outside the sandbox (issue 10, item 1)
//
// runsc resolves config.json's mount sources by path, as root, following
// symlinks; whoever can rename in a source's parent can swap it for a
// symlink to a host directory between any check and runsc's use. Two
// attackers try, each against the product (launcher.Launch, which stages
// every source by descriptor) and against a control that runs the same
// bundle the old, path-based way: a run dir like the launcher's (private
// overlay root, same flags) whose config.json keeps the host sources,
// handed to bin/runsc directly. A win is the sandbox printing the marker of
// a directory outside every root; a refusal is a launch refused because the
// pinned source moved.
//   - the daemon user (uid 1000, owner of its workspace root), exchanging
//     the workspace with a symlink by renameat2(RENAME_EXCHANGE): in a free
//     loop over many launches, and timed to the private overlay root a
//     launch mounts after its checks (visible in its own /proc/self/mountinfo);
//   - a neighbouring sandbox's agent whose read-write workspace holds this
//     sandbox's cwd, flipping that directory with a symlink by rename only,
//     through its gofer, while this sandbox launches again and again.

func init() { registerOutside("binds", bindAttacks) }

const (
	bindFreeLaunches      = 30
	bindTimedLaunches     = 12
	bindNeighbourLaunches = 30
)

// bindScene is one compiled bundle whose agent prints the marker in its cwd.
type bindScene struct {
	sb      *testbundle.Scene
	cwd     string // the sandbox's cwd (host path = sandbox path)
	outside string // a host directory outside every root
	marker  string // in outside/marker only
}

func bindAttacks(t *testing.T, _ *scene) []OutsideAttack {
	racer := buildRacer(t)
	return []OutsideAttack{daemonRace(t, racer, "free"), daemonRace(t, racer, "timed"), neighbourFlip(t)}
}

const catMarker = "cat $PASEO_AGENT_CWD/marker"

func newBindScene(t *testing.T, o testbundle.Options, cwd func(host string) string) *bindScene {
	b := &bindScene{marker: randomHex(16)}
	b.sb = testbundle.New(t, o)
	b.cwd = cwd(b.sb.Host)
	b.outside = filepath.Join(b.sb.Host, "home/alice/outside-binds")
	mustWrite(t, filepath.Join(b.outside, "marker"), "outside "+b.marker+"\n")
	// A cwd's .git pointer file is a bind of its own (issue 19); a swapped
	// cwd needs one too, or the control's runsc stops at the missing
	// source and the swap could never show. A cwd without one gets a
	// tmpfs there, whose mount point runsc makes itself.
	if fi, err := os.Lstat(filepath.Join(b.cwd, ".git")); err == nil && fi.Mode().IsRegular() {
		mustWrite(t, filepath.Join(b.outside, ".git"), "gitdir: "+b.outside+"/gitdir\n")
	}
	mustWrite(t, filepath.Join(b.cwd, "marker"), "inside\n")
	return b
}

func mustWrite(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// won reports whether the agent's output shows the outside directory.
func (b *bindScene) won(out string) bool { return strings.Contains(out, b.marker) }

// product launches the bundle with the real launcher; refused means the
// launcher refused it (sandbox-unavailable).
func (b *bindScene) product(t *testing.T) (out string, refused bool) {
	var stdout, stderr bytes.Buffer
	_, err := launcher.Launch(context.Background(), launcher.Options{
		BundleDir: b.sb.Bundle, StateRoot: b.sb.State, RunscPath: b.sb.Runsc,
		Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
		Stdin:   strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
	})
	var ue *launcher.UnavailableError
	if errors.As(err, &ue) {
		return "", true
	}
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	return stdout.String(), false
}

// pathBased is the control: the old flow, a run dir like the launcher's
// whose config.json keeps the host sources, run by bin/runsc directly.
func (b *bindScene) pathBased(t *testing.T) string {
	id := "ctl-" + randomHex(6)
	base := filepath.Join(b.sb.State, "control", id)
	files, err := bundle.Read(b.sb.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	// Every file the spec binds from the bundle (hosts, resolv.conf, the
	// Git store's generated HEAD, ...), as the launcher's run dir has them.
	for n, data := range files {
		if n != bundle.ConfigFile {
			mustWrite(t, filepath.Join(base, n), string(data))
		}
	}
	var spec rspec.Spec
	if err := json.Unmarshal(files[bundle.ConfigFile], &spec); err != nil {
		t.Fatal(err)
	}
	spec.Linux.CgroupsPath = "/paseo-sandbox/" + id
	upper, work, merged := filepath.Join(base, "root/upper"), filepath.Join(base, "root/work"), filepath.Join(base, "root/merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, "lowerdir="+spec.Root.Path+",upperdir="+upper+",workdir="+work); err != nil {
		t.Fatal(err)
	}
	spec.Root.Path = merged
	data, _ := bundle.Marshal(&spec)
	mustWrite(t, filepath.Join(base, bundle.ConfigFile), string(data))
	root := filepath.Join(b.sb.State, "runsc-control")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.sb.Runsc, "--root", root, "--network=none", "--directfs=false", "run", "--bundle", base, id)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stdout bytes.Buffer
	cmd.Stdin, cmd.Stdout = strings.NewReader(""), &stdout
	_ = cmd.Run() // a source caught mid-rename fails the run: no win
	_ = exec.Command(b.sb.Runsc, "--root", root, "delete", "--force", id).Run()
	for _, m := range mountsUnder(root) {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	_ = unix.Unmount(merged, unix.MNT_DETACH)
	if left := mountsUnder(base); len(left) > 0 {
		t.Fatalf("control run dir still mounted: %v", left)
	}
	_ = os.RemoveAll(base)
	return stdout.String()
}

func mountsUnder(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// buildRacer builds the daemon user's program where uid 1000 can run it.
func buildRacer(t *testing.T) string {
	dir, err := os.MkdirTemp("", "paseo-bindracer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bindracer")
	build := exec.Command("go", "build", "-o", bin, "./test/acceptance/testdata/bindracer")
	build.Dir = testbundle.Repo(t, "")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building bindracer: %v\n%s", err, out)
	}
	return bin
}

// racer is the running daemon-user process.
type racer struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	close func()
}

func startRacer(t *testing.T, bin string, b *bindScene, mode string) *racer {
	root := filepath.Dir(b.cwd)
	// The daemon user owns its workspace root, so it may rename in it.
	if err := os.Chown(root, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-mode", mode, "-a", filepath.Base(b.cwd), "-b", filepath.Base(b.cwd)+".evil", "-target", b.outside,
		"-watch", b.sb.State, "-suffix", "/root/merged")
	cmd.ExtraFiles = []*os.File{dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	dir.Close()
	r := &racer{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	r.close = func() {
		in.Close()
		for r.out.Scan() {
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("bindracer: %v: %s", err, stderr.String())
		}
		if fi, err := os.Lstat(b.cwd); err != nil || !fi.IsDir() {
			t.Fatalf("the racer left the workspace swapped (%v)", err)
		}
	}
	return r
}

func (r *racer) send(t *testing.T, line string) {
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// read returns the racer's next line ("ended" if it is gone).
func (r *racer) read() string {
	if !r.out.Scan() {
		return "ended"
	}
	return r.out.Text()
}

// daemonRace: the daemon user exchanges its workspace with a symlink.
func daemonRace(t *testing.T, bin, mode string) OutsideAttack {
	a := OutsideAttack{Name: "daemon-user-races-bind-source-" + mode, Attacker: "daemon-user",
		Goal:    "as uid 1000, owner of the workspace root, exchange the workspace with a symlink to a host directory outside every root (renameat2 RENAME_EXCHANGE) so runsc mounts that directory read-write",
		Control: "the same bundle run the old way: runsc given the host source path in config.json"}
	b := newBindScene(t, testbundle.Options{Argv: testbundle.Script(catMarker)}, func(h string) string {
		return filepath.Join(h, "srv/paseo/workspace/proj-feature")
	})
	n := bindFreeLaunches
	if mode == "timed" {
		n = bindTimedLaunches
		a.Evidence = "timed: one exchange the moment the launch's private overlay root (<run>/root/merged, mounted after the sources are checked) shows in the attacker's own mountinfo"
	} else {
		a.Evidence = "free: exchanging in a loop for the whole run"
	}
	for side, tally := range map[string]*Tally{"contained": &a.Contained, "control": &a.ControlRun} {
		r := startRacer(t, bin, b, mode)
		for i := 0; i < n; i++ {
			if mode == "timed" {
				r.send(t, "arm")
				// The racer takes its baseline before the launch mounts; a
				// fixed sleep was not always enough on a loaded machine.
				if got := r.read(); got != "armed" {
					t.Fatalf("%s %s: the racer said %q, not armed", a.Name, side, got)
				}
				fired := make(chan string, 1)
				go func() { fired <- r.read() }()
				b.attempt(t, side, tally)
				if got := <-fired; got != "fired" {
					t.Fatalf("%s %s: the racer said %q, not fired", a.Name, side, got)
				}
				r.send(t, "restore")
				if got := r.read(); got != "restored" {
					t.Fatalf("%s %s: the racer said %q, not restored", a.Name, side, got)
				}
				continue
			}
			b.attempt(t, side, tally)
		}
		r.close()
	}
	return a
}

// attempt runs one launch on one side and counts it.
func (b *bindScene) attempt(t *testing.T, side string, tally *Tally) {
	tally.Attempts++
	if side == "control" {
		if b.won(b.pathBased(t)) {
			tally.Wins++
		}
		return
	}
	out, refused := b.product(t)
	switch {
	case refused:
		tally.Refusals++
	case b.won(out):
		tally.Wins++
	}
}

// neighbourFlip: sandbox A's agent, whose workspace holds sandbox B's cwd,
// flips B's cwd with a symlink by rename only while B launches.
func neighbourFlip(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "neighbour-flips-cwd", Attacker: "neighbour-sandbox",
		Goal:     "from inside sandbox A, whose read-write workspace contains sandbox B's cwd, rename a symlink to a host directory into B's cwd's place (through A's gofer) while B launches, so B's runsc mounts that directory",
		Control:  "B's bundle run the old way: runsc given the host source path in config.json",
		Evidence: "A loops mv cwd cwd.real; mv evil cwd; mv cwd evil; mv cwd.real cwd inside its sandbox"}
	// A is the reference scene; B's cwd is A's workspace/nested.
	flip := `cd $PASEO_AGENT_CWD && ln -s "$OUTSIDE" evil && echo flipping && ` +
		`while true; do mv nested nested.real; mv evil nested; mv nested evil; mv nested.real nested; done`
	host := filepath.Join(t.TempDir(), "host")
	outside := filepath.Join(host, "home/alice/outside-binds")
	A := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(strings.ReplaceAll(flip, "$OUTSIDE", outside))})
	wsA := filepath.Join(host, "srv/paseo/workspace/proj-feature")
	nested := filepath.Join(wsA, "nested")
	if err := os.Mkdir(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(nested, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	b := newBindScene(t, testbundle.Options{Host: host, Argv: testbundle.Script(catMarker),
		FactsPatch: `{"workspace":{"cwd":"` + nested + `"}}`}, func(string) string { return nested })
	if b.outside != outside {
		t.Fatalf("outside dir %s, A's agent links to %s", b.outside, outside)
	}

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var aOut lineSignal
	aOut.want, aOut.seen = "flipping", started
	done := make(chan error, 1)
	go func() {
		_, err := launcher.Launch(ctx, launcher.Options{BundleDir: A.Bundle, StateRoot: A.State, RunscPath: A.Runsc,
			Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
			Stdin:   strings.NewReader(""), Stdout: &aOut, Grace: 200 * time.Millisecond})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		cancel()
		t.Fatalf("sandbox A ended before flipping: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("sandbox A never started flipping")
	}
	for i := 0; i < bindNeighbourLaunches; i++ {
		b.attempt(t, "contained", &a.Contained)
	}
	for i := 0; i < bindNeighbourLaunches; i++ {
		b.attempt(t, "control", &a.ControlRun)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sandbox A: %v", err)
	}
	// Put B's cwd back however A left it.
	if fi, err := os.Lstat(nested); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		_ = os.Remove(nested)
	}
	if _, err := os.Stat(nested + ".real"); err == nil {
		_ = os.Rename(nested+".real", nested)
	}
	return a
}

// lineSignal is a stdout that closes seen once a line equal to want arrives.
type lineSignal struct {
	want string
	seen chan struct{}
	buf  []byte
	done bool
}

func (l *lineSignal) Write(p []byte) (int, error) {
	if !l.done {
		l.buf = append(l.buf, p...)
		if bytes.Contains(l.buf, []byte(l.want+"\n")) {
			l.done = true
			close(l.seen)
		}
	}
	return len(p), nil
}
