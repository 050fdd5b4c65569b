// Package vouch writes the index the sandbox's git starts from when the
// workspace monitor is granted: the worktree's real index (the seed the
// pi-session start script copies) with an fsmonitor extension that marks
// valid every entry the launcher checked, from the host, is unchanged
// since host git recorded it, and names the watcher's token, so the first
// `git status` in the sandbox lstats only what the launcher could not
// vouch for and what changed after (docs/spec.md, "An agent's tools and
// the file path").
//
// Vouching is reading: the seed index through a descriptor opened beneath
// the staged Git-seed bind, and fstatat(AT_SYMLINK_NOFOLLOW) on each
// entry's name in a directory opened beneath the staged workspace bind
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
// RESOLVE_NO_XDEV, O_PATH | O_DIRECTORY | O_NOFOLLOW). It never opens a
// file that is not a directory, never reads a worktree file's bytes and
// never writes: the caller writes the bytes it returns into the run dir.
//
// An entry is vouched only when Git at its default check (checkStat
// default, trustctime true) would call it clean without reading it: a
// stage-0 regular file (100644 or 100755) without the assume-valid,
// skip-worktree or intent-to-add flag, whose name resolves with no link
// in any component to a regular file with the entry's exec bit, size,
// mtime and ctime (seconds and nanoseconds), inode, uid and gid (as the
// index stores them, 32 bits), and whose recorded mtime is before the
// index file's own, in whole seconds: not racily clean (Git's
// is_racy_timestamp, the stricter of its two builds). That is stricter
// than what the sandbox's git checks (checkStat minimal, trustctime
// false).
//
// The ordering (why a change is never lost between the check and Git's
// first query): the watcher's inotify watches are in place before the
// token is taken (fsmonitor.Watch returned), the token is taken (its
// queue drained) before the first fstatat, and Git's first query sends
// that token. A change whose system call returned before the token was
// taken happened before the sweep, so the sweep sees its result in the
// stat data (a write moves mtime and ctime, a rename or a chmod moves
// ctime, a delete or a swap makes the name something else) and does not
// vouch for the entry. A change whose event the kernel queues after the
// drain is after the token: Since names it, and Git invalidates the entry
// before it trusts the extension's bit. The kernel queues an event before
// the system call that made it returns, so no change falls between the
// two. What the watcher cannot vouch for (a dropped watch, an overflow)
// it answers "/", and Git then checks every entry: the vouch only ever
// spares the lstats of entries nothing touched.
package vouch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
)

// MaxIndexBytes bounds the seed index a vouch reads (a million-entry
// index is about 100 MB); a larger one is not vouched for.
const MaxIndexBytes = 128 << 20

// Why no index is vouched for, for errors.Is; the launch result carries
// the message.
var (
	ErrNoIndex  = errors.New("the worktree's Git dir has no index")
	ErrTooLarge = fmt.Errorf("the index is larger than %d bytes", MaxIndexBytes)
	ErrToken    = errors.New("not a token the monitor's protocol carries")
	// ErrNotTop is a workspace with no .git of its own: not the
	// worktree's top, so the index's names are not relative to it (and
	// the hook, which answers only there, would fail every query).
	ErrNotTop = errors.New("the workspace is not the top of a worktree (no .git in it)")
)

// Result is a vouched index and its counts.
type Result struct {
	// Index is the seed index with the fsmonitor extension; the sandbox's
	// git starts from it.
	Index []byte
	// Vouched and NotVouched count the index's entries (NotVouched
	// includes what is never vouched for: gitlinks, links, unmerged,
	// skip-worktree and intent-to-add entries).
	Vouched, NotVouched int
}

const (
	resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
	dirFlags     = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
)

// Vouch reads the index beneath seedDir (the staged bind of the
// worktree's real Git dir) and checks its entries beneath workspace (the
// staged workspace bind, the watcher's root). token is the watcher's,
// taken (Watcher.Token) after Watch returned and before this call. An
// error says why nothing is vouched for: the start script then copies the
// seed's index as it is, and Git scans in full.
func Vouch(seedDir, workspace, token string) (*Result, error) {
	if !fsmonitor.ValidToken(token) {
		return nil, ErrToken
	}
	data, indexMtime, err := readIndex(seedDir)
	if err != nil {
		return nil, err
	}
	ix, err := gitindex.Read(data)
	if err != nil {
		return nil, fmt.Errorf("the seed index: %w", err)
	}
	ws, err := unix.Open(workspace, dirFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the workspace: %w", err)
	}
	defer unix.Close(ws)
	var top unix.Stat_t
	if err := unix.Fstatat(ws, ".git", &top, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, ErrNotTop
	}
	dirty := sweep(ix, ws, indexMtime)
	res := &Result{Index: build(data, ix, token, dirty)}
	for _, d := range dirty {
		if d {
			res.NotVouched++
		} else {
			res.Vouched++
		}
	}
	return res, nil
}

// readIndex reads seedDir's index through one descriptor, opened beneath
// it without following a link, and returns its bytes and the mtime fstat
// gives on that descriptor (the racy check's reference).
func readIndex(seedDir string) ([]byte, unix.Timespec, error) {
	var none unix.Timespec
	dfd, err := unix.Open(seedDir, dirFlags, 0)
	if err != nil {
		return nil, none, fmt.Errorf("opening the Git dir: %w", err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, "index", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC, Resolve: resolveFlags})
	if errors.Is(err, unix.ENOENT) {
		return nil, none, ErrNoIndex
	}
	if err != nil {
		return nil, none, fmt.Errorf("opening the index: %w", err)
	}
	f := os.NewFile(uintptr(fd), "index")
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, none, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, none, errors.New("the index is not a regular file")
	}
	if st.Size > MaxIndexBytes {
		return nil, none, ErrTooLarge
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxIndexBytes+1))
	if err != nil {
		return nil, none, fmt.Errorf("reading the index: %w", err)
	}
	if len(data) > MaxIndexBytes {
		return nil, none, ErrTooLarge
	}
	return data, st.Mtim, nil
}

// sweep returns, per entry in index order, whether it is not vouched for.
func sweep(ix *gitindex.Index, ws int, indexMtime unix.Timespec) []bool {
	dirty := make([]bool, len(ix.Entries))
	dirs := dirChain{root: ws}
	defer dirs.close()
	for i, e := range ix.Entries {
		dirty[i] = !vouchable(e, indexMtime) || !unchanged(e, &dirs)
	}
	return dirty
}

// vouchable is what the index alone decides: a stage-0 regular file with
// no flag that makes Git skip or special-case it, not racily clean.
func vouchable(e gitindex.Entry, indexMtime unix.Timespec) bool {
	if e.Stage != 0 || (e.Mode != 0o100644 && e.Mode != 0o100755) || e.AssumeValid || e.SkipWorktree || e.IntentToAdd {
		return false
	}
	// Racily clean: recorded in the second the index was written, or
	// after. Git built with USE_NSEC compares nanoseconds too; whole
	// seconds is the stricter of the two.
	return int64(e.Stat.MtimeSec) < indexMtime.Sec && indexMtime.Sec <= 0xffffffff
}

// unchanged stats e's name beneath the workspace and compares what the
// index recorded.
func unchanged(e gitindex.Entry, dirs *dirChain) bool {
	dir, base := "", e.Name
	if i := strings.LastIndexByte(e.Name, '/'); i >= 0 {
		dir, base = e.Name[:i], e.Name[i+1:]
	}
	dfd, ok := dirs.open(dir)
	if !ok {
		return false
	}
	var st unix.Stat_t
	if unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	s := e.Stat
	return (st.Mode&0o100 != 0) == (e.Mode == 0o100755) &&
		st.Size >= 0 && uint64(st.Size) == uint64(s.Size) &&
		uint32(st.Mtim.Sec) == s.MtimeSec && uint32(st.Mtim.Nsec) == s.MtimeNsec &&
		uint32(st.Ctim.Sec) == s.CtimeSec && uint32(st.Ctim.Nsec) == s.CtimeNsec &&
		uint32(st.Ino) == s.Ino && st.Uid == s.UID && st.Gid == s.GID
}

// dirChain holds descriptors of the directories from the workspace down
// to the one last asked for, each opened beneath its parent's: index
// order visits a directory's entries and subdirectories together, so a
// directory is opened about once per visit and at most its depth of
// descriptors are open at a time.
type dirChain struct {
	root  int
	names []string // components of the directory held
	fds   []int    // fds[i] is names[:i+1]; -1 past a component that failed
}

// open returns a descriptor of dir (slash-separated, "" for the root), or
// false when a component is a link, not a directory, gone or a mount.
func (c *dirChain) open(dir string) (int, bool) {
	var want []string
	if dir != "" {
		want = strings.Split(dir, "/")
	}
	keep := 0
	for keep < len(c.names) && keep < len(want) && c.names[keep] == want[keep] {
		keep++
	}
	for len(c.names) > keep {
		n := len(c.names) - 1
		if c.fds[n] >= 0 {
			unix.Close(c.fds[n])
		}
		c.names, c.fds = c.names[:n], c.fds[:n]
	}
	parent := c.root
	if keep > 0 {
		parent = c.fds[keep-1]
	}
	for _, name := range want[keep:] {
		fd := -1
		if parent >= 0 {
			var err error
			if fd, err = unix.Openat2(parent, name, &unix.OpenHow{Flags: dirFlags, Resolve: resolveFlags}); err != nil {
				fd = -1
			}
		}
		c.names, c.fds = append(c.names, name), append(c.fds, fd)
		parent = fd
	}
	return parent, parent >= 0
}

func (c *dirChain) close() {
	for _, fd := range c.fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	c.names, c.fds = nil, nil
}

// dropped are the extensions the vouched index leaves out: the seed's own
// fsmonitor data, the offsets table (EOIE, IEOT) a new extension would
// make wrong, and the untracked cache (UNTR), whose directories Git
// trusts without a stat once an fsmonitor extension is present, while
// host git recorded them without a monitor. Without it the sandbox's git
// builds its untracked cache afresh (core.untrackedCache), as it does
// today when the index carries no fsmonitor extension.
var dropped = map[string]bool{"FSMN": true, "EOIE": true, "IEOT": true, "UNTR": true}

// build is the seed's bytes with the dropped extensions left out, an
// fsmonitor extension (version 2: the token, then an EWAH bitmap whose
// set bits are the entries not vouched for; gitindex.AppendFSMonitor)
// appended and the checksum recomputed with the index's own hash.
func build(data []byte, ix *gitindex.Index, token string, dirty []bool) []byte {
	out := make([]byte, 0, len(data)+64+len(token)+len(dirty)/8)
	out = append(out, data[:ix.EntriesEnd]...)
	for _, x := range ix.Extensions {
		if !dropped[x.Sig] {
			out = append(out, data[x.Off:x.Off+8+x.Size]...)
		}
	}
	out = gitindex.AppendFSMonitor(out, token, dirty)
	h := ix.NewHash()
	h.Write(out)
	return h.Sum(out)
}
