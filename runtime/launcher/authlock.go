package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// One sandbox per auth.json (threat 57)
//
// In oauth-file mode the sandbox binds the agent's auth.json read-write
// and Pi refreshes it there, under a lock file that lives in its own
// projection. Two sandboxes of one agent (a session and a probe) would
// each take their own lock, both refresh, and one would lose the rotated
// refresh token. So a launch takes an exclusive flock on
// <stateRoot>/locks/authfile-<dev>-<ino> for the sandbox's whole life,
// keyed on the host object it binds (the descriptor the pin was checked
// on, and the staged mount is checked to be that object), never on a
// path: a hard link or a second path to the same file is the same lock.
// The kernel drops the flock if the launcher dies. The lock file holds
// the id of the sandbox that owns the auth.json, which outlives the
// flock in two cases, both refused for a second sandbox:
//
//   - the owner is hibernated (its checkpoint dir exists): its memory
//     holds the tokens it read, so it still owns the file until it is
//     woken (a wake of that id takes the lock again) or deleted;
//   - the owner still has a record: its launcher died without teardown
//     and its sandbox may still run, until gc removes it.
//
// Only root can create, write or remove these files: the locks dir is
// 0700 root's in the 0700 state root, and the file is opened beneath it
// without following links.

// ErrAuthFileInUse refuses a launch whose auth.json another sandbox owns.
var ErrAuthFileInUse = errors.New("the agent's auth.json is in use by another sandbox (oauth-file mode runs one sandbox per auth.json)")

// AuthFileHold is how the sandbox that owns an auth.json holds it.
type AuthFileHold string

const (
	AuthFileRunning    AuthFileHold = "running"    // its launcher holds the lock
	AuthFileHibernated AuthFileHold = "hibernated" // its checkpoint holds the tokens it read
	AuthFileRecorded   AuthFileHold = "recorded"   // its launcher died without teardown; it may still run
)

// AuthFileInUseError is ErrAuthFileInUse naming the sandbox that owns the
// auth.json (empty: the lock's holder had not written its id yet) and how
// it holds it. One code (PP-LAUNCH-AUTHFILE-IN-USE) covers every case: the
// caller's remedy differs (wait, wake or delete, gc), so the refusal says
// which.
type AuthFileInUseError struct {
	Owner string
	Hold  AuthFileHold
}

func (e *AuthFileInUseError) Error() string {
	switch e.Hold {
	case AuthFileHibernated:
		return fmt.Sprintf("%v: sandbox %s is hibernated with it; wake it or delete it first", ErrAuthFileInUse, e.Owner)
	case AuthFileRecorded:
		return fmt.Sprintf("%v: sandbox %s has a record but no launcher holding the lock, so it may still run; gc it first", ErrAuthFileInUse, e.Owner)
	}
	return fmt.Sprintf("%v: sandbox %s is running with it", ErrAuthFileInUse, orUnknown(e.Owner))
}

func (e *AuthFileInUseError) Unwrap() error { return ErrAuthFileInUse }

// authFileFact is the fact of the one read-write auth.json bind the
// compiler grants in oauth-file mode (policy/compiler/credential.go).
const authFileFact = "credential.authFile"

// authLock is a held lock on one auth.json.
type authLock struct {
	dir       *os.File // the locks dir, by descriptor
	f         *os.File // the lock file, flocked
	name      string
	dev, ino  uint64 // the auth.json host object
	stateRoot string
	id        string
	// waking: only a wake of the owner's own id takes over a lock file
	// that names a hibernated owner.
	waking bool
}

// authFilePin is the pin of the plan's read-write auth.json bind, if the
// bundle has one (oauth-file mode). A grant with no pinned bind refuses.
func authFilePin(plan *launchplan.Plan) (bundle.Pin, bool, error) {
	for _, g := range plan.Manifest.Grants {
		m, ok := g.(grant.Mount)
		if !ok || m.Fact != authFileFact || !m.IsBind() {
			continue
		}
		if plan.BindsErr != nil {
			return bundle.Pin{}, false, plan.BindsErr
		}
		for _, bp := range plan.Binds {
			if bp.Pin.Destination == m.Destination && bp.Pin.Source == m.Source {
				return bp.Pin, true, nil
			}
		}
		return bundle.Pin{}, false, fmt.Errorf("the auth.json bind %s has no pin", m.Destination)
	}
	return bundle.Pin{}, false, nil
}

// lockAuthFile takes the lock of the object p pins, opened as staging
// opens it, for sandbox id (waking: a wake of id). It refuses
// (ErrAuthFileInUse) when another sandbox holds or owns it.
func lockAuthFile(stateRoot, id string, waking bool, p bundle.Pin) (*authLock, error) {
	fd, err := openPinned(p)
	if err != nil {
		return nil, fmt.Errorf("auth.json pin %s: %w", p.Source, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("auth.json: fstat: %w", err)
	}
	dir, err := openLocksDir(stateRoot)
	if err != nil {
		return nil, err
	}
	l := &authLock{dir: dir, name: fmt.Sprintf("authfile-%d-%d", st.Dev, st.Ino), dev: st.Dev, ino: st.Ino, stateRoot: stateRoot, id: id, waking: waking}
	if err := l.take(); err != nil {
		dir.Close()
		return nil, err
	}
	return l, nil
}

// openLocksDir makes and opens <stateRoot>/locks, refusing anything but a
// root-owned 0700 directory (nobody else may create or remove a lock).
func openLocksDir(stateRoot string) (*os.File, error) {
	p := filepath.Join(stateRoot, "locks")
	if err := os.MkdirAll(p, 0o700); err != nil {
		return nil, err
	}
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("locks dir: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Uid != 0 || st.Mode&0o7777 != 0o700 {
		unix.Close(fd)
		return nil, refused(diag.LaunchStateDir, "state-dir", fmt.Errorf("locks dir %s is not a root-only (0700) directory", p))
	}
	return os.NewFile(uintptr(fd), p), nil
}

// take flocks the lock file. A file its last holder unlinked between our
// open and our flock is not the one the next launch sees, so the lock is
// only ours once the name still leads to the locked file.
func (l *authLock) take() error {
	for range 8 {
		fd, err := unix.Openat(int(l.dir.Fd()), l.name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("auth.json lock: %w", err)
		}
		f := os.NewFile(uintptr(fd), l.name)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Nlink != 1 {
			f.Close()
			return fmt.Errorf("auth.json lock %s is not a root-owned regular file", l.name)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			owner := readLockOwner(f)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return &AuthFileInUseError{Owner: owner, Hold: AuthFileRunning}
			}
			return fmt.Errorf("auth.json lock: flock: %w", err)
		}
		var now unix.Stat_t
		if err := unix.Fstatat(int(l.dir.Fd()), l.name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil || now.Ino != st.Ino || now.Dev != st.Dev {
			f.Close()
			continue
		}
		if owner := readLockOwner(f); owner != "" && (owner != l.id || !l.waking) {
			if err := l.ownedElsewhere(owner); err != nil {
				f.Close() // the file stays: it still names the owner
				return err
			}
		}
		if err := writeLockOwner(f, l.id); err != nil {
			f.Close()
			return fmt.Errorf("auth.json lock: %w", err)
		}
		l.f = f
		return nil
	}
	return fmt.Errorf("auth.json lock %s: kept changing while being taken", l.name)
}

// ownedElsewhere refuses when the sandbox the free lock file names still
// owns the auth.json: it is hibernated (and this is not its wake), or its
// record says it may run.
func (l *authLock) ownedElsewhere(owner string) error {
	if err := statedir.ValidID(owner); err != nil {
		return fmt.Errorf("auth.json lock %s names no valid sandbox id", l.name)
	}
	if _, err := os.Stat(statedir.HibernateDir(l.stateRoot, owner)); err == nil {
		return &AuthFileInUseError{Owner: owner, Hold: AuthFileHibernated}
	}
	if _, ok, err := statedir.Lookup(l.stateRoot, owner); err == nil && ok {
		return &AuthFileInUseError{Owner: owner, Hold: AuthFileRecorded}
	}
	return nil
}

// checkStaged refuses when the staged mount at path is not the object the
// lock names: the lock must cover what the sandbox writes.
func (l *authLock) checkStaged(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("staged auth.json: %w", err)
	}
	if st.Dev != l.dev || st.Ino != l.ino {
		return fmt.Errorf("staged auth.json is dev %d inode %d, the lock was taken on dev %d inode %d", st.Dev, st.Ino, l.dev, l.ino)
	}
	return nil
}

// release drops the lock at teardown. While the sandbox is hibernated the
// file keeps naming it; otherwise it is removed, while still locked, so
// the state root does not collect one file per auth.json ever run. It
// runs after the record's undo, so a failure here is in the result and
// the log but not in a kept record.
func (l *authLock) release() error {
	var err error
	if _, serr := os.Stat(statedir.HibernateDir(l.stateRoot, l.id)); serr != nil {
		if uerr := unix.Unlinkat(int(l.dir.Fd()), l.name, 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
			err = fmt.Errorf("removing the lock file %s: %w", l.name, uerr)
		}
	}
	l.f.Close() // closing drops the lock, whatever close reports
	l.dir.Close()
	return err
}

func readLockOwner(f *os.File) string {
	buf := make([]byte, 128)
	n, _ := f.ReadAt(buf, 0)
	return strings.TrimSpace(string(buf[:n]))
}

func writeLockOwner(f *os.File, id string) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(id+"\n"), 0)
	return err
}

func orUnknown(s string) string {
	if s == "" {
		return "(id not yet written)"
	}
	return s
}

// lockAuthFile takes the launch's auth.json lock, in oauth-file mode.
func (l *launch) lockAuthFile() error {
	p, ok, err := authFilePin(l.plan)
	if err != nil || !ok {
		return err
	}
	lock, err := lockAuthFile(l.opts.StateRoot, l.opts.ID, l.wake != nil, p)
	if err != nil {
		return err
	}
	l.authLock = lock
	l.cleanup.push("auth.json lock", lock.release)
	return nil
}

// checkAuthFileStaged refuses a launch whose staged auth.json is not the
// object it locked.
func (l *launch) checkAuthFileStaged() error {
	if l.authLock == nil {
		return nil
	}
	p, _, _ := authFilePin(l.plan)
	for _, s := range l.state.binds {
		if s.pin == p {
			return l.authLock.checkStaged(s.path)
		}
	}
	return errors.New("the auth.json bind was not staged")
}
