package compiler

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/schema"
)

// gitScene is the reference host tree under a real directory, with the Git
// layout made by real git: the repository /srv/paseo/repos/proj, its linked
// worktrees proj-feature (the agent's) and proj-other (a sibling) under the
// workspace root, a submodule lib, and a clone --shared borrowing its objects.
type gitScene struct {
	host       string
	facts, reg []byte
}

func newGitScene(t *testing.T) *gitScene {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed to build real worktrees: apt-get install git")
	}
	host, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &gitScene{host: host}
	tree, err := os.ReadFile("../../testdata/base/tree.txt")
	if err != nil {
		t.Fatal(err)
	}
	cleanup, err := testtree.Build(host, string(tree))
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	// The base tree's hand-made layout gives way to git's own.
	for _, p := range []string{"srv/paseo/repos/proj", "srv/paseo/workspace/proj-feature"} {
		if err := os.RemoveAll(filepath.Join(host, p)); err != nil {
			t.Fatal(err)
		}
	}
	repos := s.path("/srv/paseo/repos")
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always"}, args...)...)
		cmd.Dir = dir
		cmd.Env = []string{"GIT_CONFIG_NOSYSTEM=1", "HOME=" + host + "/home/git", "PATH=" + os.Getenv("PATH"), "LC_ALL=C"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	for _, r := range []string{"proj", "libsrc"} {
		git(repos, "init", "-q", r)
		git(filepath.Join(repos, r), "commit", "-q", "--allow-empty", "-m", "initial")
	}
	proj := filepath.Join(repos, "proj")
	git(proj, "submodule", "--quiet", "add", "../libsrc", "lib")
	git(proj, "commit", "-q", "-m", "add lib")
	git(proj, "worktree", "add", "-q", "-b", "feature", s.path("/srv/paseo/workspace/proj-feature"))
	git(proj, "worktree", "add", "-q", "-b", "other", s.path("/srv/paseo/workspace/proj-other"))
	git(repos, "clone", "-q", "--shared", "proj", "clone")

	prefix := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(`"/srv/`), []byte(`"`+host+`/srv/`)) }
	facts, err := os.ReadFile("../../testdata/base/facts.json")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := os.ReadFile("../../testdata/base/registry.json")
	if err != nil {
		t.Fatal(err)
	}
	s.facts = prefix(facts)
	s.reg = bytes.ReplaceAll(prefix(reg), []byte(`"/home/`), []byte(`"`+host+`/home/`))
	return s
}

func (s *gitScene) path(p string) string { return s.host + p }

// compile compiles the reference facts with workspace replaced.
func (s *gitScene) compile(t *testing.T, cwd string, git map[string]any) diag.List {
	t.Helper()
	_, diags := s.compileResult(t, cwd, git)
	return diags
}

func (s *gitScene) compileResult(t *testing.T, cwd string, git map[string]any) (*Result, diag.List) {
	t.Helper()
	ws := map[string]any{"cwd": s.path(cwd), "git": git}
	if git != nil {
		// A merge patch keeps what it does not name: clear the base's.
		for _, k := range []string{"commondir", "alternates"} {
			if _, ok := git[k]; !ok {
				git[k] = nil
			}
		}
		for k, v := range git {
			switch v := v.(type) {
			case string:
				git[k] = s.path(v)
			case []string:
				var abs []string
				for _, p := range v {
					abs = append(abs, s.path(p))
				}
				git[k] = abs
			}
		}
	}
	p, err := json.Marshal(map[string]any{"workspace": ws})
	if err != nil {
		t.Fatal(err)
	}
	facts := mergePatch(t, s.facts, p)
	return Compile(Inputs{Facts: schema.Input{Name: "facts.json", Data: facts}, Registry: schema.Input{Name: "registry.json", Data: s.reg}},
		Options{Resolver: pathsafe.Resolver{}})
}

func mergePatch(t *testing.T, doc, patch []byte) []byte {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "base")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(doc); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return patched(t, f.Name(), patch)
}

// Git facts are granted only when they are what the cwd's repository uses,
// checked against layouts real git made.
func TestGitFactsVerifiedAgainstRealRepositories(t *testing.T) {
	s := newGitScene(t)
	const (
		feature = "/srv/paseo/workspace/proj-feature"
		common  = "/srv/paseo/repos/proj/.git"
	)
	for _, tc := range []struct {
		name     string
		cwd      string
		git      map[string]any
		wantCode diag.Code
		wantFact string
	}{
		{"linked worktree", feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": true}, "", ""},
		{"linked worktree, from a subdirectory", feature + "/lib", map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": true}, "", ""},
		{"sibling worktree's gitdir", feature, map[string]any{"gitdir": common + "/worktrees/proj-other", "commondir": common, "write": true}, diag.GitMismatch, "workspace.git.gitdir"},
		{"linked worktree without its commondir", feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "write": true}, diag.GitMismatch, "workspace.git.commondir"},
		{"commondir the whole workspace root", feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": "/srv/paseo/repos", "write": true}, diag.GitMismatch, "workspace.git.commondir"},
		{"commondir another repository", feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": "/srv/paseo/repos/libsrc/.git", "write": true}, diag.GitMismatch, "workspace.git.commondir"},
		{"main worktree", "/srv/paseo/repos/proj", map[string]any{"gitdir": common, "write": true}, "", ""},
		{"main worktree with a commondir", "/srv/paseo/repos/proj", map[string]any{"gitdir": common, "commondir": common, "write": true}, diag.GitMismatch, "workspace.git.commondir"},
		{"main worktree naming a worktree's gitdir", "/srv/paseo/repos/proj", map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": true}, diag.GitMismatch, "workspace.git.gitdir"},
		{"submodule", "/srv/paseo/repos/proj/lib", map[string]any{"gitdir": common + "/modules/lib", "write": true}, "", ""},
		{"submodule with the superproject as commondir", "/srv/paseo/repos/proj/lib", map[string]any{"gitdir": common + "/modules/lib", "commondir": common, "write": true}, diag.GitMismatch, "workspace.git.commondir"},
		{"submodule naming the superproject's gitdir", "/srv/paseo/repos/proj/lib", map[string]any{"gitdir": common, "write": true}, diag.GitMismatch, "workspace.git.gitdir"},
		{"shared clone with its alternate", "/srv/paseo/repos/clone", map[string]any{"gitdir": "/srv/paseo/repos/clone/.git", "alternates": []string{common + "/objects"}, "write": true}, "", ""},
		{"shared clone without its alternate", "/srv/paseo/repos/clone", map[string]any{"gitdir": "/srv/paseo/repos/clone/.git", "write": true}, diag.GitMismatch, "workspace.git.alternates"},
		{"shared clone with another workspace as alternate", "/srv/paseo/repos/clone", map[string]any{"gitdir": "/srv/paseo/repos/clone/.git", "alternates": []string{common + "/objects", "/srv/paseo/workspace/proj-other"}, "write": true}, diag.GitMismatch, "workspace.git.alternates[1]"},
		{"an alternate the repository does not list", feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "alternates": []string{"/srv/paseo/repos/libsrc/.git/objects"}, "write": true}, diag.GitMismatch, "workspace.git.alternates[0]"},
		{"a directory that is no repository", "/srv/paseo/workspace/proj-other", map[string]any{"gitdir": "/srv/paseo/workspace", "write": true}, diag.GitMismatch, "workspace.git.gitdir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diags := s.compile(t, tc.cwd, tc.git)
			if tc.wantCode == "" {
				if len(diags) > 0 {
					t.Fatalf("refused: %v", diags)
				}
				return
			}
			if !slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == tc.wantCode && d.Path == tc.wantFact }) {
				t.Fatalf("want %s at %s, got %v", tc.wantCode, tc.wantFact, diags)
			}
		})
	}
}

// What the agent can write (its worktree's .git file, files in its own
// workspace) cannot point its next launch at another worktree's or another
// repository's metadata, even when the facts follow what it wrote.
func TestGitRewrittenPointersRefused(t *testing.T) {
	s := newGitScene(t)
	const feature = "/srv/paseo/workspace/proj-feature"
	write := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(s.path(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.path(p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sibling := "/srv/paseo/repos/proj/.git/worktrees/proj-other"
	write(feature+"/.git", "gitdir: "+s.path(sibling)+"\n")
	diags := s.compile(t, feature, map[string]any{"gitdir": sibling, "commondir": "/srv/paseo/repos/proj/.git", "write": true})
	if !slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == diag.GitMismatch && d.Path == "workspace.git.gitdir" }) {
		t.Errorf("a .git file redirected to the sibling's gitdir: want %s, got %v", diag.GitMismatch, diags)
	}

	// A gitdir of its own making, whose commondir is another repository.
	write(feature+"/.git", "gitdir: planted\n")
	write(feature+"/planted/HEAD", "ref: refs/heads/main\n")
	write(feature+"/planted/commondir", s.path("/srv/paseo/repos/libsrc/.git")+"\n")
	write(feature+"/planted/gitdir", s.path(feature+"/.git")+"\n")
	diags = s.compile(t, feature, map[string]any{"gitdir": feature + "/planted", "commondir": "/srv/paseo/repos/libsrc/.git", "write": true})
	if !slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == diag.GitMismatch && d.Path == "workspace.git.gitdir" }) {
		t.Errorf("a planted gitdir naming another repository: want %s, got %v", diag.GitMismatch, diags)
	}
}
