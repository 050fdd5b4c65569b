package gitadopt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
)

// lab is one scratch area of real repositories, built and inspected with
// the host's git, plus the daemon's home and a directory planted payloads
// leave markers in.
type lab struct {
	t       *testing.T
	dir     string
	home    string
	markers string
	n       int
}

func newLab(t *testing.T) *lab {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("gitadopt's tests need git on the host: %v", err)
	}
	// Not t.TempDir: subtest names would put shell metacharacters in the
	// payload paths git runs through sh.
	dir, err := os.MkdirTemp("", "gitadopt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l := &lab{t: t, dir: dir, home: filepath.Join(dir, "home"), markers: filepath.Join(dir, "markers")}
	for _, d := range []string{l.home, l.markers} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l.write(filepath.Join(l.home, ".gitconfig"), "")
	return l
}

// env is the daemon's environment for git, as Adopt's own.
func (l *lab) env(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + l.home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}, extra...)
}

// gitEnv runs git in dir with extra environment; a failure fails the test.
func (l *lab) gitEnv(dir string, extra []string, args ...string) string {
	l.t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Builder", "-c", "user.email=builder@example.invalid", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir, cmd.Env = dir, l.env(extra...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		l.t.Fatalf("git %s in %s: %v\n%s%s", strings.Join(args, " "), dir, err, out.String(), stderr.String())
	}
	return strings.TrimSpace(out.String())
}

func (l *lab) git(dir string, args ...string) string {
	l.t.Helper()
	return l.gitEnv(dir, nil, args...)
}

// status is the daemon's `git status --porcelain`, and the payload
// markers it left.
func (l *lab) status(wt string) (string, []string) {
	l.t.Helper()
	cmd := exec.Command("git", "status", "--porcelain")
	cmd.Dir, cmd.Env = wt, l.env()
	out, err := cmd.Output()
	if err != nil {
		l.t.Fatalf("git status in %s: %v", wt, err)
	}
	return string(out), l.takeMarkers()
}

func (l *lab) takeMarkers() []string {
	l.t.Helper()
	ents, err := os.ReadDir(l.markers)
	if err != nil {
		l.t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		if err := os.Remove(filepath.Join(l.markers, e.Name())); err != nil {
			l.t.Fatal(err)
		}
	}
	slices.Sort(names)
	return names
}

// payload is an executable that leaves the marker role when anything runs it.
func (l *lab) payload(role string) string {
	l.t.Helper()
	p := filepath.Join(l.dir, "payload", role)
	l.write(p, fmt.Sprintf("#!/bin/sh\ntouch %q\n", filepath.Join(l.markers, role)))
	if err := os.Chmod(p, 0o755); err != nil {
		l.t.Fatal(err)
	}
	return p
}

func (l *lab) write(p, s string) {
	l.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		l.t.Fatal(err)
	}
}

func (l *lab) read(p string) []byte {
	l.t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		l.t.Fatal(err)
	}
	return b
}

// layout is one built layout: the agent's worktree, its gitdir (where the
// host index lives) and the common dir (objects, refs).
type layout struct {
	wt, gitDir, common string
	lib1, lib2         string // two commits of another repository, for gitlinks
}

// build makes a repository with files a and b and an unpopulated
// submodule's gitlink at sub; linked puts the agent in a linked worktree
// (as Paseo's facts do), otherwise in the main one. Its status is clean.
func (l *lab) build(linked bool) layout {
	l.t.Helper()
	l.n++
	root := filepath.Join(l.dir, fmt.Sprintf("r%d", l.n))
	lib := filepath.Join(root, "lib")
	l.git(l.dir, "init", "-q", lib)
	l.git(lib, "commit", "-q", "--allow-empty", "-m", "lib 1")
	lib1 := l.git(lib, "rev-parse", "HEAD")
	l.git(lib, "commit", "-q", "--allow-empty", "-m", "lib 2")
	lib2 := l.git(lib, "rev-parse", "HEAD")

	main := filepath.Join(root, "main")
	l.git(l.dir, "init", "-q", main)
	l.write(filepath.Join(main, "a"), "a\n")
	l.write(filepath.Join(main, "b"), "b\n")
	if err := os.Mkdir(filepath.Join(main, "sub"), 0o755); err != nil {
		l.t.Fatal(err)
	}
	l.git(main, "add", "a", "b")
	l.git(main, "update-index", "--add", "--cacheinfo", "160000,"+lib1+",sub")
	l.git(main, "commit", "-q", "-m", "base")
	r := layout{wt: main, gitDir: filepath.Join(main, ".git"), common: filepath.Join(main, ".git"), lib1: lib1, lib2: lib2}
	if linked {
		wt := filepath.Join(root, "wt")
		l.git(main, "worktree", "add", "-q", "-b", "agent", wt)
		r.wt, r.gitDir = wt, filepath.Join(r.common, "worktrees", "wt")
	}
	if st, _ := l.status(r.wt); st != "" {
		l.t.Fatalf("built repository is not clean:\n%s", st)
	}
	return r
}

// agentCommit commits as the sandbox does: git with a private copy of the
// index (the sandbox's tmpfs), so the branch ref and the objects move and
// the host index does not. stage runs git commands against that copy.
func (l *lab) agentCommit(r layout, msg string, stage func(git func(args ...string) string)) string {
	l.t.Helper()
	l.n++
	private := filepath.Join(l.dir, fmt.Sprintf("sandbox-index-%d", l.n))
	l.write(private, string(l.read(filepath.Join(r.gitDir, "index"))))
	env := []string{"GIT_INDEX_FILE=" + private}
	git := func(args ...string) string { return l.gitEnv(r.wt, env, args...) }
	stage(git)
	git("-c", "core.hooksPath=/dev/null", "commit", "-q", "--allow-empty", "-m", msg)
	return l.git(r.wt, "rev-parse", "HEAD")
}

// headRef is the loose ref file HEAD's branch lives in: what an agent
// rewrites by hand to point HEAD anywhere.
func (l *lab) headRef(r layout) string {
	l.t.Helper()
	return filepath.Join(r.common, l.git(r.wt, "symbolic-ref", "HEAD"))
}

func (l *lab) adopt(r layout, mod ...func(*Options)) (Result, error) {
	l.t.Helper()
	o := Options{Worktree: r.wt, GitDir: r.gitDir, Home: l.home}
	for _, m := range mod {
		m(&o)
	}
	return Adopt(context.Background(), o)
}

// codes are the diagnostics' codes in err, or fails the test when err is
// not a refusal.
func codes(t *testing.T, err error) []diag.Code {
	t.Helper()
	var dl diag.List
	if !errors.As(err, &dl) {
		t.Fatalf("want a refusal (diag.List), got %v", err)
	}
	var out []diag.Code
	for _, d := range dl {
		if !slices.Contains(out, d.Code) {
			out = append(out, d.Code)
		}
	}
	slices.Sort(out)
	return out
}
