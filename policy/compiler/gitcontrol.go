package compiler

import (
	"slices"

	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/compiler/pathsafe"
	"paseo.dev/paseo-policy/policy/grant"
)

// A repository's config and hooks are code: Git runs the hooks, and config
// names commands it runs (core.fsmonitor, core.hooksPath, filter and diff
// drivers, aliases, credential helpers). Every agent working in a worktree
// of one repository shares its common Git dir read-write, and agents of one
// workspace share its .git, so a config or hook one of them plants would run
// in the others' sandboxes, with their keys. The compiler binds both
// read-only over the writable Git dir; Git's writes of them (git config,
// git remote) then fail with EBUSY or EROFS, and commits, branches, refs,
// objects and the index still work. Both must exist: a missing hooks
// directory is one the sandbox could create.
//
// objects/info/alternates names the object stores Git reads besides its
// own. Inside the sandbox it only reaches what the sandbox already sees,
// but the facts' alternates are checked against it (gitverify.go), so a
// daemon that derives the next launch's facts from the repository would
// grant whatever store an agent listed there. When the file exists it is
// read-only too (Git writes it only at clone --shared and repack -a -d
// --local); a repository without one stays without the bind, since a
// mount point would create the file on the host (docs/threat-model.md
// row 64).
var gitControl = []struct {
	name     string
	kind     pathsafe.Kind
	optional bool
	why      string
}{
	{"config", pathsafe.File, false, "the repository's config, read-only: Git runs what it names in every sandbox that shares the repository"},
	{"hooks", pathsafe.Dir, false, "the repository's hooks, read-only: Git runs what it names in every sandbox that shares the repository"},
	{"objects/info/alternates", pathsafe.File, true, "the repository's alternates, read-only: the object stores it lists are checked against the facts, so an agent must not add one"},
}

// gitControlBinds grants the config and hooks of the Git dir the sandbox
// writes that holds them: the common dir of a linked worktree, the Git dir
// named in the facts otherwise, or <cwd>/.git when the facts name no Git
// metadata and the workspace holds a repository.
// Nothing is added when the Git dir (or the workspace) itself was refused:
// that refusal already names the fact.
func (c *compilation) gitControlBinds(granted []grant.Mount) []grant.Mount {
	f := c.facts
	roots := c.dep.Roots.Workspace
	var repo, fact string
	switch g := f.Workspace.Git; {
	case g != nil && !g.Write:
		return nil // mounted read-only as a whole
	case g != nil && c.gitRefused:
		return nil // the refusal names the fact
	case g != nil && g.Commondir != "":
		repo, fact = g.Commondir, "workspace.git.commondir"
	case g != nil:
		repo, fact = g.Gitdir, "workspace.git.gitdir"
	default:
		if code, _ := pathform.Check(f.Workspace.Cwd); code != "" {
			return nil
		}
		repo, fact = f.Workspace.Cwd+"/.git", "workspace.cwd/.git"
		// Only a .git directory: a .git file is a linked worktree whose Git
		// dir the facts do not grant, so the sandbox cannot use it anyway.
		host, ok := c.src.hostPathQuiet(repo)
		if !ok || rootOf(roots, host) == "" {
			return nil
		}
		if id, err := c.res.Resolve(rootOf(roots, host), host); err != nil || id.Kind != pathsafe.Dir {
			return nil
		}
	}
	parent := fact
	if f.Workspace.Git == nil {
		parent = "workspace.cwd"
	}
	if !slices.ContainsFunc(granted, func(g grant.Mount) bool { return g.Fact == parent }) {
		return nil
	}
	var out []grant.Mount
	for _, gc := range gitControl {
		if gc.optional && !c.src.exists(repo+"/"+gc.name, "workspace", roots) {
			continue
		}
		s, ok := c.src.resolve(fact+"/"+gc.name, repo+"/"+gc.name, "workspace", roots, gc.kind)
		if !ok {
			continue
		}
		out = append(out, grant.Mount{Destination: s.dest, Type: "bind", Source: s.host, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
			Provenance: why(gc.why, s.fact)})
	}
	return out
}
