package pilaunch

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func gitRun(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// A linked worktree made by real Git: the command claims its gitdir, the
// repository's commondir and alternates (the compiler verifies them), and
// with a stores dir asks for writes into the agent's store. A main
// worktree's .git directory and a cwd without .git need no facts; a
// symlinked .git, or a gitdir whose commondir is a link, is refused.
func TestGitFactsOfALinkedWorktree(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	repo, wt := filepath.Join(root, "repo"), filepath.Join(root, "wt")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	gitRun(t, repo, "init", "-q")
	gitRun(t, repo, "commit", "-q", "--allow-empty", "-m", "first")
	gitRun(t, repo, "worktree", "add", "-q", "-b", "agent", wt)
	alt := filepath.Join(root, "other/objects")
	if err := os.MkdirAll(alt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".git/objects/info/alternates"), []byte("# comment\n../../../other/objects\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	g, err := gitFacts(wt, true)
	if err != nil || g == nil {
		t.Fatalf("gitFacts: %+v %v", g, err)
	}
	if g.Gitdir != filepath.Join(repo, ".git/worktrees/wt") || g.Commondir != filepath.Join(repo, ".git") || !g.Write ||
		len(g.Alternates) != 1 || g.Alternates[0] != alt {
		t.Errorf("facts %+v", g)
	}
	if g, err := gitFacts(repo, true); g != nil || err != nil {
		t.Errorf("a main worktree's .git directory: %+v %v", g, err)
	}
	if g, err := gitFacts(root, true); g != nil || err != nil {
		t.Errorf("no .git: %+v %v", g, err)
	}

	cfg := refConfig()
	cfg.State.GitStoresDir = "/srv/paseo/state/git-stores"
	ln, err := Plan(&cfg, Args{Model: "fake/fake-1"}, wt)
	if err != nil {
		t.Fatal(err)
	}
	if ln.Facts.Workspace.Git == nil || ln.Facts.State.GitStore != "/srv/paseo/state/git-stores/"+ln.AgentID {
		t.Errorf("planned %+v, store %q", ln.Facts.Workspace.Git, ln.Facts.State.GitStore)
	}
	// The turn-end import, on by default, from the worktree's gitdir to
	// the repository; off in the configuration, none (the store stays).
	if g := ln.Git; g == nil || g.GitDir != ln.Facts.Workspace.Git.Gitdir || g.Repo != ln.Facts.Workspace.Git.Commondir ||
		g.StateRoot != cfg.State.GitStoresDir || g.Store != ln.Facts.State.GitStore {
		t.Errorf("import plan %+v", ln.Git)
	}
	cfg.GitImport = GitImportOff
	if ln, err = Plan(&cfg, Args{Model: "fake/fake-1"}, wt); err != nil || ln.Git != nil || ln.Facts.State.GitStore == "" {
		t.Errorf("gitImport off: plan %+v, store %q, %v", ln.Git, ln.Facts.State.GitStore, err)
	}
	cfg.GitImport = ""
	cfg.State.GitStoresDir = ""
	if ln, err = Plan(&cfg, Args{Model: "fake/fake-1"}, wt); err != nil || ln.Facts.Workspace.Git.Write || ln.Facts.State.GitStore != "" {
		t.Errorf("without a stores dir Git is read-only: %+v %v", ln.Facts, err)
	}
	if ln.Git != nil {
		t.Errorf("an import planned without a store: %+v", ln.Git)
	}

	// A symlinked .git: refused, not followed.
	link := filepath.Join(root, "linked")
	if err := os.Mkdir(link, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(wt, ".git"), filepath.Join(link, ".git")); err != nil {
		t.Fatal(err)
	}
	if _, err := Plan(&cfg, Args{Model: "fake/fake-1"}, link); len(codes(t, err)) != 1 || codes(t, err)[0] != "PP-PI-GIT workspace.git" {
		t.Errorf("a symlinked .git: %v", err)
	}
	// A commondir file that is a link.
	cd := filepath.Join(repo, ".git/worktrees/wt/commondir")
	if err := os.Rename(cd, cd+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cd+".real", cd); err != nil {
		t.Fatal(err)
	}
	if _, err := gitFacts(wt, true); err == nil {
		t.Error("a symlinked commondir file was followed")
	}
}
