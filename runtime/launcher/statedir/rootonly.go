package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"paseo.dev/paseo-policy/diag"
)

// Error is a refusal of the state root's layout with its stable code
// (diag.Launch*) and the launch step it refuses; its text is Err's. The
// launcher reports it as a launch refusal of that code and step.
type Error struct {
	Code diag.Code
	Step string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// Is matches the refusal's code.
func (e *Error) Is(target error) bool { c, ok := target.(diag.Code); return ok && c == e.Code }

// Why a path is enough for an image (threat 67)
//
// runsc opens the image files by name after LoadImage has checked their
// digests, and writes them by name at checkpoint. That is safe only if no
// one but root can change what the name resolves to between the check and
// runsc's open: the hibernate dir must be root's 0700 (no one else may
// enter it, so nothing beneath it needs checking), and every directory on
// the way to it must keep its entries for root: owned by root, and not
// writable by group or others unless sticky (in a sticky dir, such as
// /tmp, only an entry's owner may rename or remove it, and every entry on
// the path is root's). A symlink on the way is followed only if root owns
// it (so it cannot be replaced), and its target is checked the same way.
// Once that holds, only root can swap the image, and root is outside the
// threat model; a chain that fails is refused at checkpoint (the image
// holds the key) and at wake.

// The ways a directory on the way to a checkpoint fails to keep its
// entries for root. Both are PP-LAUNCH-HIBERNATE-PATH (the code says the
// chain is open, not how); these say how.
var (
	ErrNotRootOwned = errors.New("not root's: its owner can swap what lies beneath it")
	ErrOpenToOthers = errors.New("writable by group or others and not sticky: they can swap what lies beneath it")
)

// CheckRootOnlyDir checks dir, the hibernate dir of one sandbox, and the
// chain of directories that lead to it.
func CheckRootOnlyDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return &Error{Code: diag.LaunchWake, Step: "wake", Err: fmt.Errorf("no checkpoint: %w", err)}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || st.Uid != 0 || fi.Mode().Perm() != 0o700 {
		return &Error{Code: diag.LaunchHibernatePath, Step: "hibernate-path", Err: fmt.Errorf("checkpoint dir %s is not a root-only (0700) directory", dir)}
	}
	abs, err := filepath.Abs(filepath.Dir(dir))
	if err != nil {
		return err
	}
	if err := checkRootChain(abs, 0); err != nil {
		return &Error{Code: diag.LaunchHibernatePath, Step: "hibernate-path", Err: fmt.Errorf("checkpoint dir %s: %w", dir, err)}
	}
	return nil
}

// checkRootChain checks every component of the absolute path p, "/"
// first: each is root's, each directory keeps its entries for root, and
// a symlink is root's and its target passes the same check.
func checkRootChain(p string, depth int) error {
	if depth > 40 {
		return fmt.Errorf("too many symlinks on the way to %s", p)
	}
	cur := "/"
	if err := rootKeeps(cur); err != nil {
		return err
	}
	comps := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
	for i, c := range comps {
		if c == "" {
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
			return fmt.Errorf("%s is %w", next, ErrNotRootOwned)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			return checkRootChain(filepath.Join(append([]string{target}, comps[i+1:]...)...), depth+1)
		}
		if err := rootKeeps(next); err != nil {
			return err
		}
		cur = next
	}
	return nil
}

// rootKeeps checks that only root can rename or remove dir's entries
// that root owns: dir is a directory, root's, and not writable by group
// or others unless sticky.
func rootKeeps(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case !ok || st.Uid != 0:
		return fmt.Errorf("%s is %w", dir, ErrNotRootOwned)
	case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("%s (mode %v) is %w", dir, fi.Mode().Perm(), ErrOpenToOthers)
	}
	return nil
}
