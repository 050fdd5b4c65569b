package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/mounts"
)

// How the pinned runsc treats binds nested in binds, which the protection
// of Git control data (issue 19, policy/compiler/gitprotect.go) builds on,
// so that an upgrade that changes it fails here. The test adds D
// (read-write) with D/a/b and D/h read-only and D/w read-write inside it
// and three read-only binds whose destinations D lacks, and R (read-only)
// with R/x read-write inside.
//
// The script prints one "label=outcome" line per operation: "ok" or the
// error busybox reports.
const gitMountScript = `b=/bin/busybox
H=${PASEO_AGENT_CWD%/srv/paseo/workspace/proj-feature}
D=$H/gitlab/D
R=$H/gitlab/R
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
$b echo planted > $D/a/b.new
try q5-rename-over-ro-file $b mv -f $D/a/b.new $D/a/b
try q6-hardlink-ro-file $b ln $D/a/b $D/a/b.hard
try q1-rename-ro-file $b mv $D/a/b $D/a/b.moved
try q1-unlink-ro-file $b rm -f $D/a/b
try q1-rename-ro-dir $b mv $D/h $D/h.moved
try q1-rmdir-ro-dir $b rmdir $D/h
try q1-rename-rw-dir $b mv $D/w $D/w.moved
try q1-rename-mount-root $b mv $D $D.moved
try q2-rename-parent $b mv $D/a $D/a2
try q2-old-path $b ls $D/a
try q2-moved-still-ro $b sh -c "echo x > $D/a2/b"
try q2-remake $b sh -c "$b mkdir $D/a && $b echo planted > $D/a/b"
try q3-create-in-ro $b sh -c "$b echo x > $R/new"
try q3-lock-rename-in-rw $b sh -c "$b echo v > $R/x/f.lock && $b mv $R/x/f.lock $R/x/f"
try q4-dir-seen $b ls -d $D/missing-dir
try q4-file-seen $b cat $D/missing-file
try q4-deep-seen $b ls -d $D/m1/m2/missing-deep
`

func TestRunscGitMountSemantics(t *testing.T) {
	s := compileScript(t, gitMountScript, "")
	D, R, src := filepath.Join(s.host, "gitlab/D"), filepath.Join(s.host, "gitlab/R"), filepath.Join(s.host, "gitlab/src")
	for _, dir := range []string{filepath.Join(D, "a"), filepath.Join(D, "h"), filepath.Join(D, "w"), filepath.Join(R, "x"), filepath.Join(src, "dir")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFileT(t, filepath.Join(D, "a/b"), "orig\n")
	writeFileT(t, filepath.Join(src, "file"), "src-file\n")
	// Owned by the sandbox user: only the mounts stand in the way.
	chownTree(t, filepath.Join(s.host, "gitlab"))

	extra := newExtraBinds(t, s)
	out := bareRunsc(t, s, func(spec *rspec.Spec) {
		extra.add(t, spec, D, D, false)
		extra.add(t, spec, filepath.Join(D, "a/b"), filepath.Join(D, "a/b"), true)
		extra.add(t, spec, filepath.Join(D, "h"), filepath.Join(D, "h"), true)
		extra.add(t, spec, filepath.Join(D, "w"), filepath.Join(D, "w"), false)
		extra.add(t, spec, filepath.Join(src, "dir"), filepath.Join(D, "missing-dir"), true)
		extra.add(t, spec, filepath.Join(src, "file"), filepath.Join(D, "missing-file"), true)
		extra.add(t, spec, filepath.Join(src, "dir"), filepath.Join(D, "m1/m2/missing-deep"), true)
		extra.add(t, spec, R, R, true)
		extra.add(t, spec, filepath.Join(R, "x"), filepath.Join(R, "x"), false)
	}, func() {})
	got := outcomes(out)
	const (
		ok    = "ok"
		busy  = "Device or resource busy"
		rofs  = "Read-only file system"
		noent = "No such file or directory"
		xdev  = "Invalid cross-device link"
	)
	for label, want := range map[string]string{
		// (5) a read-only file bind cannot be replaced by rename.
		"q5-rename-over-ro-file": busy,
		// Nor linked to from the read-write bind around it.
		"q6-hardlink-ro-file": xdev,
		// (1) a mount point, file or dir, read-only or read-write, can be
		// neither renamed nor removed; D itself sits in a directory runsc
		// made in the rootfs, root's.
		"q1-rename-ro-file": busy, "q1-unlink-ro-file": busy, "q1-rename-ro-dir": busy, "q1-rmdir-ro-dir": busy,
		"q1-rename-rw-dir": busy, "q1-rename-mount-root": "Permission denied",
		// (2) the parent of a nested mount point can be renamed: the mount
		// moves with it, and the old name is free to remake unprotected
		// (why gitprotect.go binds every directory above a pinned
		// submodule to itself).
		"q2-rename-parent": ok, "q2-old-path": noent, "q2-moved-still-ro": rofs, "q2-remake": ok,
		// (3) nothing is created in a read-only bind; lock file and rename
		// work in a read-write bind nested in it (objects/ and refs/ in
		// the read-only repository).
		"q3-create-in-ro": rofs, "q3-lock-rename-in-rw": ok,
		// (4) binds whose destinations D lacks are mounted.
		"q4-dir-seen": ok, "q4-file-seen": ok, "q4-deep-seen": ok,
	} {
		if g, found := got[label]; !found || !strings.Contains(g, want) {
			t.Errorf("%s: got %q, want %q", label, g, want)
		}
	}
	t.Logf("sandbox:\n%s", out)

	// (2) the renames reached the host: the protected file under its new
	// name, the agent's file under the old one.
	wantFile(t, filepath.Join(D, "a2/b"), "orig\n")
	wantFile(t, filepath.Join(D, "a/b"), "planted\n")
	// (3) the lock-file rename landed on the host.
	wantFile(t, filepath.Join(R, "x/f"), "v\n")
	// (4) runsc made the missing mount points on the host, in the
	// read-write bind's source, intermediate dirs too.
	for _, p := range []string{"missing-dir", "missing-file", "m1/m2/missing-deep"} {
		fi, err := os.Lstat(filepath.Join(D, p))
		if err != nil {
			t.Errorf("mount point %s not on the host: %v", p, err)
			continue
		}
		// Made by runsc as root, whatever the sandbox user: it is no
		// protection, the agent owns the parent and may remove it later.
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
			t.Errorf("host %s: uid %d, want 0 (runsc's)", p, st.Uid)
		}
		t.Logf("host %s: %v", p, fi.Mode())
	}
	extra.remove(t)
	s.assertClean(t)
}

// The compiled layout of the reference linked worktree, in the pinned
// runsc: every write to the repository fails, its objects, refs and
// reflogs included (issue 30); the private Git dir takes writes that never
// reach the host; the agent's Git store takes objects, refs and reflogs,
// which reach the host there and nowhere else, but not its config or HEAD.
const gitLayoutScript = `b=/bin/busybox
H=${PASEO_AGENT_CWD%/srv/paseo/workspace/proj-feature}
C=$H/srv/paseo/repos/proj/.git
S=/run/paseo/git-store
G=$C/worktrees/proj-feature
W=$PASEO_AGENT_CWD
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
try config-append $b sh -c "echo '[core]fsmonitor=x' >> $C/config"
try config-create $b sh -c "echo x > $C/config.new"
try hooks-create $b sh -c "echo x > $C/hooks/post-index-change"
try commondir-create $b sh -c "echo /fake > $C/commondir"
try config-worktree-create $b sh -c "echo x > $C/config.worktree"
try sibling-create $b mkdir $C/worktrees/other
try worktrees-rename $b mv $C/worktrees $C/worktrees.moved
try modules-create $b mkdir $C/modules
try info-create $b sh -c "$b mkdir -p $C/info && echo x > $C/info/attributes"
try alternates-create $b sh -c "echo /x > $C/objects/info/alternates"
try objects-rename $b mv $C/objects $C/objects.moved
try refs-rename $b mv $C/refs $C/refs.moved
try object-write $b sh -c "$b mkdir -p $C/objects/ab && echo obj > $C/objects/ab/cd"
try ref-write $b sh -c "echo 0123 > $C/refs/heads/agent"
try log-write $b sh -c "echo entry >> $C/logs/refs/heads/agent"
try log-symlink $b ln -s /etc/passwd $C/logs/HEAD
try store-object-write $b sh -c "$b mkdir -p $S/objects/ab && echo obj > $S/objects/ab/cd"
try store-ref-write $b sh -c "$b mkdir -p $S/refs/heads && echo 0123 > $S/refs/heads/agent"
try store-log-write $b sh -c "$b mkdir -p $S/logs/refs/heads && echo entry >> $S/logs/refs/heads/agent"
try store-config-write $b sh -c "echo '[core]fsmonitor=x' >> $S/config"
try store-head-write $b sh -c "echo 'ref: refs/heads/agent' > $S/HEAD"
try store-config-rename $b mv $S/config $S/config.old
try private-commondir $b sh -c "echo /fake > $G/commondir"
try private-index $b sh -c "echo index > $G/index"
try private-rename $b mv $G $C/worktrees/moved
try seed-read $b cat /run/paseo/git-seed/HEAD
try seed-write $b sh -c "echo x > /run/paseo/git-seed/HEAD"
try dotgit-rewrite $b sh -c "echo 'gitdir: /fake' > $W/.git"
try dotgit-rename $b mv $W/.git $W/.git.old
try dotgit-unlink $b rm -f $W/.git
`

func TestGitLayoutInRunsc(t *testing.T) {
	s := compileScript(t, gitLayoutScript, "")
	C := filepath.Join(s.host, "srv/paseo/repos/proj/.git")
	G := filepath.Join(C, "worktrees/proj-feature")
	W := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	S := filepath.Join(s.host, "srv/paseo/state/pi-git/agent-7f3c")
	// Owned by the sandbox user, as the daemon's are: only the mounts
	// stand in the way, not permissions.
	chownTree(t, filepath.Join(s.host, "srv/paseo/repos"))
	chownTree(t, W)
	chownTree(t, S)
	before := map[string]string{}
	for _, p := range []string{filepath.Join(C, "config"), filepath.Join(G, "HEAD"), filepath.Join(G, "commondir"), filepath.Join(W, ".git")} {
		before[p] = readFileT(t, p)
	}
	res, out, stderr, err := s.launch(t, staticSecret("sk"))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v %+v\n%s\n%s", err, res, out, stderr)
	}
	got := outcomes(out)
	const (
		ok   = "ok"
		rofs = "Read-only file system"
		busy = "Device or resource busy"
	)
	for label, want := range map[string]string{
		"config-append": rofs, "config-create": rofs, "hooks-create": rofs, "commondir-create": rofs,
		"config-worktree-create": rofs, "sibling-create": rofs, "worktrees-rename": "", "modules-create": rofs,
		"info-create": rofs, "alternates-create": rofs, "objects-rename": "", "refs-rename": "",
		"object-write": rofs, "ref-write": rofs, "log-write": rofs, "log-symlink": rofs,
		"store-object-write": ok, "store-ref-write": ok, "store-log-write": ok,
		"store-config-write": rofs, "store-head-write": "", "store-config-rename": busy,
		"private-commondir": ok, "private-index": ok, "private-rename": "",
		"seed-read": ok, "seed-write": rofs,
		"dotgit-rewrite": rofs, "dotgit-rename": busy, "dotgit-unlink": busy,
	} {
		g, found := got[label]
		switch {
		case !found:
			t.Errorf("%s: no outcome", label)
		case want == "" && g == ok: // a rename the mount or the read-only parent refuses, either way
			t.Errorf("%s: succeeded", label)
		case want != "" && !strings.Contains(g, want):
			t.Errorf("%s: got %q, want %q", label, g, want)
		}
	}
	t.Logf("sandbox:\n%s", out)
	for p, want := range before {
		wantFile(t, p, want)
	}
	for _, p := range []string{filepath.Join(G, "index"), filepath.Join(C, "commondir"), filepath.Join(C, "config.new"), filepath.Join(C, "worktrees/other"), filepath.Join(C, "objects/info/alternates")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists on the host (%v)", p, err)
		}
	}
	for _, p := range []string{filepath.Join(C, "objects/ab"), filepath.Join(C, "refs/heads/agent"), filepath.Join(C, "logs/refs/heads/agent"), filepath.Join(C, "logs/HEAD")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists on the host (%v): the repository must be read-only in the sandbox", p, err)
		}
	}
	wantFile(t, filepath.Join(S, "objects/ab/cd"), "obj\n")
	wantFile(t, filepath.Join(S, "refs/heads/agent"), "0123\n")
	wantFile(t, filepath.Join(S, "logs/refs/heads/agent"), "entry\n")
	s.assertClean(t)
}

// runsc's gofer mounts every bind at its destination beneath the rootfs on
// the host, making a missing mount point there (mkdir, or a file) as root:
// inside a read-write bind that lands in its source, inside a read-only one
// it fails with EROFS ("error setting up FS" in the gofer's log) and the
// sandbox does not start, nothing made. The control has the mount point.
func TestRunscMissingMountPointInReadOnlyBind(t *testing.T) {
	s := compileScript(t, "echo started", "")
	R, src := filepath.Join(s.host, "gitlab/R"), filepath.Join(s.host, "gitlab/src")
	for _, dir := range []string{filepath.Join(R, "hooks"), src} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func() (string, string, error) {
		extra := newExtraBinds(t, s)
		defer extra.remove(t)
		return bareRunscErr(t, s, func(spec *rspec.Spec) {
			extra.add(t, spec, R, R, true)
			extra.add(t, spec, src, filepath.Join(R, "hooks"), true)
		}, func() {})
	}
	if out, stderr, err := run(); err != nil || out != "started\n" {
		t.Fatalf("control (mount point present): err %v, stdout %q\nstderr: %s", err, out, lastLines(stderr, 5))
	}
	if err := os.Remove(filepath.Join(R, "hooks")); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run()
	if err == nil {
		t.Errorf("runsc started a sandbox with a bind over a destination missing in a read-only bind: %q", out)
	}
	t.Logf("runsc: %v\n%s", err, lastLines(stderr, 3))
	if _, err := os.Lstat(filepath.Join(R, "hooks")); err == nil {
		t.Error("runsc made the mount point in a read-only bind's source")
	}
	s.assertClean(t)
}

// extraBinds stages test-only binds as the launcher stages its own (a
// non-recursive clone of the pinned source, mounted in a root-owned dir).
type extraBinds struct {
	dir, root string
	n         int
}

func newExtraBinds(t *testing.T, s *sandbox) *extraBinds {
	t.Helper()
	dir := filepath.Join(s.state, "extra-binds")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	e := &extraBinds{dir: dir, root: s.host}
	t.Cleanup(func() { mounts.RemoveDir(dir) })
	return e
}

func (e *extraBinds) add(t *testing.T, spec *rspec.Spec, source, dest string, ro bool) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(source, &st); err != nil {
		t.Fatal(err)
	}
	pin := bundle.Pin{Destination: dest, Source: source, Root: e.root, Dev: st.Dev, Ino: st.Ino, Kind: string(pathsafe.KindOf(st.Mode))}
	e.n++
	target := filepath.Join(e.dir, fmt.Sprint(e.n))
	if err := stageBind(pin, target, ro); err != nil {
		t.Fatal(err)
	}
	opts := []string{"bind", "rw", "nosuid", "nodev"}
	if ro {
		opts = []string{"bind", "ro", "nosuid", "nodev", "noexec"}
	}
	spec.Mounts = append(spec.Mounts, rspec.Mount{Destination: dest, Type: "bind", Source: target, Options: opts})
}

func (e *extraBinds) remove(t *testing.T) {
	t.Helper()
	if err := mounts.RemoveDir(e.dir); err != nil {
		t.Error(err)
	}
}

func chownTree(t *testing.T, dir string) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 1000, 1000)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// outcomes parses the script's "label=outcome" lines.
func outcomes(out string) map[string]string {
	got := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	return got
}

func writeFileT(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFileT(t *testing.T, p string) string {
	t.Helper()
	return string(mustReadFile(t, p))
}

func wantFile(t *testing.T, p, want string) {
	t.Helper()
	if got, err := os.ReadFile(p); err != nil || string(got) != want {
		t.Errorf("host %s: %q %v, want %q", p, got, err, want)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// A workspace that is no repository gets an empty read-only .git: the
// agent can neither make a repository there nor remove the mount point,
// and what runsc leaves on the host is an empty directory Git passes over.
func TestGitPlaceholderInRunsc(t *testing.T) {
	script := `W=$PASEO_AGENT_CWD
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
try config-create /bin/busybox sh -c "echo '[core]' > $W/.git/config"
try dir-create /bin/busybox mkdir $W/.git/objects
try rename /bin/busybox mv $W/.git $W/.git.old
try rmdir /bin/busybox rmdir $W/.git
`
	sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(script), FactsPatch: `{"workspace":{"git":null}}`,
		Prepare: func(t testing.TB, host string) {
			if err := os.Remove(filepath.Join(host, "srv/paseo/workspace/proj-feature/.git")); err != nil {
				t.Fatal(err)
			}
		}})
	s := sceneSandbox(sc)
	res, out, stderr, err := s.launch(t, staticSecret("sk"))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v %+v\n%s\n%s", err, res, out, stderr)
	}
	got := outcomes(out)
	for label, want := range map[string]string{"config-create": "Read-only file system", "dir-create": "Read-only file system", "rename": "Device or resource busy", "rmdir": "Device or resource busy"} {
		if !strings.Contains(got[label], want) {
			t.Errorf("%s: got %q, want %q", label, got[label], want)
		}
	}
	dotgit := filepath.Join(sc.Workspace(), ".git")
	entries, err := os.ReadDir(dotgit)
	if err != nil || len(entries) != 0 {
		t.Errorf("host %s: %v %v, want the empty mount point runsc made", dotgit, entries, err)
	}
	s.assertClean(t)
}
