package compiler

import (
	"path"
	"slices"
	"strconv"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
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
//     written, created or renamed, its objects, refs and reflogs included
//     (issue 30: host git appends to reflogs through symlinks, trusts an
//     object's bytes under its id, honours refs/replace). Git's writes in
//     the sandbox go to the agent's private Git store (state.gitStore),
//     bound read-write at gitStoreView as the private Git dir's commondir,
//     with the repository's objects as a read-only alternate. The store
//     reaches the repository only through paseo-policy git import
//     (runtime/gitimport), which treats it as untrusted data.
//  2. The worktree's own state is private: the Git dir the worktree's .git
//     leads to is a tmpfs of this sandbox at the same path, which the
//     profile's start script seeds from the real one (bound read-only at
//     gitSeed): HEAD, index, gitdir, and a commondir naming the store; a
//     new store gets the repository's refs (O(refs), not O(objects)). Git
//     in the sandbox then stages, commits, switches and stashes against
//     its own HEAD and index; the host's are never written.
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
	gitSeed = bundle.GitSeedPath
	// gitRepoView shows a main worktree's (or a submodule's) repository,
	// whose own path holds the private tmpfs.
	gitRepoView = "/run/paseo/repo"
	// gitStoreView shows the agent's private Git store, the commondir of
	// the sandbox's private Git dir.
	gitStoreView = "/run/paseo/git-store"
	// gitIndexBytes bounds the host index the compiler reads for gitlinks.
	gitIndexBytes = 256 << 20
)

// Where the Git layout shows what the import after a turn needs: the
// supervisor finds their host paths among the plan's pins (Plan.Pins), by
// these destinations (a linked worktree's repository is shown at its own
// path, workspace.git.commondir).
const (
	GitSeedView  = gitSeed
	GitRepoView  = gitRepoView
	GitStoreView = gitStoreView
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

// gitGrants is what gitBinds grants: the mounts, the start script's
// environment for the private Git dir (repoView), and the agent's Git
// store in fact space, which must lie apart from every other bind
// (gitStoreApart).
type gitGrants struct {
	mounts    []grant.Mount
	env       []grant.Env
	storeDest string
}

// gitBinds grants the repository the cwd uses under the three rules above:
// verified is the one the Git facts name (binds, gitverify.go), nil when
// one was refused or they name none. Nothing is added when a Git fact was
// refused: that refusal names it.
func (c *compilation) gitBinds(granted []grant.Mount, verified *gitLayout) gitGrants {
	var out gitGrants
	if !slices.ContainsFunc(granted, func(g grant.Mount) bool { return g.Fact == "workspace.cwd" }) {
		return out
	}
	if m, ok := c.dotGitPlaceholder(); ok {
		out.mounts = append(out.mounts, m)
	}
	l, ok := c.gitLayoutOf(verified)
	if !ok {
		return out
	}
	switch {
	case l.pinOnly:
	case l.write:
		if store, ok := c.gitStore(l); ok {
			view, env := c.repoView(l, store)
			out.mounts, out.env, out.storeDest = append(out.mounts, view...), env, store.dest
		} else {
			out.mounts = append(out.mounts, c.readOnlyGit(l, "no Git store is granted, so no Git writes")...)
		}
	default:
		out.mounts = append(out.mounts, c.readOnlyGit(l, "facts grant Git inspection only")...)
	}
	out.mounts = append(out.mounts, c.pinDotGit(l)...)
	out.mounts = append(out.mounts, c.pinSubmodules(l)...)
	return out
}

// gitLayoutOf finds the repository: the verified one when the facts name
// one, or with no Git facts from a .git in the cwd itself (a repository
// the workspace holds).
func (c *compilation) gitLayoutOf(verified *gitLayout) (gitLayout, bool) {
	f := c.facts
	if f.Workspace.Git != nil {
		if verified == nil {
			return gitLayout{}, false
		}
		return *verified, true
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

// repoView binds the repository read-only as a whole (rule 1), makes the
// worktree's Git dir private (rule 2) and binds the agent's own Git store
// read-write as the private Git dir's commondir: every object, ref and
// reflog Git in the sandbox writes lands there, never in the repository.
// It returns the start script's environment for the private Git dir too.
func (c *compilation) repoView(l gitLayout, store source) ([]grant.Mount, []grant.Env) {
	view := l.repo.dest
	if !l.linked {
		view = gitRepoView
	}
	out := []grant.Mount{bind(view, l.repo.host, grant.RO,
		"the repository, read-only as a whole: its config, hooks, commondir, worktrees/ and modules/ are what host git runs and follows, and its objects, refs and reflogs what host git trusts and appends to, so the sandbox can neither change nor create any of them", l.fact)}
	out = append(out, bind(gitStoreView, store.host, grant.RW,
		"this agent's private Git store, the sandbox's commondir: its new objects (the repository's a read-only alternate), refs, reflogs and packed-refs; kept across launches, and read by the host only through paseo-policy git import", store.fact))
	if cfg, ok := c.src.resolve(l.fact+"/config", l.repo.dest+"/config", "workspace", c.dep.Roots.Workspace, pathsafe.File); ok {
		out = append(out, grant.Mount{Destination: gitStoreView + "/config", Type: "bind", Source: cfg.host, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
			Provenance: why("the repository's config, read-only, as the store's: Git in the sandbox reads the settings it read before (object format, identity, remotes) and cannot change them", cfg.fact)})
	}
	out = append(out, grant.Mount{Destination: gitStoreView + "/HEAD", Type: "bind", Source: bundle.GitHeadFile, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		Provenance: why("generated: the store is the sandbox's commondir, whose HEAD Git takes for another worktree's; one naming no branch leaves the agent's own branch free to check out", store.fact)})
	uid, gid := c.ownerOptions()
	out = append(out, grant.Mount{Destination: l.gitdir.dest, Type: "tmpfs", Source: "tmpfs",
		Options:    []string{"nosuid", "nodev", "noexec", "mode=0755", uid, gid, "size=" + strconv.FormatInt(c.limits.TmpfsBytes, 10)},
		Provenance: why("the worktree's Git dir, private to this sandbox and seeded by the start script: the agent's HEAD, index and per-worktree state never reach the host's, which host git reads", l.gitdir.fact)})
	// The seed is the real Git dir, apart from the view: a main
	// worktree's view would otherwise be the tmpfs itself.
	out = append(out, bind(gitSeed, l.gitdir.host, grant.RO, "the worktree's real Git dir, read-only: what the start script copies into the private one", l.gitdir.fact))
	if l.linked {
		// A linked worktree's submodules keep their Git dirs in its own
		// Git dir, which the tmpfs covers.
		roots := c.dep.Roots.Workspace
		if p := l.gitdir.dest + "/modules"; c.src.exists(p, "workspace", roots) {
			if s, ok := c.src.resolve(l.gitdir.fact+"/modules", p, "workspace", roots, pathsafe.Dir); ok {
				out = append(out, bind(p, s.host, grant.RO, "the worktree's submodule Git dirs, read-only: their config and hooks are what host git runs in them", s.fact))
			}
		}
	}
	env := []grant.Env{
		{Name: "PASEO_GIT_DIR", Value: l.gitdir.dest, Provenance: why("the private Git dir the start script seeds", l.gitdir.fact)},
		{Name: "PASEO_GIT_SEED", Value: gitSeed, Provenance: why("the real Git dir, read-only, that the start script seeds from", l.gitdir.fact)},
		{Name: "PASEO_GIT_COMMONDIR", Value: gitStoreView, Provenance: why("the commondir the start script writes in the private Git dir: this agent's Git store", store.fact)},
		{Name: "PASEO_GIT_REPO", Value: view, Provenance: why("the repository's read-only view: the store's object alternate, and the refs the start script copies into a new store", l.fact)},
	}
	return out, env
}

// gitStore resolves the agent's private Git store: a directory beneath a
// state root, named for the agent (no two agents share one), apart from
// every other bind and from the repository, whose data host git trusts.
// Without one, Git writes are not granted: a refusal when the facts asked
// for them, the read-only layout when the cwd's own .git was found.
func (c *compilation) gitStore(l gitLayout) (source, bool) {
	f := c.facts
	if f.State.GitStore == "" {
		if l.fact != "workspace.cwd/.git" {
			c.diags.Addf(diag.GitStore, "state.gitStore", "workspace.git.write grants Git writes, which go to this agent's private Git store; the facts name none")
		}
		return source{}, false
	}
	s, ok := c.src.resolve("state.gitStore", f.State.GitStore, "state", c.dep.Roots.State, pathsafe.Dir)
	if !ok || !c.ownedByAgent("state.gitStore", f.State.GitStore, "the agent's Git store") {
		return source{}, false
	}
	// The agent dir is a projection, no bind, so gitStoreApart would not
	// see it; the daemon's files there are what every Pi of it loads.
	for _, p := range []struct{ dir, what string }{{l.repo.dest, "the repository"}, {l.gitdir.dest, "the worktree's Git dir"}, {l.worktree, "the worktree"}, {f.State.AgentDir, "state.agentDir"}} {
		if pathform.Beneath(p.dir, s.dest) || pathform.Beneath(s.dest, p.dir) {
			c.diags.Addf(diag.GitStore, "state.gitStore", "the Git store must lie apart from %s", p.what)
			return source{}, false
		}
	}
	return s, true
}

// gitStoreApart refuses a store that is, contains or lies inside another
// bind of this launch (the workspace, the session dir): its contents would
// be writable, or readable, there too. Run over every bind, once all are
// made. The store's own binds are at gitStoreView, never its fact path;
// dir is the store in fact space, "" when none is granted.
func (c *compilation) gitStoreApart(binds []grant.Mount, dir string) {
	if dir == "" {
		return
	}
	for _, g := range binds {
		if g.IsBind() && !slices.Contains(bundle.InternalSources, g.Source) && (pathform.Beneath(g.Destination, dir) || pathform.Beneath(dir, g.Destination)) {
			c.diags.Addf(diag.GitStore, "state.gitStore", "the Git store must lie apart from %s", g.Fact)
			return
		}
	}
}

// readOnlyGit binds both Git dirs read-only: the facts grant inspection
// only, or no store to write to.
func (c *compilation) readOnlyGit(l gitLayout, why string) []grant.Mount {
	out := []grant.Mount{bind(l.gitdir.dest, l.gitdir.host, grant.RO, "the worktree's Git dir, read-only: "+why, l.gitdir.fact)}
	if l.linked {
		out = append(out, bind(l.repo.dest, l.repo.host, grant.RO, "the repository's common Git dir, read-only: "+why, l.repo.fact))
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
