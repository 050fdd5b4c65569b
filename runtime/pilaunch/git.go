package pilaunch

import (
	"bytes"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/schema"
)

// Git in Paseo's worktrees.
//
// Paseo runs an agent in a worktree of the user's repository, often a
// linked one (`git worktree add`), whose `.git` is a file naming a gitdir
// inside the repository. The command finds the Git metadata the way Git
// does, from the cwd's `.git`, read once by descriptor, never
// following a link; for a file, the gitdir it names, that gitdir's
// `commondir`, and the repository's `objects/info/alternates`. These are
// claims for the compiler, which verifies every one of them again against
// the registry's roots (the Git rule, docs/facts.md) and refuses what does
// not hold. The command reads nothing else of the repository.

const (
	maxGitPointer    = 4 << 10  // `.git` and `commondir`, as the compiler bounds them
	maxGitAlternates = 64 << 10 // `objects/info/alternates`
)

// gitFacts returns the Git facts of a cwd whose `.git` is a file (a
// linked worktree, a submodule), or nil: no `.git` in the cwd, or a `.git`
// directory (a main worktree, which the compiler protects without facts).
// Only the cwd's own `.git` is read: Paseo runs an agent at its worktree's
// root, and a `.git` above the cwd may lie above the workspace roots,
// where the compiler would refuse it. write asks for Git writes (into the
// agent's store).
func gitFacts(cwd string, write bool) (*schema.Git, error) {
	name := path.Join(cwd, ".git")
	fd, err := openNoFollow(name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %v (opened without following links)", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return nil, nil
	case unix.S_IFREG:
		return linkedGit(fd, cwd, write)
	default:
		return nil, fmt.Errorf("%s is neither a directory nor a regular file", name)
	}
}

// linkedGit reads a `.git` file (`gitdir: <path>`) and what its gitdir
// names.
func linkedGit(fd int, dir string, write bool) (*schema.Git, error) {
	line, err := readPointer(fd, maxGitPointer, path.Join(dir, ".git"))
	if err != nil {
		return nil, err
	}
	rest, ok := strings.CutPrefix(line, "gitdir: ")
	if !ok {
		return nil, fmt.Errorf("%s: not `gitdir: <path>`", path.Join(dir, ".git"))
	}
	g := &schema.Git{Gitdir: resolve(dir, rest), Write: write}
	cfd, err := openNoFollow(path.Join(g.Gitdir, "commondir"), unix.O_RDONLY|unix.O_NONBLOCK)
	switch {
	case err == unix.ENOENT:
		// A submodule's gitdir: no commondir.
	case err != nil:
		return nil, fmt.Errorf("%s: %v", path.Join(g.Gitdir, "commondir"), err)
	default:
		defer unix.Close(cfd)
		line, err := readPointer(cfd, maxGitPointer, path.Join(g.Gitdir, "commondir"))
		if err != nil {
			return nil, err
		}
		g.Commondir = resolve(g.Gitdir, line)
	}
	repo := g.Gitdir
	if g.Commondir != "" {
		repo = g.Commondir
	}
	afd, err := openNoFollow(path.Join(repo, "objects/info/alternates"), unix.O_RDONLY|unix.O_NONBLOCK)
	if err == nil {
		defer unix.Close(afd)
		data, err := readBounded(afd, maxGitAlternates, path.Join(repo, "objects/info/alternates"))
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				g.Alternates = append(g.Alternates, resolve(path.Join(repo, "objects"), l))
			}
		}
	} else if err != unix.ENOENT {
		return nil, fmt.Errorf("%s: %v", path.Join(repo, "objects/info/alternates"), err)
	}
	return g, nil
}

// resolve is p relative to dir (or p itself when absolute), cleaned
// lexically: the compiler resolves it again, without following links.
func resolve(dir, p string) string {
	if !strings.HasPrefix(p, "/") {
		p = path.Join(dir, p)
	}
	return path.Clean(p)
}

// openNoFollow opens an absolute path with no symlink on the way, the
// last component included.
func openNoFollow(p string, flags int) (int, error) {
	if code, _ := pathform.Check(p); code != "" {
		return -1, unix.EINVAL
	}
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	return unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// readPointer reads a one-line pointer file from its descriptor.
func readPointer(fd int, max int64, name string) (string, error) {
	data, err := readBounded(fd, max, name)
	if err != nil {
		return "", err
	}
	line := strings.TrimRight(string(data), "\r\n")
	if line == "" || strings.ContainsAny(line, "\n\x00") {
		return "", fmt.Errorf("%s: not one line", name)
	}
	return line, nil
}

// readBounded reads a regular file of at most max bytes from fd.
func readBounded(fd int, max int64, name string) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > max {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", name, max)
	}
	var buf bytes.Buffer
	b := make([]byte, 4096)
	for int64(buf.Len()) <= max {
		n, err := unix.Read(fd, b)
		if n > 0 {
			buf.Write(b[:n])
		}
		if n == 0 || err != nil {
			if err != nil {
				return nil, err
			}
			break
		}
	}
	if int64(buf.Len()) > max {
		return nil, fmt.Errorf("%s: longer than %d bytes", name, max)
	}
	return buf.Bytes(), nil
}
