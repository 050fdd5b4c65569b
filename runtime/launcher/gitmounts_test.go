package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler/pathsafe"
)

// How the pinned runsc treats binds nested in binds, which a protection of
// Git control data (issue 19) builds on, so that an upgrade that changes it
// fails here. The reference facts already grant a linked worktree: the
// common dir read-write, its config and hooks read-only over it, the
// gitdir (common/worktrees/proj-feature) read-write inside it. The test
// adds D (read-write) with D/a/b read-only inside and two read-only binds
// whose destinations D lacks, and R (read-only) with R/x read-write inside.
//
// The script prints one "label=outcome" line per operation: "ok" or the
// error busybox reports.
const gitMountScript = `b=/bin/busybox
H=${PASEO_AGENT_CWD%/srv/paseo/workspace/proj-feature}
C=$H/srv/paseo/repos/proj/.git
D=$H/gitlab/D
R=$H/gitlab/R
try() { l=$1; shift; if o=$("$@" 2>&1); then echo "$l=ok"; else echo "$l=$o"; fi; }
$b echo planted > $C/config.new
try q5-rename-over-ro-file $b mv -f $C/config.new $C/config
try q6-hardlink-ro-file $b ln $C/config $C/config.hard
try q1-rename-ro-file $b mv $C/config $C/config.moved
try q1-unlink-ro-file $b rm -f $C/config
try q1-rename-ro-dir $b mv $C/hooks $C/hooks.moved
try q1-rmdir-ro-dir $b rmdir $C/hooks
try q1-rename-rw-dir $b mv $C/worktrees/proj-feature $C/worktrees/moved
try q1-rename-mount-root $b mv $C $C.moved
try q2-rename-parent $b mv $D/a $D/a2
try q2-old-path $b ls $D/a
try q2-moved-still-ro $b sh -c "echo x > $D/a2/b"
try q2-remake $b sh -c "$b mkdir $D/a && $b echo planted > $D/a/b"
try q2-rename-gitdir-parent $b mv $C/worktrees $C/worktrees.moved
try q2-remake-gitdir $b sh -c "$b mkdir -p $C/worktrees/proj-feature && $b echo /fake > $C/worktrees/proj-feature/commondir"
try q2-moved-gitdir-write $b sh -c "$b echo w > $C/worktrees.moved/proj-feature/written"
try q2-rename-dotgit $b mv $PASEO_AGENT_CWD/.git $PASEO_AGENT_CWD/.git.old
try q2-remake-dotgit $b sh -c "$b mkdir -p $PASEO_AGENT_CWD/.git/hooks && $b echo planted > $PASEO_AGENT_CWD/.git/config"
try q3-create-in-ro $b sh -c "$b echo x > $R/new"
try q3-lock-rename-in-rw $b sh -c "$b echo v > $R/x/f.lock && $b mv $R/x/f.lock $R/x/f"
try q4-dir-seen $b ls -d $D/missing-dir
try q4-file-seen $b cat $D/missing-file
try q4-deep-seen $b ls -d $D/m1/m2/missing-deep
`

func TestRunscGitMountSemantics(t *testing.T) {
	s := compileScript(t, gitMountScript, "")
	repo := filepath.Join(s.host, "srv/paseo/repos")
	C := filepath.Join(repo, "proj/.git")
	D, R, src := filepath.Join(s.host, "gitlab/D"), filepath.Join(s.host, "gitlab/R"), filepath.Join(s.host, "gitlab/src")
	for _, dir := range []string{filepath.Join(D, "a"), filepath.Join(R, "x"), filepath.Join(src, "dir")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFileT(t, filepath.Join(D, "a/b"), "orig\n")
	// A repository inside the workspace (.git a directory, no Git facts),
	// as golden host-workspace-dotgit binds it: config and hooks read-only.
	ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	dotgit := filepath.Join(ws, ".git")
	if err := os.Remove(dotgit); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dotgit, "hooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFileT(t, filepath.Join(dotgit, "config"), "[core]\n")
	chownTree(t, dotgit)
	writeFileT(t, filepath.Join(src, "file"), "src-file\n")
	// Owned by the sandbox user, as the daemon's repositories are: only the
	// mounts stand in the way, not permissions.
	chownTree(t, repo)
	chownTree(t, filepath.Join(s.host, "gitlab"))

	extra := newExtraBinds(t, s)
	out := bareRunsc(t, s, func(spec *rspec.Spec) {
		extra.add(t, spec, filepath.Join(dotgit, "config"), filepath.Join(dotgit, "config"), true)
		extra.add(t, spec, filepath.Join(dotgit, "hooks"), filepath.Join(dotgit, "hooks"), true)
		extra.add(t, spec, D, D, false)
		extra.add(t, spec, filepath.Join(D, "a/b"), filepath.Join(D, "a/b"), true)
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
		// (1) a read-only bind's mount point, file or dir, can be neither
		// renamed nor removed, nor can a read-write bind's; the common dir
		// itself sits in a directory runsc made in the rootfs, root's.
		"q1-rename-ro-file": busy, "q1-unlink-ro-file": busy, "q1-rename-ro-dir": busy, "q1-rmdir-ro-dir": busy,
		"q1-rename-rw-dir": busy, "q1-rename-mount-root": "Permission denied",
		// (2) the parent of a nested mount point can be renamed: the mount
		// moves with it, and the old name is free to remake unprotected.
		"q2-rename-parent": ok, "q2-old-path": noent, "q2-moved-still-ro": rofs, "q2-remake": ok,
		// The gitdir's bind moves with worktrees/, and the agent remakes
		// worktrees/<name> with a commondir of its own (gitplant's
		// "worktrees/ renamed away" plant, which host git runs).
		"q2-rename-gitdir-parent": ok, "q2-remake-gitdir": ok, "q2-moved-gitdir-write": ok,
		// So a workspace's .git dir, whose config and hooks are read-only
		// binds, is renamed away and remade with the agent's config.
		"q2-rename-dotgit": ok, "q2-remake-dotgit": ok,
		// (3) nothing is created in a read-only bind; lock file and rename
		// work in a read-write bind nested in it.
		"q3-create-in-ro": rofs, "q3-lock-rename-in-rw": ok,
		// (4) binds whose destinations D lacks are mounted.
		"q4-dir-seen": ok, "q4-file-seen": ok, "q4-deep-seen": ok,
	} {
		if g, found := got[label]; !found || !strings.Contains(g, want) {
			t.Errorf("%s: got %q, want %q", label, g, want)
		}
	}
	t.Logf("sandbox:\n%s", out)

	// What the host sees afterwards.
	if b := readFileT(t, filepath.Join(C, "config")); strings.Contains(b, "planted") {
		t.Errorf("the repository's config was replaced: %q", b)
	}
	// (2) the renames reached the host: the protected file under its new
	// name, the agent's file under the old one.
	wantFile(t, filepath.Join(D, "a2/b"), "orig\n")
	wantFile(t, filepath.Join(D, "a/b"), "planted\n")
	wantFile(t, filepath.Join(C, "worktrees.moved/proj-feature/HEAD"), "ref: refs/heads/feature\n")
	wantFile(t, filepath.Join(C, "worktrees.moved/proj-feature/written"), "w\n")
	wantFile(t, filepath.Join(C, "worktrees/proj-feature/commondir"), "/fake\n")
	wantFile(t, filepath.Join(ws, ".git.old/config"), "[core]\n")
	wantFile(t, filepath.Join(ws, ".git/config"), "planted\n")
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
	t.Cleanup(func() { removeRunDir(dir) })
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
	if err := removeRunDir(e.dir); err != nil {
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
