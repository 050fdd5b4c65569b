package hostgit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func initRepo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "r.git")
	if out, err := exec.Command("git", "init", "--quiet", "--bare", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v: %s", err, out)
	}
	return dir
}

// The caller's GIT_* and -c parameters do not reach git: the runner's
// own settings are what git sees, and HOME's ~/.gitconfig is read.
func TestCleanEnvironment(t *testing.T) {
	repo, other := initRepo(t), initRepo(t)
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[paseo]\n\tfromhome = yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_DIR", other)
	t.Setenv("GIT_CONFIG_PARAMETERS", "'core.hookspath=/tmp/evil' 'paseo.fromcaller=yes'")
	git := New(home).GitDir(repo)
	ctx := context.Background()

	for key, want := range map[string]string{"core.hooksPath": "/dev/null\n", "protocol.allow": "never\n", "paseo.fromhome": "yes\n"} {
		got, err := git.Output(ctx, nil, 1<<10, "config", "--get", key)
		if err != nil || got != want {
			t.Errorf("config %s: got %q, %v; want %q", key, got, err, want)
		}
	}
	_, err := git.Output(ctx, nil, 1<<10, "config", "--get", "paseo.fromcaller")
	if code := ExitCode(err); code != 1 {
		t.Errorf("the caller's -c reached git: exit %d (%v)", code, err)
	}
	gd, err := git.Output(ctx, nil, 1<<10, "rev-parse", "--absolute-git-dir")
	if err != nil || strings.TrimSpace(gd) != repo {
		t.Errorf("rev-parse: got %q, %v; want %q (not the caller's GIT_DIR)", gd, err, repo)
	}
}

// A transport other than a local path is refused.
func TestNoTransport(t *testing.T) {
	repo := initRepo(t)
	_, err := New("").GitDir(repo).Output(context.Background(), nil, 1<<10, "ls-remote", "git://127.0.0.1:9/x")
	if ExitCode(err) <= 0 || !strings.Contains(err.Error(), "transport 'git' not allowed") {
		t.Fatalf("git:// (allowed by git's default): %v", err)
	}
	if _, err := New("").GitDir(repo).Output(context.Background(), nil, 1<<10, "ls-remote", repo); err != nil {
		t.Fatalf("a local path: %v", err)
	}
}

// Output past the bound is refused; a command that does not start has no
// exit code.
func TestBounds(t *testing.T) {
	repo := initRepo(t)
	_, err := New("").GitDir(repo).Output(context.Background(), nil, 4, "rev-parse", "--absolute-git-dir")
	if err == nil || !strings.Contains(err.Error(), "more than 4 bytes") {
		t.Fatalf("got %v, want a refusal past 4 bytes", err)
	}
	if code := ExitCode(err); code != -1 {
		t.Fatalf("exit %d for a refusal that is not git's", code)
	}
	_, err = New("").Worktree(filepath.Join(t.TempDir(), "none")).Output(context.Background(), nil, 1<<10, "status")
	if code := ExitCode(err); code <= 0 {
		t.Fatalf("a missing worktree: exit %d (%v), want git's own complaint", code, err)
	}
}
