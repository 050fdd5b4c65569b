package gitplant

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Plot is what a plant works on: the layout and the agent's own worktree,
// its Git dir and the common dir, all writable from its sandbox.
type Plot struct {
	Lab    *Lab
	Repo   *Repo
	WT     string // the agent's worktree
	GitDir string
	Common string
}

// Payload writes an executable script in the agent's worktree, under
// .plant/<role>, that leaves the marker <role> when run: the marker says
// which of Git's mechanisms ran it (a hook's name, fsmonitor, gpg).
func (p Plot) Payload(t testing.TB, role string) string {
	t.Helper()
	path := filepath.Join(p.WT, ".plant", role)
	writeExec(t, path, p.script())
	return path
}

func (p Plot) script() string {
	return fmt.Sprintf("#!/bin/sh\ntouch %q/\"$(basename \"$0\")\"\n", p.Lab.Markers)
}

// Config is config text that names a payload in every key of the config
// the daemon's commands might run: core.fsmonitor (status and diff read the
// index), gpg.program (log checks a signed commit), the hooks under
// core.hooksPath, diff.external, core.alternateRefsCommand and
// uploadpack.packObjectsHook (a fetch from the repository), core.pager. The
// markers then say which of them each command ran.
func (p Plot) Config(t testing.TB) string {
	t.Helper()
	hooks := filepath.Join(p.WT, ".plant", "hooks")
	p.AllHooks(t, hooks)
	return fmt.Sprintf("[core]\n\tfsmonitor = %s\n\thooksPath = %s\n\talternateRefsCommand = %s\n\tpager = %s\n"+
		"[log]\n\tshowSignature = true\n[gpg]\n\tprogram = %s\n[diff]\n\texternal = %s\n[uploadpack]\n\tpackObjectsHook = %s\n",
		p.Payload(t, "fsmonitor"), hooks, p.Payload(t, "alternate-refs"), p.Payload(t, "pager"),
		p.Payload(t, "gpg"), p.Payload(t, "diff-external"), p.Payload(t, "pack-objects-hook"))
}

// FakeRepo makes a Git dir at dir with the payload config and ref (what
// HEAD will name there) at a signed commit: as a common dir it needs only
// objects/ and refs/, as a gitdir also HEAD.
func (p Plot) FakeRepo(t testing.TB, dir, ref string) {
	t.Helper()
	mkdirAll(t, filepath.Join(dir, "refs", "heads"))
	writeFile(t, filepath.Join(dir, "HEAD"), "ref: "+ref+"\n")
	writeFile(t, filepath.Join(dir, "config"), "[core]\n\trepositoryformatversion = 0\n"+p.Config(t))
	writeFile(t, filepath.Join(dir, ref), signedCommit(t, filepath.Join(dir, "objects"), "planted")+"\n")
}

// SignHead moves the real branch of the Git dir gitdir to a signed commit
// stored in the real object store, so that log reaches gpg.program.
func (p Plot) SignHead(t testing.TB, gitdir string) {
	t.Helper()
	moveHead(t, gitdir, p.Common, signedCommit(t, filepath.Join(p.Common, "objects"), "planted"))
}

// FakeCommon makes a fake common dir for the Git dir gitdir in the agent's
// worktree and returns it; gitdir's HEAD branch is found there.
func (p Plot) FakeCommon(t testing.TB, gitdir string) string {
	t.Helper()
	fake := filepath.Join(p.WT, ".plant", "common")
	p.FakeRepo(t, fake, headRef(t, gitdir))
	return fake
}

// hooks are the hook names of githooks(5) in git 2.39.
var hooks = []string{
	"applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
	"prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
	"pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update",
	"reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate",
	"fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist", "p4-post-changelist",
	"p4-pre-submit", "post-index-change",
}

// AllHooks installs the payload under every hook name in dir, so the
// marker names the hook Git ran.
func (p Plot) AllHooks(t testing.TB, dir string) {
	t.Helper()
	for _, h := range hooks {
		writeExec(t, filepath.Join(dir, h), p.script())
	}
}

// Paths is a Plot as plain paths, for a planter in another process: the
// host topology shows the host's paths at the same paths in a sandbox.
type Paths struct {
	Lab, Home, Markers string
	Root, Main, Common string
	WT, GitDir         string
}

// Paths is the plot's paths.
func (p Plot) Paths() Paths {
	return Paths{Lab: p.Lab.Dir, Home: p.Lab.Home, Markers: p.Lab.Markers,
		Root: p.Repo.Root, Main: p.Repo.Main, Common: p.Repo.Common, WT: p.WT, GitDir: p.GitDir}
}

// Plot is the plot these paths describe.
func (ps Paths) Plot() Plot {
	return Plot{Lab: &Lab{Dir: ps.Lab, Home: ps.Home, Markers: ps.Markers},
		Repo: &Repo{Root: ps.Root, Main: ps.Main, Common: ps.Common},
		WT:   ps.WT, GitDir: ps.GitDir, Common: ps.Common}
}

// SurfaceNamed is the catalogue's surface of that name.
func SurfaceNamed(name string) (Surface, bool) {
	for _, s := range Surfaces {
		if s.Name == name {
			return s, true
		}
	}
	return Surface{}, false
}

// AsGitFinds is the plot with the common dir where Git finds it from the
// Git dir (its commondir file), when that is not where the plot has it: a
// sandbox may show a main worktree's repository at a path of its own, and
// an agent plants where its Git says the repository is.
func (p Plot) AsGitFinds() (Plot, bool) {
	b, err := os.ReadFile(filepath.Join(p.GitDir, "commondir"))
	if err != nil {
		return p, false
	}
	c := strings.TrimRight(string(b), "\n")
	if !filepath.IsAbs(c) {
		c = filepath.Join(p.GitDir, c)
	}
	if c = filepath.Clean(c); c == filepath.Clean(p.Common) {
		return p, false
	}
	r := *p.Repo
	r.Common = c
	p.Repo, p.Common = &r, c
	return p, true
}

// AtGitDir is the plot with the worktree's Git dir at dir and, for a main
// worktree (whose Git dir is the repository), the common dir too.
func (p Plot) AtGitDir(dir string) Plot {
	if filepath.Clean(p.GitDir) == filepath.Clean(p.Common) {
		r := *p.Repo
		r.Common = dir
		p.Repo, p.Common = &r, dir
	}
	p.GitDir = dir
	return p
}
