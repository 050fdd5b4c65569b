package pilaunch

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// gitLab is a repository with a linked worktree on branch agent, and the
// agent's store as the sandbox leaves it: the repository's refs copied in,
// its objects as the alternate, the agent's commits written with the
// store as Git's dir.
type gitLab struct {
	root, repo, common, wt, stores, store string
}

func newGitLab(t *testing.T) *gitLab {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := &gitLab{root: root, repo: filepath.Join(root, "repo"), wt: filepath.Join(root, "wt"), stores: filepath.Join(root, "stores")}
	l.common = filepath.Join(l.repo, ".git")
	l.store = filepath.Join(l.stores, "agent-g")
	if err := os.MkdirAll(l.repo, 0o755); err != nil {
		t.Fatal(err)
	}
	gitOut(t, l.repo, "init", "-q")
	gitOut(t, l.repo, "commit", "-q", "--allow-empty", "-m", "first")
	gitOut(t, l.repo, "worktree", "add", "-q", "-b", "agent", l.wt)
	if err := os.MkdirAll(filepath.Join(l.store, "objects/info"), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-R", filepath.Join(l.common, "refs"), filepath.Join(l.store, "refs")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	for name, data := range map[string]string{"objects/info/alternates": filepath.Join(l.common, "objects") + "\n",
		"HEAD": "ref: refs/heads/agent\n", "config": "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"} {
		if err := os.WriteFile(filepath.Join(l.store, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// commit makes a commit on the store's branch agent, as Git in the sandbox does.
func (l *gitLab) commit(t *testing.T, msg string) string {
	t.Helper()
	parent := gitOut(t, l.root, "--git-dir="+l.store, "rev-parse", "refs/heads/agent")
	tree := gitOut(t, l.root, "--git-dir="+l.store, "rev-parse", parent+"^{tree}")
	id := gitOut(t, l.root, "--git-dir="+l.store, "commit-tree", tree, "-p", parent, "-m", msg)
	gitOut(t, l.root, "--git-dir="+l.store, "update-ref", "refs/heads/agent", id)
	return id
}

func (l *gitLab) branch(t *testing.T) string {
	return gitOut(t, l.root, "--git-dir="+l.common, "rev-parse", "refs/heads/agent")
}

func (l *gitLab) bridge(t *testing.T, st *Store, stderr *bytes.Buffer) (*Bridge, *Launch) {
	b := &Bridge{Store: st, Stderr: stderr}
	ln := &Launch{AgentID: "agent-g", Git: &GitPlan{GitDir: filepath.Join(l.common, "worktrees/wt"), Repo: l.common, StateRoot: l.stores, Store: l.store}}
	return b, ln
}

// The turn-end import: the base is the branch's value read before the
// sandbox starts; each import moves the branch from it and keeps the new
// value as the next base (in the bridge dir, across spawns); a branch the
// host moved is refused with PP-GIT-IMPORT-MOVED on stderr, the branch
// untouched, and a later spawn of the agent keeps refusing (it is never
// handed the host's new value as its base) until store and repository
// agree again.
func TestTurnEndImport(t *testing.T) {
	l := newGitLab(t)
	bdir := filepath.Join(l.root, "bridge")
	if err := os.Mkdir(bdir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := OpenStore(bdir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var stderr bytes.Buffer
	b, ln := l.bridge(t, st, &stderr)
	launch := l.branch(t)
	g := b.prepareGit(ln)
	if g == nil {
		t.Fatalf("no import planned: %s", stderr.String())
	}
	g.start()
	if rec, err := st.LoadGitBase("agent-g"); err != nil || rec == nil || *rec != (GitBase{Branch: "refs/heads/agent", Base: launch}) {
		t.Fatalf("base record %+v %v", rec, err)
	}

	c1 := l.commit(t, "turn 1")
	g.run("turn-end")
	if got := l.branch(t); got != c1 {
		t.Fatalf("turn 1: branch %s, want %s; stderr %s", got, c1, stderr.String())
	}
	if !strings.Contains(stderr.String(), "git import at turn-end: imported refs/heads/agent "+launch+" -> "+c1) {
		t.Errorf("no import line: %q", stderr.String())
	}
	c2 := l.commit(t, "turn 2")
	g.run("turn-end")
	if got := l.branch(t); got != c2 {
		t.Fatalf("turn 2 (base carried): branch %s, want %s; stderr %s", got, c2, stderr.String())
	}

	// The host moves the branch between turns.
	host := gitOut(t, l.wt, "commit", "-q", "--allow-empty", "-m", "by the host")
	_ = host
	moved := l.branch(t)
	l.commit(t, "turn 3")
	stderr.Reset()
	g.run("turn-end")
	if got := l.branch(t); got != moved {
		t.Fatalf("a refused import moved the branch to %s", got)
	}
	if line := stderr.String(); !strings.HasPrefix(line, "PP-GIT-IMPORT-MOVED refs/heads/agent: ") || strings.Count(line, "\n") != 1 {
		t.Errorf("refusal line %q", line)
	}
	// The agent's next spawn keeps the base it had: still refused.
	stderr.Reset()
	g2 := b.prepareGit(ln)
	g2.start()
	if got := l.branch(t); got != moved || !strings.Contains(stderr.String(), "PP-GIT-IMPORT-MOVED") {
		t.Fatalf("next spawn: branch %s (host's %s), stderr %q", got, moved, stderr.String())
	}
	// The agent takes the host's branch (store and repository agree): the
	// base catches up, and its next commit arrives.
	gitOut(t, l.root, "--git-dir="+l.store, "update-ref", "refs/heads/agent", moved)
	g2.run("turn-end")
	c4 := l.commit(t, "turn 4")
	stderr.Reset()
	g2.run("turn-end")
	if got := l.branch(t); got != c4 {
		t.Fatalf("after agreeing: branch %s, want %s; stderr %s", got, c4, stderr.String())
	}
}

// No branch, no import: a detached HEAD is said on stderr with
// PP-PI-GIT-IMPORT and the spawn runs without imports.
func TestTurnEndImportDetached(t *testing.T) {
	l := newGitLab(t)
	gitOut(t, l.wt, "checkout", "-q", "--detach")
	var stderr bytes.Buffer
	b, ln := l.bridge(t, nil, &stderr)
	if g := b.prepareGit(ln); g != nil {
		t.Fatal("an import planned for a detached HEAD")
	}
	if !strings.HasPrefix(stderr.String(), "PP-PI-GIT-IMPORT workspace.git: the worktree's HEAD is detached") {
		t.Errorf("stderr %q", stderr.String())
	}
}

// The configuration decides, alone: gitImport off plans no import; any
// other value than turn-end or off is refused.
func TestGitImportConfig(t *testing.T) {
	c := Config{GitImport: "sometimes"}
	var found bool
	for _, d := range c.check() {
		if d.Path == "config.gitImport" {
			found = true
		}
	}
	if !found {
		t.Error("gitImport sometimes accepted")
	}
}
