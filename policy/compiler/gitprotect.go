package compiler

import (
	"path"
	"slices"
	"strconv"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler/gitindex"
	"paseo.dev/paseo-policy/policy/grant"
)

// Git control data and host git (docs/spec.md, issue 19)
//
// The daemon runs git on the host in every workspace (status, diff, log),
// and what that git executes is decided by files in the worktree's Git
// dir, in the repository's common dir and in the worktree itself: config
// and hooks, commondir and .git pointers that lead to another Git dir,
// config.worktree, a sibling's worktrees/<name>/, a submodule's gitdir and
// .git file, and the index, whose gitlinks are where git recurses. The
// sandbox must be unable to write or create any of them, while its own
// git keeps committing. So:
//
//  1. The repository (the common dir, or the Git dir of a main worktree or
//     submodule) is bound read-only as a whole: nothing in it can be
//     written, created or renamed. Only its content-addressed and data
//     parts are bound read-write inside: objects/ (with objects/info/
//     read-only again, so no alternates), refs/ and logs/. Each is a
//     mount point, which cannot be renamed or replaced (runsc: EBUSY).
//  2. The worktree's own state is private: the Git dir the worktree's .git
//     leads to is a tmpfs of this sandbox at the same path, which the
//     profile's start script seeds from the real one (bound read-only at
//     gitSeed): HEAD, index, commondir, gitdir. A main worktree's private
//     Git dir gets a commondir file naming the repository's view at
//     gitRepoView. Git in the sandbox then stages, commits, switches and
//     stashes against its own HEAD and index; the host's are never written.
//  3. Every path host git follows from the worktree is pinned: the .git
//     pointer is a read-only mount point, each submodule the host index
//     lists (a gitlink) is bound read-only where the worktree has it, and
//     every directory between it and the cwd is bound to itself, because a
//     mount point's parent can be renamed and the mount moves with it.
//     A gitlink whose path the worktree lacks is refused: runsc would
//     create the mount point on the host.

const (
	// gitSeed shows the worktree's real Git dir read-only, for the start
	// script to copy from: its own path holds the private tmpfs.
	gitSeed = "/run/paseo/git-seed"
	// gitRepoView shows a main worktree's (or a submodule's) repository,
	// whose own path holds the private tmpfs.
	gitRepoView = "/run/paseo/repo"
	// gitIndexBytes bounds the host index the compiler reads for gitlinks.
	gitIndexBytes = 256 << 20
)

// gitLayout is the repository the cwd uses, as the compile found it.
type gitLayout struct {
	gitdir   source // the worktree's own Git dir: HEAD, index
	repo     source // config, objects, refs: the common dir, or gitdir itself
	linked   bool   // gitdir has a common dir apart from itself
	worktree string // fact space: the directory holding .git
	dotgit   dotGit
	write    bool
	// pinOnly: the facts grant no Git dir (a .git file in the cwd with no
	// Git facts); only what host git follows from the cwd is pinned.
	pinOnly bool
	// fact names repo in provenance: workspace.git.commondir and so on.
	fact string
}

// gitBinds grants the repository the cwd uses under the three rules above.
// Nothing is added when a Git fact was refused: that refusal names it.
func (c *compilation) gitBinds(granted []grant.Mount) []grant.Mount {
	if !slices.ContainsFunc(granted, func(g grant.Mount) bool { return g.Fact == "workspace.cwd" }) {
		return nil
	}
	var out []grant.Mount
	if m, ok := c.dotGitPlaceholder(); ok {
		out = append(out, m)
	}
	l, ok := c.gitLayoutOf()
	if !ok {
		return out
	}
	switch {
	case l.pinOnly:
	case l.write:
		out = append(out, c.repoView(l)...)
	default:
		out = append(out, bind(l.gitdir.dest, l.gitdir.host, grant.RO, "the worktree's Git dir, read-only: facts grant Git inspection only", l.gitdir.fact))
		if l.linked {
			out = append(out, bind(l.repo.dest, l.repo.host, grant.RO, "the repository's common Git dir, read-only: facts grant Git inspection only", l.repo.fact))
		}
	}
	out = append(out, c.pinDotGit(l)...)
	out = append(out, c.pinSubmodules(l)...)
	return out
}

// gitLayoutOf finds the repository from the verified facts, or with no Git
// facts from a .git in the cwd itself (a repository the workspace holds).
func (c *compilation) gitLayoutOf() (gitLayout, bool) {
	f := c.facts
	if g := f.Workspace.Git; g != nil {
		if c.gitRefused || c.git == nil {
			return gitLayout{}, false
		}
		return *c.git, true
	}
	roots := c.dep.Roots.Workspace
	if code, _ := pathform.Check(f.Workspace.Cwd); code != "" {
		return gitLayout{}, false
	}
	p := f.Workspace.Cwd + "/.git"
	if !c.src.exists(p, "workspace", roots) || c.isPlaceholder(p) {
		return gitLayout{}, false
	}
	id, err := c.gitResolve(p)
	if err != nil {
		c.src.addResolveError("workspace.cwd/.git", err)
		return gitLayout{}, false
	}
	dg := dotGit{path: p, dir: id.Kind == pathsafe.Dir, id: id}
	if !dg.dir {
		if id.Kind != pathsafe.File {
			c.diags.Addf(diag.GitMismatch, "workspace.cwd/.git", "is neither a directory nor a file")
			return gitLayout{}, false
		}
		// A linked worktree or submodule whose Git dir the facts do not
		// grant: the sandbox cannot use it, but host git follows the
		// pointer, so it is pinned, with the submodules its index lists.
		target, err := c.readGitPointer(p, "gitdir: ")
		if err != nil {
			c.diags.Addf(diag.GitMismatch, "workspace.cwd/.git", "the cwd's .git file: %v", err)
			return gitLayout{}, false
		}
		s, ok := c.src.resolve("workspace.cwd/.git (gitdir)", target, "workspace", roots, pathsafe.Dir)
		if !ok {
			return gitLayout{}, false
		}
		return gitLayout{gitdir: s, worktree: f.Workspace.Cwd, dotgit: dg, fact: "workspace.cwd/.git", pinOnly: true}, true
	}
	s, ok := c.src.resolve("workspace.cwd/.git", p, "workspace", roots, pathsafe.Dir)
	if !ok || !c.looksLike("workspace.cwd/.git", p, gitEntry{"HEAD", pathsafe.File}, gitEntry{"objects", pathsafe.Dir}, gitEntry{"refs", pathsafe.Dir}) {
		return gitLayout{}, false
	}
	if c.src.exists(p+"/commondir", "workspace", roots) {
		c.diags.Addf(diag.GitMismatch, "workspace.cwd/.git", "the cwd's .git directory has a commondir file; name the repository in workspace.git")
		return gitLayout{}, false
	}
	return gitLayout{gitdir: s, repo: s, worktree: f.Workspace.Cwd, dotgit: dg, write: true, fact: "workspace.cwd/.git"}, true
}

// dotGitPlaceholder covers a cwd without a .git of its own (a workspace
// that is no repository, or a subdirectory of a worktree) with an empty,
// read-only tmpfs at <cwd>/.git. Otherwise the agent could make one, with a
// config naming its payload, and the daemon's next git in the cwd would
// find it before any repository above. runsc makes the mount point on the
// host, an empty directory of root's, which Git passes over as it passes
// over any .git without HEAD (and so does the compiler: isPlaceholder).
func (c *compilation) dotGitPlaceholder() (grant.Mount, bool) {
	cwd := c.facts.Workspace.Cwd
	if code, _ := pathform.Check(cwd); code != "" {
		return grant.Mount{}, false
	}
	p := cwd + "/.git"
	if c.src.exists(p, "workspace", c.dep.Roots.Workspace) && !c.isPlaceholder(p) {
		return grant.Mount{}, false
	}
	// The sandbox user's, so that read-only is what refuses its writes.
	uid, gid := c.ownerOptions()
	return grant.Mount{Destination: p, Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "nodev", "noexec", "mode=0755", uid, gid, "size=4096"},
		Provenance: why("an empty .git the sandbox cannot write: a .git made here would be the repository the daemon's git finds in the cwd", "workspace.cwd")}, true
}

// isPlaceholder reports a .git directory without HEAD: not a Git dir to
// Git's discovery, which goes on to the parent (setup.c is_git_directory).
func (c *compilation) isPlaceholder(p string) bool {
	id, err := c.gitResolve(p)
	return err == nil && id.Kind == pathsafe.Dir && !c.gitExists(p+"/HEAD")
}

// repoView binds the repository read-only with its data read-write
// inside (rule 1) and makes the worktree's Git dir private (rule 2).
func (c *compilation) repoView(l gitLayout) []grant.Mount {
	roots := c.dep.Roots.Workspace
	view := l.repo.dest
	if !l.linked {
		view = gitRepoView
	}
	out := []grant.Mount{bind(view, l.repo.host, grant.RO,
		"the repository, read-only as a whole: its config, hooks, info, commondir, worktrees/ and modules/ are what host git runs and follows, so the sandbox can neither change nor create them", l.fact)}
	for _, d := range []struct {
		name     string
		a        grant.Access
		optional bool
		why      string
	}{
		{"objects", grant.RW, false, "the repository's objects, read-write: content-addressed, so an agent's commits reach the repository and nothing in them runs"},
		{"objects/info", grant.RO, false, "read-only again inside objects: an alternates file here would make Git read another object store"},
		{"refs", grant.RW, false, "the repository's refs, read-write: data Git never runs (branches, tags, the stash)"},
		// A repository that never logged a ref update has no logs/; a
		// mount point cannot be made in the read-only repository, so
		// Git in the sandbox then fails to update refs (closed, not open).
		{"logs", grant.RW, true, "the repository's reflogs, read-write: data Git never runs, written with every ref update"},
	} {
		p := l.repo.dest + "/" + d.name
		if d.optional && !c.src.exists(p, "workspace", roots) {
			continue
		}
		s, ok := c.src.resolve(l.fact+"/"+d.name, p, "workspace", roots, pathsafe.Dir)
		if !ok {
			continue
		}
		out = append(out, bind(view+"/"+d.name, s.host, d.a, d.why, s.fact))
	}
	uid, gid := c.ownerOptions()
	out = append(out, grant.Mount{Destination: l.gitdir.dest, Type: "tmpfs", Source: "tmpfs",
		Options:    []string{"nosuid", "nodev", "noexec", "mode=0755", uid, gid, "size=" + strconv.FormatInt(c.limits.TmpfsBytes, 10)},
		Provenance: why("the worktree's Git dir, private to this sandbox and seeded by the start script: the agent's HEAD, index and per-worktree state never reach the host's, which host git reads", l.gitdir.fact)})
	// The seed is the real Git dir, apart from the view: a main
	// worktree's view shows the generated HEAD below, not the real one.
	out = append(out, bind(gitSeed, l.gitdir.host, grant.RO, "the worktree's real Git dir, read-only: what the start script copies into the private one", l.gitdir.fact))
	if l.linked {
		// A linked worktree's submodules keep their Git dirs in its own
		// Git dir, which the tmpfs covers.
		if p := l.gitdir.dest + "/modules"; c.src.exists(p, "workspace", roots) {
			if s, ok := c.src.resolve(l.gitdir.fact+"/modules", p, "workspace", roots, pathsafe.Dir); ok {
				out = append(out, bind(p, s.host, grant.RO, "the worktree's submodule Git dirs, read-only: their config and hooks are what host git runs in them", s.fact))
			}
		}
	} else {
		out = append(out, grant.Mount{Destination: gitRepoView + "/HEAD", Type: "bind", Source: bundle.GitHeadFile, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
			Provenance: why("generated: the repository's view is the sandbox's commondir, whose HEAD Git takes for another worktree's; one naming no branch leaves the agent's own branch free to check out", l.fact)})
	}
	c.gitEnv = []grant.Env{
		{Name: "PASEO_GIT_DIR", Value: l.gitdir.dest, Provenance: why("the private Git dir the start script seeds", l.gitdir.fact)},
		{Name: "PASEO_GIT_SEED", Value: gitSeed, Provenance: why("the real Git dir, read-only, that the start script seeds from", l.gitdir.fact)},
	}
	if !l.linked {
		c.gitEnv = append(c.gitEnv, grant.Env{Name: "PASEO_GIT_COMMONDIR", Value: gitRepoView,
			Provenance: why("the commondir the start script writes in the private Git dir: the repository's read-only view", l.fact)})
	}
	return out
}

// pinDotGit makes the cwd's .git pointer file a read-only mount point. A
// .git directory is the private tmpfs (or the read-only Git dir) already.
func (c *compilation) pinDotGit(l gitLayout) []grant.Mount {
	if l.dotgit.dir || path.Dir(l.dotgit.path) != c.facts.Workspace.Cwd {
		return nil
	}
	s, ok := c.src.resolve("workspace.cwd/.git", l.dotgit.path, "workspace", c.dep.Roots.Workspace, pathsafe.File)
	if !ok {
		return nil
	}
	return []grant.Mount{{Destination: s.dest, Type: "bind", Source: s.host, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		Provenance: why("the worktree's .git pointer, read-only: host git follows it to the Git dir whose config it runs", s.fact)}}
}

// pinSubmodules binds, for every gitlink of the host index beneath the
// cwd, its directory read-only and each directory between it and the cwd
// to itself. Host git status recurses into a submodule through
// <path>/.git and runs what that Git dir's config names; read-only, the
// sandbox can neither rewrite that pointer nor give an unpopulated
// submodule one, and the pinned directories above cannot be renamed away
// and remade. A populated submodule is then read-only in the sandbox as a
// whole (its Git dir already was: modules/ of the read-only repository).
func (c *compilation) pinSubmodules(l gitLayout) []grant.Mount {
	roots := c.dep.Roots.Workspace
	index := l.gitdir.dest + "/index"
	if !c.src.exists(index, "workspace", roots) {
		return nil // no index: no gitlinks, and only host git writes one
	}
	data, err := c.gitRead(index, gitIndexBytes)
	if err != nil {
		c.diags.Addf(diag.GitIndex, l.gitdir.fact+"/index", "%v", err)
		return nil
	}
	links, err := gitindex.Gitlinks(data)
	if err != nil {
		c.diags.Addf(diag.GitIndex, l.gitdir.fact+"/index", "%v", err)
		return nil
	}
	cwd := c.facts.Workspace.Cwd
	subs := map[string]string{} // path -> gitlink
	var order []string
	for _, link := range links {
		p := path.Join(l.worktree, link.Path)
		if p == cwd || !pathform.Beneath(cwd, p) {
			continue
		}
		if _, dup := subs[p]; !dup {
			order = append(order, p)
		}
		subs[p] = link.Path
	}
	var out []grant.Mount
	ancestors := map[string]bool{}
	for _, p := range order {
		fact := "workspace.cwd/" + pathform.Rel(cwd, p)
		if !c.src.exists(p, "workspace", roots) {
			c.diags.Addf(diag.GitSubmodule, fact, "the index has a submodule here (gitlink %s) that the worktree lacks; a mount point would be made on the host, so check it out or remove it from the index", subs[p])
			continue
		}
		s, ok := c.src.resolve(fact, p, "workspace", roots, pathsafe.Dir)
		if !ok {
			continue
		}
		out = append(out, bind(s.dest, s.host, grant.RO, "a submodule of the host index, read-only: host git status recurses into it through its .git, and runs what that Git dir names", s.fact))
		for d := path.Dir(p); d != cwd; d = path.Dir(d) {
			if _, sub := subs[d]; sub || ancestors[d] {
				continue // pinned on its own account
			}
			ancestors[d] = true
			fact := "workspace.cwd/" + pathform.Rel(cwd, d)
			if s, ok := c.src.resolve(fact, d, "workspace", roots, pathsafe.Dir); ok {
				out = append(out, bind(s.dest, s.host, grant.RW, "bound to itself so it cannot be renamed: a submodule below it is pinned", s.fact))
			}
		}
	}
	return out
}
