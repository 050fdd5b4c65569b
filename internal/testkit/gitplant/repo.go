package gitplant

import (
	"path/filepath"
	"strconv"
	"testing"
)

// Spec is a repository layout, built with real git.
type Spec struct {
	// EmptyTemplate inits with --template= (no hooks/, no info/), as a
	// repository made with an empty template or by a tool that skips it.
	EmptyTemplate bool
	// WorktreeConfig sets extensions.worktreeConfig in the repository's
	// config (git sparse-checkout does), so Git reads config.worktree.
	WorktreeConfig bool
	// Fsmonitor names a benign hook of the daemon's in core.fsmonitor, as
	// a reviewed config could.
	Fsmonitor bool
	// Linked names linked worktrees, added beside the main one.
	Linked []string
	// Submodule is the path of a submodule added from a local file:// source.
	Submodule string
}

// Repo is a built layout. Everything lies beneath Root, the workspace root.
type Repo struct {
	Root   string
	Main   string // the main worktree; its .git is a directory
	Common string // Main/.git, the common dir of every worktree
}

// Worktree is the path of the worktree name ("" is the main one).
func (r *Repo) Worktree(name string) string {
	if name == "" {
		return r.Main
	}
	return filepath.Join(r.Root, name)
}

// GitDir is the worktree's Git dir: the common dir for the main worktree,
// <common>/worktrees/<name> for a linked one.
func (r *Repo) GitDir(name string) string {
	if name == "" {
		return r.Common
	}
	return filepath.Join(r.Common, "worktrees", name)
}

// Build makes the layout: a main worktree with two commits' worth of
// files, then what s asks for.
func (l *Lab) Build(t testing.TB, s Spec) *Repo {
	t.Helper()
	l.n++
	root := filepath.Join(l.Dir, "ws"+strconv.Itoa(l.n))
	r := &Repo{Root: root, Main: filepath.Join(root, "main"), Common: filepath.Join(root, "main", ".git")}
	mkdirAll(t, r.Main)
	init := []string{"init", "-q"}
	if s.EmptyTemplate {
		init = append(init, "--template=")
	}
	l.Git(t, r.Main, init...)
	writeFile(t, filepath.Join(r.Main, "README"), "hello\n")
	writeFile(t, filepath.Join(r.Main, "src", "a.txt"), "a\n")
	l.Git(t, r.Main, "add", "-A")
	l.Git(t, r.Main, "commit", "-qm", "initial")
	if s.WorktreeConfig {
		l.Git(t, r.Main, "config", "extensions.worktreeConfig", "true")
	}
	if s.Fsmonitor {
		hook := filepath.Join(l.Dir, "daemon-fsmonitor")
		// The daemon's own hook: says which token it got, reports no changes.
		writeExec(t, hook, "#!/bin/sh\necho \"daemon-fsmonitor token: $2\" >&2\n")
		l.Git(t, r.Main, "config", "core.fsmonitor", hook)
	}
	if s.Submodule != "" {
		src := filepath.Join(l.Dir, "subsrc"+strconv.Itoa(l.n))
		mkdirAll(t, src)
		l.Git(t, src, "init", "-q")
		writeFile(t, filepath.Join(src, "lib.txt"), "lib\n")
		l.Git(t, src, "add", "-A")
		l.Git(t, src, "commit", "-qm", "lib")
		// file:// submodules are off by default since 2.38.1; only this add needs them.
		l.Git(t, r.Main, "-c", "protocol.file.allow=always", "submodule", "add", "-q", "file://"+src, s.Submodule)
		l.Git(t, r.Main, "commit", "-qm", "submodule")
	}
	for _, name := range s.Linked {
		l.Git(t, r.Main, "worktree", "add", "-q", "-b", name, filepath.Join(root, name))
	}
	l.Own(t)
	return r
}
