package compiler

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
)

// The facts' Git metadata is granted read-write, so it is checked against
// the repository the cwd actually uses, the way Git itself finds it: the
// cwd's .git (a directory: the main worktree; a file "gitdir: <path>": a
// linked worktree or a submodule) must lead to workspace.git.gitdir; the
// gitdir's commondir file to workspace.git.commondir (none for a main
// worktree or a submodule); objects/info/alternates of the repository to
// exactly workspace.git.alternates. Without this any directory beneath a
// workspace root (another repository, a sibling worktree's metadata, the
// whole root) could be named and granted. Every file is read beneath its
// registered root without following links (pathsafe.ReadSmall), and paths
// are compared by the identity (dev, inode) they resolve to.

// gitFileBytes bounds .git and commondir files (one path each) and
// gitAlternatesBytes the alternates list.
const (
	gitFileBytes       = 4096
	gitAlternatesBytes = 64 << 10
)

// verifyGit runs only when every Git fact resolved (a refused one already
// names its fact) and reports whether the facts match the repository, with
// the .git that led to it.
func (c *compilation) verifyGit(gitdir source, common *source, alts []source) (dotGit, bool) {
	before := len(*c.diags)
	dotgit := c.checkGitLayout(gitdir, common, alts)
	return dotgit, len(*c.diags) == before
}

// checkGitLayout returns the .git the cwd uses, found or not; its
// refusals say whether the facts match it.
func (c *compilation) checkGitLayout(gitdir source, common *source, alts []source) dotGit {
	dotgit, ok := c.findDotGit()
	if !ok {
		return dotGit{}
	}
	target, from := dotgit.path, "the cwd's .git directory (a main worktree)"
	if !dotgit.dir {
		var err error
		if target, err = c.readGitPointer(dotgit.path, "gitdir: "); err != nil {
			c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "the cwd's .git file %s: %v", dotgit.path, err)
			return dotgit
		}
		from = "the cwd's .git file " + dotgit.path
	}
	if !c.sameObject("workspace.git.gitdir", gitdir, target, from) {
		return dotgit
	}
	if !c.looksLike("workspace.git.gitdir", gitdir.dest, gitEntry{"HEAD", pathsafe.File}) {
		return dotgit
	}

	repo := gitdir
	commondirFile := gitdir.dest + "/commondir"
	switch has := c.gitExists(commondirFile); {
	case has && common == nil:
		c.diags.Addf(diag.GitMismatch, "workspace.git.commondir", "the gitdir has a commondir file (a linked worktree) but the facts name no common dir")
		return dotgit
	case !has && common != nil:
		c.diags.Addf(diag.GitMismatch, "workspace.git.commondir", "the gitdir has no commondir file (a main worktree or a submodule), so it has no common dir apart from itself")
		return dotgit
	case has:
		target, err := c.readGitPointer(commondirFile, "")
		if err != nil {
			c.diags.Addf(diag.GitMismatch, "workspace.git.commondir", "%s: %v", commondirFile, err)
			return dotgit
		}
		if !c.sameObject("workspace.git.commondir", *common, target, commondirFile) || !c.linkedWorktree(dotgit, gitdir, *common) {
			return dotgit
		}
		repo = *common
	}
	repoFact := "workspace.git.gitdir"
	if common != nil {
		repoFact = "workspace.git.commondir"
	}
	if !c.looksLike(repoFact, repo.dest, gitEntry{"HEAD", pathsafe.File}, gitEntry{"objects", pathsafe.Dir}, gitEntry{"refs", pathsafe.Dir}) {
		return dotgit
	}
	c.verifyAlternates(repo.dest+"/objects", alts)
	return dotgit
}

type dotGit struct {
	path string // fact space
	dir  bool
	id   pathsafe.Identity
}

// linkedWorktree checks what ties a linked worktree's gitdir to its
// repository and to its worktree, beyond the pointers the worktree itself
// holds: the .git file and the commondir file lie in the worktree and the
// gitdir, both writable by the agent, so on their own they would let it
// point its next launch at a directory it made, whose commondir names
// another repository. Git keeps a linked worktree's gitdir at
// <commondir>/worktrees/<name>, which only the repository's own sandboxes
// can write, and <gitdir>/gitdir names the worktree's .git file back.
func (c *compilation) linkedWorktree(dotgit dotGit, gitdir, common source) bool {
	inRepo := common.dest + "/worktrees/" + path.Base(gitdir.dest)
	if id, err := c.gitResolve(inRepo); err != nil || id.Dev != gitdir.id.Dev || id.Ino != gitdir.id.Ino {
		c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "a linked worktree's gitdir must be %s/worktrees/<name> of its common dir", common.dest)
		return false
	}
	if dotgit.dir {
		return true
	}
	back := gitdir.dest + "/gitdir"
	target, err := c.readGitPointer(back, "")
	if err != nil {
		c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "%s (which names the worktree's .git file): %v", back, err)
		return false
	}
	if id, err := c.gitResolve(target); err != nil || id.Dev != dotgit.id.Dev || id.Ino != dotgit.id.Ino {
		c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "%s names %s, not the cwd's .git file %s: the gitdir belongs to another worktree", back, target, dotgit.path)
		return false
	}
	return true
}

// findDotGit walks from the cwd up to its workspace root, as Git's discovery
// does, and returns the first .git it meets.
func (c *compilation) findDotGit() (dotGit, bool) {
	for d := c.facts.Workspace.Cwd; ; d = path.Dir(d) {
		p := d + "/.git"
		if d == "/" {
			p = "/.git"
		}
		id, err := c.gitResolve(p)
		var pe *pathsafe.Error
		switch {
		case errors.As(err, &pe) && pe.Code == diag.PathMissing:
		case errors.As(err, &pe) && pe.Code == diag.PathOutsideRoot:
			c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "the facts name Git metadata, but the cwd and its parents beneath the workspace root hold no .git")
			return dotGit{}, false
		case err != nil:
			c.src.addResolveError("workspace.cwd/.git", err)
			return dotGit{}, false
		case id.Kind == pathsafe.Dir && c.isPlaceholder(p):
			// Passed over, as Git does: the empty .git a sandbox's
			// placeholder left (gitprotect.go dotGitPlaceholder).
		case id.Kind == pathsafe.Dir || id.Kind == pathsafe.File:
			return dotGit{path: p, dir: id.Kind == pathsafe.Dir, id: id}, true
		default:
			c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "%s is neither a directory nor a file", p)
			return dotGit{}, false
		}
		if d == "/" {
			c.diags.Addf(diag.GitMismatch, "workspace.git.gitdir", "the facts name Git metadata, but the cwd and its parents hold no .git")
			return dotGit{}, false
		}
	}
}

// gitResolve resolves a fact-space path beneath the workspace root that
// holds it, reporting nothing: the caller decides what a failure means.
func (c *compilation) gitResolve(p string) (pathsafe.Identity, error) {
	if code, msg := pathform.Check(p); code != "" {
		return pathsafe.Identity{}, &pathsafe.Error{Code: code, Msg: msg}
	}
	host, ok := c.src.hostPathQuiet(p)
	root := rootOf(c.dep.Roots.Workspace, host)
	if !ok || root == "" {
		return pathsafe.Identity{}, &pathsafe.Error{Code: diag.PathOutsideRoot, Msg: "not beneath any workspace root of the deployment"}
	}
	return c.res.Resolve(root, host)
}

func (c *compilation) gitExists(p string) bool {
	_, err := c.gitResolve(p)
	var pe *pathsafe.Error
	return !(errors.As(err, &pe) && pe.Code == diag.PathMissing)
}

// gitRead reads a small file beneath its workspace root.
func (c *compilation) gitRead(p string, max int) ([]byte, error) {
	host, ok := c.src.hostPathQuiet(p)
	root := rootOf(c.dep.Roots.Workspace, host)
	if !ok || root == "" {
		return nil, errors.New("not beneath any workspace root of the deployment")
	}
	return c.res.ReadSmall(root, host, max)
}

// readGitPointer reads a one-line file naming a path (a .git file after its
// "gitdir: " prefix, a commondir file), relative to the file's directory or
// absolute, and returns it as a canonical absolute path.
func (c *compilation) readGitPointer(file, prefix string) (string, error) {
	data, err := c.gitRead(file, gitFileBytes)
	if err != nil {
		return "", err
	}
	line := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if strings.ContainsAny(line, "\n\r") {
		return "", errors.New("holds more than one line")
	}
	target, ok := strings.CutPrefix(line, prefix)
	if !ok || target == "" {
		return "", fmt.Errorf("does not start with %q and a path", prefix)
	}
	return gitJoin(path.Dir(file), target)
}

// gitJoin makes a path Git wrote absolute against dir and checks its form.
func gitJoin(dir, p string) (string, error) {
	if !path.IsAbs(p) {
		p = path.Join(dir, p)
	}
	if code, msg := pathform.Check(p); code != "" {
		return "", fmt.Errorf("names %q, which is refused: %s (%s)", p, msg, code)
	}
	return p, nil
}

// sameObject reports whether target resolves to the object the fact granted.
func (c *compilation) sameObject(fact string, granted source, target, from string) bool {
	id, err := c.gitResolve(target)
	switch {
	case err != nil:
		c.diags.Addf(diag.GitMismatch, fact, "%s leads to %s (%v), not to %s", from, target, err, granted.dest)
		return false
	case id.Dev != granted.id.Dev || id.Ino != granted.id.Ino:
		c.diags.Addf(diag.GitMismatch, fact, "%s leads to %s, not to %s", from, target, granted.dest)
		return false
	}
	return true
}

type gitEntry struct {
	name string
	kind pathsafe.Kind
}

// looksLike refuses a Git fact whose directory lacks what Git keeps there.
func (c *compilation) looksLike(fact, dir string, want ...gitEntry) bool {
	for _, w := range want {
		id, err := c.gitResolve(dir + "/" + w.name)
		if err != nil || id.Kind != w.kind {
			c.diags.Addf(diag.GitNotRepo, fact, "%s does not look like a Git directory: no %s %s", dir, w.kind, w.name)
			return false
		}
	}
	return true
}

// verifyAlternates compares the repository's alternates file with the
// facts' alternates, both ways, by identity.
func (c *compilation) verifyAlternates(objects string, alts []source) {
	file := objects + "/info/alternates"
	var listed []string
	if c.gitExists(file) {
		data, err := c.gitRead(file, gitAlternatesBytes)
		if err != nil {
			c.diags.Addf(diag.GitMismatch, "workspace.git.alternates", "%s: %v", file, err)
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSuffix(line, "\r")
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if strings.HasPrefix(line, `"`) {
				c.diags.Addf(diag.GitMismatch, "workspace.git.alternates", "%s lists a quoted path; only plain paths are accepted", file)
				return
			}
			p, err := gitJoin(objects, line)
			if err != nil {
				c.diags.Addf(diag.GitMismatch, "workspace.git.alternates", "%s: %v", file, err)
				return
			}
			listed = append(listed, p)
		}
	}
	matched := make([]bool, len(listed))
	for i, a := range alts {
		fact := fmt.Sprintf("workspace.git.alternates[%d]", i)
		found := false
		for j, l := range listed {
			if id, err := c.gitResolve(l); err == nil && id.Dev == a.id.Dev && id.Ino == a.id.Ino {
				matched[j], found = true, true
			}
		}
		if !found {
			c.diags.Addf(diag.GitMismatch, fact, "%s is not listed in %s", a.dest, file)
			continue
		}
		c.looksLike(fact, a.dest, gitEntry{"pack", pathsafe.Dir})
	}
	for j, l := range listed {
		if !matched[j] {
			c.diags.Addf(diag.GitMismatch, "workspace.git.alternates", "%s lists %s, which the facts omit; Git in the sandbox would miss its objects", file, l)
		}
	}
}
