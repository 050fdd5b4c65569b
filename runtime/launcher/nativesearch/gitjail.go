package nativesearch

import (
	"context"
	"fmt"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathform"
)

// The launcher's git
//
// The workspace monitor's untracked cache (runtime/launcher/fsmonitor/
// untracked) is built by the image's own git, run once per launch by the
// launcher, never by a request: gitTool is not in toolSpecs, so the
// server's request parser refuses it like any tool it does not know. It
// runs in the same jail as a search (the agent's uid, its own user,
// mount, network, pid, ipc and uts namespaces, the image's /usr and the
// workspace read-only and noexec, Landlock, no capability, no_new_privs,
// the seccomp filter, the rlimits), with one thing more: a scratch
// directory the launcher made, mounted read-write (nosuid, nodev, noexec)
// at ScratchPath, where Landlock lets it make, write, truncate and remove
// files and nothing else, each file bounded by RLIMIT_FSIZE. It holds the
// Git dir and the index the launcher wrote; git writes its index there.

// gitTool is the image's git, for the launcher only.
const gitTool Tool = "git"

// ScratchPath is where the launcher's git finds its scratch directory in
// the jail.
const ScratchPath = "/paseo-scratch"

var gitSpec = toolSpec{bin: "/usr/bin/git"}

// specOf is how the jail runs t: a search tool's spec, or the launcher's
// git.
func specOf(t Tool) (toolSpec, bool) {
	if t == gitTool {
		return gitSpec, true
	}
	s, ok := toolSpecs[t]
	return s, ok
}

// RunGit runs the image's git with argv and env in a new jail whose cwd
// is the workspace's top (j.Dest), with scratch (a host directory the
// caller made for this run, writable by j.UID) mounted read-write at
// ScratchPath and every file git writes bounded to fsize bytes. It is
// killed past j.Limits.Wall or when ctx ends; its stdout is bounded by
// j.Limits.Stdout. A non-zero exit is the caller's to judge (Result.Exit
// for 1 and 2, ErrFallback past them).
func (j Jail) RunGit(ctx context.Context, scratch string, fsize uint64, argv, env []string) (Result, error) {
	g, err := j.PrepareGit(scratch, fsize)
	if err != nil {
		return Result{}, err
	}
	return g.Run(ctx, argv, env)
}

// A GitJail is a jail built and confined for the launcher's git (as
// RunGit's), waiting for its one run: the caller makes it ahead, off the
// path its run is on, and runs it once or discards it.
type GitJail struct {
	j Jail
	p *prepared
}

// PrepareGit builds RunGit's jail without running git.
func (j Jail) PrepareGit(scratch string, fsize uint64) (*GitJail, error) {
	if err := j.Check(); err != nil {
		return nil, err
	}
	if j.Dest == ScratchPath || pathform.Beneath(ScratchPath, j.Dest) || pathform.Beneath(j.Dest, ScratchPath) {
		return nil, &ErrJail{Msg: "the workspace cannot be mounted at " + j.Dest}
	}
	if fi, err := os.Lstat(path.Join(j.Usr, "bin/git")); err != nil || !fi.Mode().IsRegular() {
		return nil, &ErrJail{Msg: "the image has no git at " + path.Join(j.Usr, "bin/git")}
	}
	p, err := j.prepareWith(gitTool, scratch, fsize)
	if err != nil {
		return nil, err
	}
	return &GitJail{j: j, p: p}, nil
}

// Run runs git in g (see RunGit); g is used up.
func (g *GitJail) Run(ctx context.Context, argv, env []string) (Result, error) {
	return g.j.serve(ctx, g.p, ".", argv, env)
}

// Discard ends g's jail unused and waits for it.
func (g *GitJail) Discard() { g.p.discard() }

// detachedWritable is a detached copy of the mount at p, writable, nosuid,
// nodev and noexec.
func detachedWritable(p string) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return nil, &ErrJail{Msg: fmt.Sprintf("%s: %v", p, err)}
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC, Attr_clr: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return nil, &ErrJail{Msg: fmt.Sprintf("%s: %v", p, err)}
	}
	return os.NewFile(uintptr(fd), p), nil
}
