package compiler

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// hostGit runs git on the scene's host tree, as the daemon would.
func (s *gitScene) hostGit(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always"}, args...)...)
	cmd.Dir = s.path(dir)
	cmd.Env = []string{"GIT_CONFIG_NOSYSTEM=1", "HOME=" + s.host + "/home/git", "PATH=" + os.Getenv("PATH"), "LC_ALL=C"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func mountsOf(res *Result) []grant.Mount {
	var out []grant.Mount
	for _, g := range res.Manifest.Grants {
		if m, ok := g.(grant.Mount); ok {
			out = append(out, m)
		}
	}
	return out
}

func mountAt(ms []grant.Mount, dest string) *grant.Mount {
	for i := range ms {
		if ms[i].Destination == dest {
			return &ms[i]
		}
	}
	return nil
}

func writable(m grant.Mount) bool {
	return m.Type == "tmpfs" || (m.IsBind() && slices.Contains(m.Options, "rw"))
}

// checkRepoProtected asserts the three rules for one compiled layout: the
// repository's view is read-only as a whole, nothing bound inside it; the
// agent's store is bound read-write at gitStoreView with the repository's
// config and a generated HEAD read-only in it; the worktree's Git dir is a
// private tmpfs; no writable bind has a source inside a Git dir.
func checkRepoProtected(t *testing.T, s *gitScene, ms []grant.Mount, view, repo, gitdir string) {
	t.Helper()
	store := s.path("/srv/paseo/state/pi-git/agent-7f3c")
	seen := false
	for _, m := range ms {
		if !pathform.Beneath(view, m.Destination) || m.Destination == s.path(gitdir) {
			continue
		}
		if m.Destination != view || !m.IsBind() || !slices.Contains(m.Options, "ro") || m.Source != s.path(repo) {
			t.Errorf("inside the repository's view %s: %s %s %v (%s), want only the read-only view", view, m.Destination, m.Type, m.Options, m.Source)
		}
		seen = true
	}
	if !seen {
		t.Errorf("no read-only view of the repository at %s", view)
	}
	for rel, want := range map[string][2]string{"": {"rw", store}, "/config": {"ro", s.path(repo) + "/config"}, "/HEAD": {"ro", bundle.GitHeadFile}} {
		if m := mountAt(ms, gitStoreView+rel); m == nil || !m.IsBind() || !slices.Contains(m.Options, want[0]) || m.Source != want[1] {
			t.Errorf("the store's %q: %+v, want a %s bind of %s", rel, m, want[0], want[1])
		}
	}
	if m := mountAt(ms, s.path(gitdir)); m == nil || m.Type != "tmpfs" {
		t.Errorf("the worktree's Git dir %s is not a private tmpfs: %+v", gitdir, m)
	}
	for _, m := range ms {
		if m.IsBind() && writable(m) && strings.Contains(m.Source+"/", "/.git/") {
			t.Errorf("writable bind %s has its source %s inside a Git dir", m.Destination, m.Source)
		}
	}
}

// Real layouts (git worktree add, a submodule, a clone --shared, an empty
// template), compiled: each protected by the same three rules.
func TestGitControlDataProtected(t *testing.T) {
	s := newGitScene(t)
	const (
		feature = "/srv/paseo/workspace/proj-feature"
		proj    = "/srv/paseo/repos/proj"
		common  = proj + "/.git"
	)
	// The empty-template repository and its linked worktree: no hooks/,
	// no info/, as go-git and libgit2 make them.
	s.hostGit(t, "/srv/paseo/repos", "init", "-q", "--template=", "bare-tpl")
	s.hostGit(t, "/srv/paseo/repos/bare-tpl", "commit", "-q", "--allow-empty", "-m", "initial")
	s.hostGit(t, "/srv/paseo/repos/bare-tpl", "worktree", "add", "-q", "-b", "agent", s.path("/srv/paseo/workspace/tpl-agent"))
	if _, err := os.Stat(s.path("/srv/paseo/repos/bare-tpl/.git/hooks")); !os.IsNotExist(err) {
		t.Fatalf("the empty template made hooks/ (%v)", err)
	}

	for _, tc := range []struct {
		name, cwd          string
		git                map[string]any
		view, repo, gitdir string
		dotgitFile         bool
		submodule          string // where the host index has a gitlink, bound read-only
	}{
		{"linked worktree", feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": true},
			common, common, common + "/worktrees/proj-feature", true, feature + "/lib"},
		{"main worktree", proj, map[string]any{"gitdir": common, "write": true}, gitRepoView, common, common, false, proj + "/lib"},
		{"submodule", proj + "/lib", map[string]any{"gitdir": common + "/modules/lib", "write": true},
			gitRepoView, common + "/modules/lib", common + "/modules/lib", true, ""},
		{"shared clone", "/srv/paseo/repos/clone", map[string]any{"gitdir": "/srv/paseo/repos/clone/.git", "alternates": []string{common + "/objects"}, "write": true},
			gitRepoView, "/srv/paseo/repos/clone/.git", "/srv/paseo/repos/clone/.git", false, ""},
		{"empty-template linked worktree", "/srv/paseo/workspace/tpl-agent", map[string]any{"gitdir": "/srv/paseo/repos/bare-tpl/.git/worktrees/tpl-agent", "commondir": "/srv/paseo/repos/bare-tpl/.git", "write": true},
			"/srv/paseo/repos/bare-tpl/.git", "/srv/paseo/repos/bare-tpl/.git", "/srv/paseo/repos/bare-tpl/.git/worktrees/tpl-agent", true, ""},
		{"no Git facts, a repository in the cwd", proj, nil, gitRepoView, common, common, false, proj + "/lib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, diags := s.compileResult(t, tc.cwd, tc.git)
			if len(diags) > 0 {
				t.Fatalf("refused: %v", diags)
			}
			ms := mountsOf(res)
			view := tc.view
			if view != gitRepoView {
				view = s.path(view)
			}
			checkRepoProtected(t, s, ms, view, tc.repo, tc.gitdir)
			if m := mountAt(ms, s.path(tc.cwd)+"/.git"); tc.dotgitFile && (m == nil || !m.IsBind() || !slices.Contains(m.Options, "ro")) {
				t.Errorf("the .git pointer is not a read-only mount point: %+v", m)
			}
			if tc.submodule != "" {
				if m := mountAt(ms, s.path(tc.submodule)); m == nil || !slices.Contains(m.Options, "ro") || m.Source != s.path(tc.submodule) {
					t.Errorf("the submodule %s is not bound read-only to itself: %+v", tc.submodule, m)
				}
			}
		})
	}

	// From a subdirectory of the worktree the cwd has no .git of its own:
	// an empty read-only one, so the agent cannot make the repository the
	// daemon's git would find first.
	t.Run("from a subdirectory", func(t *testing.T) {
		if err := os.MkdirAll(s.path(feature+"/sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		res, diags := s.compileResult(t, feature+"/sub", map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": true})
		if len(diags) > 0 {
			t.Fatalf("refused: %v", diags)
		}
		ms := mountsOf(res)
		if m := mountAt(ms, s.path(feature+"/sub/.git")); m == nil || m.Type != "tmpfs" || !slices.Contains(m.Options, "ro") {
			t.Errorf("no read-only placeholder at the cwd's .git: %+v", m)
		}
		checkRepoProtected(t, s, ms, s.path(common), common, common+"/worktrees/proj-feature")
		// The placeholder runsc leaves on the host (an empty directory)
		// is passed over next time, as Git passes over it.
		if err := os.Mkdir(s.path(feature+"/sub/.git"), 0o555); err != nil {
			t.Fatal(err)
		}
		if _, diags := s.compileResult(t, feature+"/sub", map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": true}); len(diags) > 0 {
			t.Fatalf("refused with the placeholder left: %v", diags)
		}
	})

	// A linked worktree without Git facts: its Git dirs stay out of the
	// sandbox, and what host git follows from the cwd is pinned.
	t.Run("no Git facts, a linked worktree", func(t *testing.T) {
		res, diags := s.compileResult(t, feature, nil)
		if len(diags) > 0 {
			t.Fatalf("refused: %v", diags)
		}
		ms := mountsOf(res)
		for _, m := range ms {
			if strings.Contains(m.Source+"/", "/repos/proj/.git/") || (strings.HasPrefix(m.Destination, "/run/paseo") && m.Destination != bundle.FSMonitorHookPath && m.Destination != bundle.FSMonitorIndexPath) {
				t.Errorf("a Git dir the facts do not grant is mounted: %s <- %s", m.Destination, m.Source)
			}
		}
		for _, p := range []string{feature + "/.git", feature + "/lib"} {
			if m := mountAt(ms, s.path(p)); m == nil || !slices.Contains(m.Options, "ro") {
				t.Errorf("%s not pinned read-only: %+v", p, m)
			}
		}
	})

	// Read-only Git facts: nothing of the repository is writable, and the
	// pointer and submodule are pinned all the same.
	t.Run("read-only facts", func(t *testing.T) {
		res, diags := s.compileResult(t, feature, map[string]any{"gitdir": common + "/worktrees/proj-feature", "commondir": common, "write": false})
		if len(diags) > 0 {
			t.Fatalf("refused: %v", diags)
		}
		ms := mountsOf(res)
		for _, m := range ms {
			if writable(m) && strings.Contains(m.Destination+"/", "/.git/") {
				t.Errorf("writable %s under read-only Git facts", m.Destination)
			}
		}
		for _, p := range []string{feature + "/.git", feature + "/lib"} {
			if m := mountAt(ms, s.path(p)); m == nil || !slices.Contains(m.Options, "ro") {
				t.Errorf("%s not pinned read-only: %+v", p, m)
			}
		}
	})
}

// A submodule nested in directories gets each of them bound to itself, so
// none can be renamed away with the submodule's pin and remade.
func TestGitSubmoduleAncestorsPinned(t *testing.T) {
	s := newGitScene(t)
	const proj = "/srv/paseo/repos/proj"
	s.hostGit(t, proj, "submodule", "--quiet", "add", "../libsrc", "third_party/vendor/lib2")
	res, diags := s.compileResult(t, proj, map[string]any{"gitdir": proj + "/.git", "write": true})
	if len(diags) > 0 {
		t.Fatalf("refused: %v", diags)
	}
	ms := mountsOf(res)
	for p, a := range map[string]string{"/third_party": "rw", "/third_party/vendor": "rw", "/third_party/vendor/lib2": "ro"} {
		if m := mountAt(ms, s.path(proj+p)); m == nil || !slices.Contains(m.Options, a) || m.Source != s.path(proj+p) {
			t.Errorf("%s: %+v, want a %s bind of itself", p, m, a)
		}
	}
}

// What cannot be pinned is refused with its own code: a gitlink whose
// path the worktree lacks (a mount point there would be made on the host)
// and an index the compiler cannot read whole (a split index).
func TestGitUnpinnableRefused(t *testing.T) {
	s := newGitScene(t)
	const feature = "/srv/paseo/workspace/proj-feature"
	// compileResult makes the map's paths absolute in place: a fresh one each time.
	facts := func() map[string]any {
		return map[string]any{"gitdir": "/srv/paseo/repos/proj/.git/worktrees/proj-feature", "commondir": "/srv/paseo/repos/proj/.git", "write": true}
	}
	if err := os.Remove(s.path(feature + "/lib")); err != nil {
		t.Fatal(err)
	}
	_, diags := s.compileResult(t, feature, facts())
	if !slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == diag.GitSubmodule && d.Path == "workspace.cwd/lib" }) {
		t.Errorf("missing gitlink path: want %s at workspace.cwd/lib, got %v", diag.GitSubmodule, diags)
	}
	if err := os.Mkdir(s.path(feature+"/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.hostGit(t, feature, "update-index", "--split-index")
	if _, err := os.Stat(filepath.Join(s.path("/srv/paseo/repos/proj/.git/worktrees/proj-feature"), "index")); err != nil {
		t.Fatal(err)
	}
	_, diags = s.compileResult(t, feature, facts())
	if !slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == diag.GitIndex }) {
		t.Errorf("split index: want %s, got %v", diag.GitIndex, diags)
	}
}
