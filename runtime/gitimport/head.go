package gitimport

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"paseo.dev/paseo-policy/internal/hostgit"
	"paseo.dev/paseo-policy/internal/pathform"
)

// Head reads the branch a worktree's HEAD names (gitDir: the worktree's
// gitdir, a main worktree's .git) and that branch's value in the shared
// repository (repo: its common dir), with the import's hardened host git
// (no inherited GIT_*, no system config, no hooks, fsmonitor or replace
// objects). The caller records the value as the import's Base before the
// agent runs: the agent cannot write the repository, so what it reads
// here is the host's. branch is "" for a detached HEAD; value is "" for a
// branch that does not exist yet.
// cred, when set, is the user git runs as (Options.Cred).
func Head(ctx context.Context, gitDir, repo, home string, cred *Cred) (branch, value string, err error) {
	for _, p := range []string{gitDir, repo} {
		if code, _ := pathform.Check(p); code != "" || !filepath.IsAbs(p) {
			return "", "", fmt.Errorf("%q must be an absolute, clean path", p)
		}
	}
	git := newGitRunner(home, cred)
	out, err := git.run(ctx, gitDir, nil, "symbolic-ref", "--quiet", "HEAD")
	if err != nil {
		if hostgit.ExitCode(err) == 1 {
			return "", "", nil // detached
		}
		return "", "", err
	}
	branch = strings.TrimSpace(out)
	if !strings.HasPrefix(branch, "refs/heads/") || !validRef(branch) {
		return "", "", fmt.Errorf("HEAD names %q, not a branch the import accepts", branch)
	}
	value, err = RefValue(ctx, repo, branch, home, cred)
	return branch, value, err
}

// RefValue is ref's value in the repository ("" when it does not exist),
// read as the import reads the repository's refs.
func RefValue(ctx context.Context, repo, ref, home string, cred *Cred) (string, error) {
	git := newGitRunner(home, cred)
	out, err := git.run(ctx, repo, nil, "for-each-ref", "--format=%(objectname) %(refname)", "--end-of-options", ref)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if id, name, ok := strings.Cut(line, " "); ok && name == ref {
			return id, nil
		}
	}
	return "", nil
}
