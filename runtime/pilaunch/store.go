package pilaunch

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Record is what the command keeps per agent between spawns: the sandbox
// running its Pi and the last output record it wrote to Paseo.
type Record struct {
	Sandbox string `json:"sandbox"`
	Cursor  uint64 `json:"cursor"`
}

// Store is the operator's bridge dir, held open by descriptor: a directory
// of the daemon user, mode 0700 at most, reached with no symlink followed.
// Records are files <agent id>.json, 0600, written whole (a temporary file
// renamed over the old one), read without following a link.
type Store struct{ fd int }

// OpenStore opens and checks dir.
func OpenStore(dir string) (*Store, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s config.state.bridgeDir: %s", CodeState, fmt.Sprintf(format, a...))
	}
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, bad("open /: %v", err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(dir, "/"), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, bad("open: %v (it is opened without following links)", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || int(st.Uid) != unix.Geteuid() || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return nil, bad("must be a directory of the daemon user with mode 0700")
	}
	return &Store{fd: fd}, nil
}

// Close releases the directory.
func (s *Store) Close() error { return unix.Close(s.fd) }

// Load returns the agent's record, or nil when it has none.
func (s *Store) Load(agent string) (*Record, error) {
	var r Record
	ok, err := s.load(agent, agent+".json", "record", &r)
	if err != nil || !ok {
		return nil, err
	}
	if r.Sandbox == "" {
		return nil, fmt.Errorf("%s %s: the record does not decode", CodeState, agent)
	}
	return &r, nil
}

// Save writes the agent's record whole.
func (s *Store) Save(agent string, r Record) error {
	return s.save(agent, agent+".json", "record", r)
}

// GitBase is the worktree branch's value the agent's Git work is imported
// from (gitturn.go): the host's value when the agent was first seen, then
// the value after each import that left the repository and the agent's
// store agreeing. It outlives the agent's sandboxes: the store does too.
type GitBase struct {
	Branch string `json:"branch"`
	Base   string `json:"base"`
}

// gitBaseName: `+` is in no agent id, so no record is named so.
func gitBaseName(agent string) string { return "git+" + agent + ".json" }

// LoadGitBase returns the agent's recorded base, or nil.
func (s *Store) LoadGitBase(agent string) (*GitBase, error) {
	var g GitBase
	ok, err := s.load(agent, gitBaseName(agent), "Git base", &g)
	if err != nil || !ok {
		return nil, err
	}
	return &g, nil
}

// SaveGitBase records the agent's base whole.
func (s *Store) SaveGitBase(agent string, g GitBase) error {
	return s.save(agent, gitBaseName(agent), "Git base", g)
}

// load decodes the small regular file name of the daemon user into v;
// false when there is none.
func (s *Store) load(agent, name, what string, v any) (bool, error) {
	fd, err := unix.Openat(s.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s %s: open the %s: %v", CodeState, agent, what, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != unix.Geteuid() || st.Size > 4096 {
		return false, fmt.Errorf("%s %s: the %s is not a small regular file of the daemon user", CodeState, agent, what)
	}
	buf := make([]byte, st.Size)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return false, fmt.Errorf("%s %s: read the %s: %v", CodeState, agent, what, err)
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		return false, fmt.Errorf("%s %s: the %s does not decode", CodeState, agent, what)
	}
	return true, nil
}

// save writes v to name whole: a temporary file renamed over the old one.
func (s *Store) save(agent, name, what string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := name + ".tmp"
	_ = unix.Unlinkat(s.fd, tmp, 0)
	fd, err := unix.Openat(s.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s %s: write the %s: %v", CodeState, agent, what, err)
	}
	_, err = unix.Write(fd, data)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(s.fd, tmp, s.fd, name)
	}
	if err != nil {
		return fmt.Errorf("%s %s: write the %s: %v", CodeState, agent, what, err)
	}
	return nil
}

// Remove deletes the agent's record (a deliberate close, an ended sandbox).
func (s *Store) Remove(agent string) error {
	if err := unix.Unlinkat(s.fd, agent+".json", 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("%s %s: remove the record: %v", CodeState, agent, err)
	}
	return nil
}

// MakeSessionDir makes <sessions>/<agent> (0700) for a new session: Pi in
// the sandbox runs as the deployment's user, which on a host daemon is the
// daemon's own. An existing directory of the daemon user is kept. The
// returned undo removes a directory this call made (still empty): a
// refused launch leaves nothing behind.
func MakeSessionDir(sessions, agent string) (undo func(), err error) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(sessions, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, fmt.Errorf("%s config.state.sessionsDir: %v", CodeState, err)
	}
	err = unix.Mkdirat(fd, agent, 0o700)
	if err == unix.EEXIST {
		unix.Close(fd)
		return func() {}, nil
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s state.sessionDir: %v", CodeState, err)
	}
	return func() { _ = unix.Unlinkat(fd, agent, unix.AT_REMOVEDIR); unix.Close(fd) }, nil
}
