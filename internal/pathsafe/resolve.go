// Package pathsafe is the one opener of pinned sources. It resolves paths
// beneath registered roots with openat2, refusing symlinks, magic links and
// mount crossings, so that what the compiler grants is exactly the object
// the operator registered; the launcher's bind staging and auth.json lock
// and doctor's pin check open the pins it made with the same calls
// (OpenPinned), so doctor's verdict on a pin is the launch's. It lives in
// internal/, not under policy/compiler, because the launch side may not
// import the compiler.
package pathsafe

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
)

// Kind is the type of a resolved object.
type Kind string

const (
	Dir   Kind = "dir"
	File  Kind = "file"
	Other Kind = "other"
)

// Identity pins a resolved object so the launcher can refuse it if the path
// was swapped between compile and launch.
type Identity struct {
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	Kind Kind   `json:"kind"`
}

// Error is a resolution failure with a stable code.
type Error struct {
	Code diag.Code
	Msg  string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Msg }

// Is matches the error's code: errors.Is(err, diag.PathCrossMount).
func (e *Error) Is(target error) bool { c, ok := target.(diag.Code); return ok && c == e.Code }

// Resolver opens paths beneath roots. Base is where "/" is: empty for the
// real host, or a directory that stands in for it (tests build host trees in
// t.TempDir() and resolve the same absolute paths beneath it, with the same
// openat2 calls).
type Resolver struct {
	Base string
}

const beneathFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Resolve opens p beneath root (both canonical, p Beneath root) and returns
// its identity. The root itself is opened without following symlinks; below
// the root no mount point may be crossed either.
func (r Resolver) Resolve(root, p string) (Identity, error) {
	fd, id, err := r.open(root, p)
	if err != nil {
		return Identity{}, err
	}
	unix.Close(fd)
	return id, nil
}

// OpenPinned opens p beneath root exactly as Resolve does and returns the
// O_PATH descriptor only when it is the object pinned (device, inode and
// kind), else PP-PATH-REPLACED. The caller closes the descriptor and acts
// on it, never on the path again.
func (r Resolver) OpenPinned(root, p string, pin Identity) (int, error) {
	// A pin is read from pins.json, not checked by the schema as facts
	// are: its form is checked here.
	for _, q := range []string{root, p} {
		if code, msg := pathform.Check(q); code != "" {
			return -1, &Error{code, msg}
		}
	}
	fd, id, err := r.open(root, p)
	if err != nil {
		return -1, err
	}
	if id != pin {
		unix.Close(fd)
		return -1, &Error{diag.PathReplaced, fmt.Sprintf("now dev %d inode %d kind %s, compiled as dev %d inode %d kind %s: the source was replaced since compile", id.Dev, id.Ino, id.Kind, pin.Dev, pin.Ino, pin.Kind)}
	}
	return fd, nil
}

// open resolves p beneath root to an O_PATH descriptor and its identity.
func (r Resolver) open(root, p string) (int, Identity, error) {
	if !pathform.Beneath(root, p) {
		return -1, Identity{}, &Error{diag.PathOutsideRoot, fmt.Sprintf("not beneath root %s", root)}
	}
	rootFD, err := r.openRoot(root)
	if err != nil {
		return -1, Identity{}, err
	}
	fd := rootFD
	if rel := pathform.Rel(root, p); rel != "." {
		fd, err = unix.Openat2(rootFD, rel, &unix.OpenHow{
			// No O_NOFOLLOW: with it a trailing symlink would be opened
			// itself; without it RESOLVE_NO_SYMLINKS refuses it (ELOOP).
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: beneathFlags | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			err = r.explain(rootFD, root, rel, err)
		}
		unix.Close(rootFD)
		if err != nil {
			return -1, Identity{}, err
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, Identity{}, &Error{diag.PathMissing, "stat: " + err.Error()}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(fd)
		return -1, Identity{}, &Error{diag.PathSymlink, "is a symlink"}
	}
	return fd, Identity{Dev: st.Dev, Ino: st.Ino, Kind: KindOf(st.Mode)}, nil
}

// KindOf classifies a stat mode; the launcher's pin check uses it too, so
// compile and launch agree on what a source is.
func KindOf(mode uint32) Kind {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return Dir
	case unix.S_IFREG:
		return File
	}
	return Other
}

// openRoot opens a registered root from Base without following symlinks.
func (r Resolver) openRoot(root string) (int, error) {
	base := r.Base
	if base == "" {
		base = "/"
	}
	baseFD, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &Error{diag.PathMissing, fmt.Sprintf("cannot open filesystem base: %v", err)}
	}
	if root == "/" {
		return baseFD, nil
	}
	defer unix.Close(baseFD)
	fd, err := unix.Openat2(baseFD, root[1:], &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: beneathFlags,
	})
	if err != nil {
		e := r.explain(baseFD, "/", root[1:], err).(*Error)
		e.Msg = "registered root " + root + ": " + e.Msg
		return -1, e
	}
	return fd, nil
}

// explain turns an openat2 errno into a coded error, walking the path once
// more to name the offending component for symlink and mount refusals.
func (r Resolver) explain(dirFD int, root, rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return &Error{diag.PathSymlink, fmt.Sprintf("%s is a symlink; sources are resolved without following links", r.firstLink(dirFD, root, rel))}
	case errors.Is(err, unix.ENOENT):
		return &Error{diag.PathMissing, "does not exist"}
	case errors.Is(err, unix.ENOTDIR):
		return &Error{diag.PathType, "a component of the path is not a directory"}
	case errors.Is(err, unix.EXDEV):
		return &Error{diag.PathCrossMount, "resolution crosses a mount point beneath the registered root; register the mount point itself as a root"}
	case errors.Is(err, unix.ENOSYS):
		return &Error{diag.PathMissing, "openat2 is unavailable (kernel older than 5.6); paths cannot be resolved safely"}
	case errors.Is(err, os.ErrPermission):
		return &Error{diag.PathMissing, "permission denied while resolving"}
	}
	return &Error{diag.PathMissing, err.Error()}
}

// firstLink names the first symlink component of rel, for the message.
func (r Resolver) firstLink(dirFD int, root, rel string) string {
	parts := strings.Split(rel, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		var st unix.Stat_t
		if err := unix.Fstatat(dirFD, prefix, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			break
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if root == "/" {
				return "/" + prefix
			}
			return root + "/" + prefix
		}
	}
	return "a component"
}

// ReadSmall reads the regular file p beneath root, resolved exactly as
// Resolve does, and returns at most max bytes (an error if it is larger).
// The compiler uses it only to look inside daemon-owned state files it
// must judge, never to copy content into a bundle.
func (r Resolver) ReadSmall(root, p string, max int) ([]byte, error) {
	if !pathform.Beneath(root, p) || p == root {
		return nil, &Error{diag.PathOutsideRoot, fmt.Sprintf("not beneath root %s", root)}
	}
	rootFD, err := r.openRoot(root)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootFD)
	rel := pathform.Rel(root, p)
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: beneathFlags | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, r.explain(rootFD, root, rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &Error{diag.PathMissing, "stat: " + err.Error()}
	}
	if KindOf(st.Mode) != File {
		return nil, &Error{diag.PathType, "not a regular file"}
	}
	if st.Size > int64(max) {
		return nil, &Error{diag.PathType, fmt.Sprintf("larger than %d bytes", max)}
	}
	// The buffer is the size the stat gave plus one, not max+1: a few
	// hundred bytes read were 64 KiB allocated, twice a compile. Only a
	// file that grew since the stat fills it; then the rest is read up to
	// max+1, as one read of max+1 would have.
	buf := make([]byte, st.Size+1)
	n, err := unix.Read(fd, buf)
	if err == nil && n == len(buf) && n <= max {
		buf = append(buf, make([]byte, max+1-n)...)
		var more int
		more, err = unix.Read(fd, buf[n:])
		n += more
	}
	if err != nil {
		return nil, &Error{diag.PathMissing, "read: " + err.Error()}
	}
	if n > max {
		return nil, &Error{diag.PathType, fmt.Sprintf("larger than %d bytes", max)}
	}
	return buf[:n], nil
}
