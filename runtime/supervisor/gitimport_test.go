package supervisor

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/runtime/gitimport"
)

const gitDaemon = 1000

func gitAs(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// The gitImport op's import, as the supervisor runs it: the record made
// at create from the compile's pins (the branch's value read as the
// daemon), the import as the connecting daemon's uid, the base carried in
// the root-owned record, which a restarted supervisor reads again; a
// branch the host moved is a result with PP-GIT-IMPORT-MOVED, nothing
// written; a root peer is refused (root is no daemon).
func TestGitImportOp(t *testing.T) {
	skip.UnlessRoot(t, "runs git as the daemon's uid")
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lab := filepath.Join(root, "lab")
	repo, wt, stores := filepath.Join(lab, "repo"), filepath.Join(lab, "wt"), filepath.Join(lab, "state/git")
	store := filepath.Join(stores, "agent-g")
	for _, d := range []string{repo, filepath.Join(store, "objects/info")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	gitAs(t, repo, "init", "-q")
	gitAs(t, repo, "commit", "-q", "--allow-empty", "-m", "first")
	gitAs(t, repo, "worktree", "add", "-q", "-b", "agent", wt)
	common := filepath.Join(repo, ".git")
	if out, err := exec.Command("cp", "-R", filepath.Join(common, "refs"), filepath.Join(store, "refs")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	for name, data := range map[string]string{"objects/info/alternates": filepath.Join(common, "objects") + "\n",
		"HEAD": "ref: refs/heads/agent\n", "config": "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"} {
		if err := os.WriteFile(filepath.Join(store, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("chown", "-R", "1000:1000", lab).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	tmp := filepath.Clean(os.TempDir())
	for d := lab; strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(msg string) string {
		parent := gitAs(t, root, "--git-dir="+store, "rev-parse", "refs/heads/agent")
		id := gitAs(t, root, "--git-dir="+store, "commit-tree", parent+"^{tree}", "-p", parent, "-m", msg)
		gitAs(t, root, "--git-dir="+store, "update-ref", "refs/heads/agent", id)
		return id
	}
	branch := func() string { return gitAs(t, root, "--git-dir="+common, "rev-parse", "refs/heads/agent") }

	// The compile's pins, as a linked worktree's layout has them.
	res := &compiler.Result{Manifest: &bundle.Manifest{Agent: "agent-g"}, Plan: &bundle.Plan{Pins: []bundle.Pin{
		{Destination: compiler.GitStoreView, Source: store, Root: filepath.Join(lab, "state")},
		{Destination: compiler.GitSeedView, Source: filepath.Join(common, "worktrees/wt")},
		{Destination: "/srv/repo/.git", Source: common},
	}}}
	facts := []byte(`{"workspace":{"git":{"gitdir":"/srv/repo/.git/worktrees/wt","commondir":"/srv/repo/.git"}}}`)
	state := filepath.Join(root, "supervisor")
	s := &Server{cfg: Config{StateRoot: state}}
	daemon := lineserve.Peer{UID: gitDaemon, GID: gitDaemon}
	launch := branch()
	if err := s.recordGit(context.Background(), "pp-1", daemon, res, facts); err != nil {
		t.Fatal(err)
	}
	rec, err := s.loadGitRecord("pp-1")
	if err != nil || rec == nil || rec.Branch != "refs/heads/agent" || rec.Base != launch || rec.Repo != common || rec.Store != store || rec.Unusable != "" {
		t.Fatalf("record %+v %v", rec, err)
	}
	if st, err := os.Stat(s.gitRecordPath("pp-1")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("record mode: %v %v", st, err)
	}

	c1 := commit("turn 1")
	out, e := s.gitImport(context.Background(), "pp-1", daemon, rec)
	if e != nil || branch() != c1 || out.Base != c1 || len(out.Updated) != 1 || out.Updated[0] != (gitimport.RefUpdate{Ref: "refs/heads/agent", Old: launch, New: c1}) {
		t.Fatalf("turn 1: %+v %v, branch %s", out, e, branch())
	}
	// A restarted supervisor: a new server on the same state root.
	s = &Server{cfg: Config{StateRoot: state}}
	rec, _ = s.loadGitRecord("pp-1")
	c2 := commit("turn 2")
	if out, e = s.gitImport(context.Background(), "pp-1", daemon, rec); e != nil || branch() != c2 || out.Base != c2 {
		t.Fatalf("after a restart: %+v %v", out, e)
	}
	// No file of root's in the daemon's repository: git ran as the daemon.
	_ = filepath.Walk(common, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
			t.Errorf("root's file %s", p)
		}
		return nil
	})
	// The host moves the branch: a refusal, as a result.
	gitAs(t, root, "--git-dir="+common, "update-ref", "refs/heads/agent", launch)
	commit("turn 3")
	rec, _ = s.loadGitRecord("pp-1")
	out, e = s.gitImport(context.Background(), "pp-1", daemon, rec)
	if e != nil || branch() != launch || len(out.Diagnostics) != 1 || out.Diagnostics[0].Code != diag.GitImportMoved || out.Base != c2 {
		t.Fatalf("moved: %+v %v, branch %s", out, e, branch())
	}
	if _, e := s.gitImport(context.Background(), "pp-1", lineserve.Peer{}, rec); e == nil || e.Code != "forbidden" {
		t.Errorf("a root peer: %v", e)
	}
}

// GitImportResult on the wire: what clients/typescript decodes.
func TestGitImportResultBytes(t *testing.T) {
	r := GitImportResult{Branch: "refs/heads/a", Base: "b1", Updated: []gitimport.RefUpdate{{Ref: "refs/heads/a", Old: "b0", New: "b1"}},
		Diagnostics: diag.List{{Code: diag.GitImportMoved, Path: "refs/heads/a", Message: "m"}}}
	got, _ := json.Marshal(Response{V: Version, ID: "g", OK: true, Result: r})
	want := `{"v":1,"id":"g","ok":true,"result":{"branch":"refs/heads/a","base":"b1","updated":[{"ref":"refs/heads/a","old":"b0","new":"b1"}],"diagnostics":[{"code":"PP-GIT-IMPORT-MOVED","path":"refs/heads/a","message":"m"}]}}`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
