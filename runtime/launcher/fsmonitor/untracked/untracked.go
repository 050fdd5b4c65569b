// Package untracked adds an untracked cache (Git's UNTR extension) to the
// vouched index (runtime/launcher/fsmonitor/vouch), so the first `git
// status` in a new sandbox trusts every directory nothing changed since
// the watcher's token, as the second does, instead of opening and reading
// every directory of the workspace through the gofer (docs/spec.md, "An
// agent's tools and the file path").
//
// Git, not this package, decides what is untracked: gitignore's rules
// (negation, `**`, directory-only patterns, a directory checked only for
// being non-empty, hidden empty directories) are the image's git's, the
// same build the sandbox runs, so the cache holds what the sandbox's git
// would have written itself. The launcher runs that git once, after the
// vouch, in the search jail (nativesearch.Jail.RunGit: the agent's uid,
// its own namespaces, the workspace and the image's /usr read-only,
// Landlock, no capability, no_new_privs, seccomp, the rlimits, killed past
// its wall time), with the workspace at the path the sandbox's git sees
// it, a scratch Git dir (HEAD unborn, no objects, no hooks, the sandbox's
// info/exclude) and a copy of the vouched index as its index, and `git
// status`, with core.untrackedCache on and core.fsmonitor off, writes that
// index back with an untracked cache. Splice takes that extension,
// checks it is one the sandbox's git will use (its ident names the
// sandbox's worktree and the system gVisor reports, Linux; the
// directory flags are `status`'s default; the per-directory file is
// .gitignore), and appends it to the vouched index (the checksum
// recomputed). Besides it, it takes the stat data of the entries that git
// refreshed (hashed and found unchanged) and marks them valid in the
// fsmonitor extension (refresh.go); every other byte of the entries is
// the vouched index's. Anything that fails leaves the vouched index as it
// was, and anything unexpected in the refreshed entries leaves the cache
// alone: a slower first status, never a wrong one.
//
// Why the cache is never wrong for the sandbox's git. The extension
// carries, per directory, the untracked names found and a valid bit, and
// the hashes of the .gitignore, info/exclude and core.excludesFile it
// was built from. Once an index has an fsmonitor extension and the
// monitor answers with a list, Git trusts a directory's valid bit without
// an lstat (dir.c valid_cached_dir), after it has invalidated the
// directory of every name the monitor named and each directory above it
// (fsmonitor_refresh_callback, untracked_cache_invalidate_path). The
// build runs after the vouch's token was taken (the same token: the
// watches were in place before it), so, as in vouch's argument, a change
// whose system call returned before the token is in the directories git
// reads during the build, and one after it is in the monitor's answer to
// the sandbox's first query (that token is the FSMN's), which invalidates
// its directory; a change in between is in both. A new directory is named
// with everything in it (fsmonitor.Watcher reports a directory it starts
// watching whole), a removed one with the names that went with it. What
// Git checks itself stays checked: a .gitignore's content is hashed again
// wherever the cache recorded one, info/exclude and core.excludesFile
// are hashed on every status (a different file invalidates the whole
// cache), an ident that is not the worktree's and system's makes Git drop
// the cache, other directory flags make it ignore it, and a monitor answer
// of "everything" (a degraded watcher, an unknown token) turns the trust
// off (use_fsmonitor = 0): every directory is then lstat'ed and, its stat
// data being the host's, read again.
//
// What the jailed git reads is the agent's (the workspace's files,
// .gitignore files, links, directories); what it produces is bytes the
// sandbox's git reads, in a file the start script copies into the
// sandbox's private Git dir (a tmpfs no host git reads): the agent could
// write any index there itself. The launcher reads only the extension's
// bytes, bounded, through a descriptor opened beneath a scratch directory
// it made, after the jail is gone.
package untracked

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/gitindex"
	"paseo.dev/paseo-policy/runtime/launcher/nativesearch"
)

// MaxIndexBytes bounds the index git writes (and every file it writes in
// the scratch directory, RLIMIT_FSIZE); the vouched index is bounded alike.
const MaxIndexBytes = 128 << 20

// System is the system name the sandbox's git puts in the cache's ident:
// gVisor's uname(2) reports Linux, as the host does.
const System = "Linux"

// dirFlags are the flags `git status` scans with by default
// (status.showUntrackedFiles normal: DIR_SHOW_OTHER_DIRECTORIES |
// DIR_HIDE_EMPTY_DIRECTORIES), and so the flags Git writes a new cache
// with. A cache with others is not used by a default status.
const dirFlags = 1<<1 | 1<<2

// Why no cache was spliced, for errors.Is; the launch result carries the
// message.
var (
	ErrNoCache  = errors.New("git wrote no untracked cache")
	ErrMismatch = errors.New("git's index is not the vouched index's entries")
	ErrNoFSMN   = errors.New("the vouched index has no fsmonitor extension")
	ErrTooLarge = fmt.Errorf("the index is larger than %d bytes", MaxIndexBytes)
)

// Ident is the ident Git writes in, and requires of, an untracked cache
// for worktree (dir.c set_untracked_ident: "Location %s, system %s" and a
// NUL).
func Ident(worktree string) string {
	return "Location " + worktree + ", system " + System + "\x00"
}

// Spliced is the vouched index with what Splice took from git's.
type Spliced struct {
	Index []byte
	// Refreshed counts the entries the vouch did not vouch for whose stat
	// data git refreshed (it hashed the file and found the entry's
	// object) and the index now carries and marks valid; Skipped those
	// git refreshed that were not taken (racily clean, a size Git reads
	// as smudged). RefreshReason says why none was looked at, if so.
	Refreshed, Skipped int
	RefreshReason      string
}

// Splice returns vouched (an index with an fsmonitor extension and no
// untracked cache, vouch.Vouch's) with the untracked cache of built (the
// index git wrote from a copy of vouched) appended, the stat data of the
// entries git refreshed taken (refresh.go; racy is the time from which an
// entry's recorded mtime makes it racily clean, whole seconds; the zero
// time takes none), and the checksum recomputed. built is untrusted: it
// is parsed whole, its entries must be vouched's names in order, and its
// cache's ident, flags and per-directory file name must be those the
// sandbox's git uses for worktree.
func Splice(vouched, built []byte, worktree string, racy time.Time) (*Spliced, error) {
	if len(built) > MaxIndexBytes || len(vouched) > MaxIndexBytes {
		return nil, ErrTooLarge
	}
	vx, err := gitindex.Read(vouched)
	if err != nil {
		return nil, fmt.Errorf("the vouched index: %w", err)
	}
	bx, err := gitindex.Read(built)
	if err != nil {
		return nil, fmt.Errorf("git's index: %w", err)
	}
	hashLen := vx.NewHash().Size()
	if bx.NewHash().Size() != hashLen {
		return nil, fmt.Errorf("%w: another object format", ErrMismatch)
	}
	if len(vx.Entries) != len(bx.Entries) {
		return nil, fmt.Errorf("%w: %d entries, not %d", ErrMismatch, len(bx.Entries), len(vx.Entries))
	}
	for i := range vx.Entries {
		if vx.Entries[i].Name != bx.Entries[i].Name || vx.Entries[i].Stage != bx.Entries[i].Stage {
			return nil, fmt.Errorf("%w: entry %d", ErrMismatch, i)
		}
	}
	fsmn := false
	for _, x := range vx.Extensions {
		switch x.Sig {
		case "FSMN":
			fsmn = true
		case "UNTR", "EOIE", "IEOT":
			return nil, fmt.Errorf("the vouched index already has an extension %s", x.Sig)
		}
	}
	if !fsmn {
		return nil, ErrNoFSMN
	}
	var untr []byte
	for _, x := range bx.Extensions {
		if x.Sig == "UNTR" {
			if untr != nil {
				return nil, errors.New("git's index has two untracked caches")
			}
			untr = built[x.Off : x.Off+8+x.Size]
		}
	}
	if untr == nil {
		return nil, ErrNoCache
	}
	if err := checkHeader(untr[8:], worktree, hashLen); err != nil {
		return nil, err
	}
	res := &Spliced{}
	body := vouched[:len(vouched)-hashLen]
	if r, err := refreshed(vouched, vx, built, bx, racy); err != nil {
		// Anything unexpected in what git refreshed costs the refreshed
		// entries only: the cache is spliced as before.
		res.RefreshReason = err.Error()
	} else {
		body, res.Refreshed, res.Skipped = r.body, r.taken, r.skipped
	}
	out := make([]byte, 0, len(body)+len(untr)+hashLen)
	out = append(out, body...)
	out = append(out, untr...)
	h := vx.NewHash()
	h.Write(out)
	res.Index = h.Sum(out)
	return res, nil
}

// statDataBytes is Git's on-disk stat_data (ctime, mtime, dev, ino, uid,
// gid, size: ten 32-bit words less one, 36 bytes); the cache's header
// holds two (info/exclude's and core.excludesFile's) and the flags.
const statDataBytes = 36

// checkHeader checks the cache's header (dir.c write_untracked_extension):
// the ident (a varint length and the bytes), the two stat data, the
// directory flags, the two files' object names and the per-directory
// file's name. The rest (the directory tree) is the sandbox's git's to
// read, as it reads any index the agent could write.
func checkHeader(p []byte, worktree string, hashLen int) error {
	n, w, err := gitindex.Varint(p)
	if err != nil || n > uint64(len(p)-w) {
		return errors.New("the untracked cache's ident is cut short")
	}
	ident := string(p[w : w+int(n)])
	if want := Ident(worktree); ident != want {
		return fmt.Errorf("the untracked cache's ident is %q, the sandbox's git wants %q", strings.TrimSuffix(ident, "\x00"), strings.TrimSuffix(want, "\x00"))
	}
	p = p[w+int(n):]
	if len(p) < 2*statDataBytes+4+2*hashLen+1 {
		return errors.New("the untracked cache's header is cut short")
	}
	if f := binary.BigEndian.Uint32(p[2*statDataBytes:]); f != dirFlags {
		return fmt.Errorf("the untracked cache's directory flags are %#x, not status's %#x", f, dirFlags)
	}
	p = p[2*statDataBytes+4+2*hashLen:]
	if i := bytes.IndexByte(p, 0); i < 0 || string(p[:i]) != ".gitignore" {
		return errors.New("the untracked cache's per-directory file is not .gitignore")
	}
	return nil
}

// Options are what Build needs besides the index.
type Options struct {
	// Jail runs the image's git (its Dest is the worktree's path in the
	// sandbox; its UID and GID the agent's).
	Jail nativesearch.Jail
	// Parent is the host directory the scratch directory is made in:
	// one only root can reach (the run dir).
	Parent string
	// GitConfig are the sandbox process's GIT_CONFIG_COUNT, _KEY_n and
	// _VALUE_n settings, so the jailed git reads what the sandbox's does.
	GitConfig []string
	// Exclude is the info/exclude the sandbox's git reads (nil: none).
	Exclude []byte
	// RefreshOff, when not empty, says why the entries git refreshes are
	// not taken (the sandbox's git could hash their bytes differently:
	// refresh.go); the cache still is.
	RefreshOff string
}

// Build runs the image's git in o.Jail on a copy of vouched and returns
// vouched with the untracked cache git wrote and the entries it
// refreshed (Splice); token is as Finish's.
func Build(ctx context.Context, o Options, vouched []byte, token time.Time) (*Spliced, error) {
	p, err := Start(o)
	if err != nil {
		return nil, err
	}
	return p.Finish(ctx, vouched, token)
}

// A Pending build has its scratch directory made and its jail built and
// confined, waiting for the vouched index: the launcher starts it before
// the watcher walks the tree and the vouch sweeps the index, so the jail's
// start is off the launch's path. Nothing in the jail reads the workspace
// before Finish sends git its request (after the token).
type Pending struct {
	o    Options
	dir  string
	jail *nativesearch.GitJail
	mu   sync.Mutex
	used bool
}

// take marks p used and reports whether it was not.
func (p *Pending) take() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	was := p.used
	p.used = true
	return !was
}

// Start makes the scratch directory (Prepare, without the index) and
// builds the jail.
func Start(o Options) (*Pending, error) {
	dir, err := Prepare(o.Parent, int(o.Jail.UID), int(o.Jail.GID), o.Exclude)
	if err != nil {
		return nil, err
	}
	g, err := o.Jail.PrepareGit(dir, MaxIndexBytes)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Pending{o: o, dir: dir, jail: g}, nil
}

// Finish writes vouched as git's index, runs git, and returns vouched with
// the cache git wrote and the entries it refreshed (Splice). token is a
// time read before the vouch's token was taken. p is used up: its jail
// gone, its scratch directory removed.
func (p *Pending) Finish(ctx context.Context, vouched []byte, token time.Time) (*Spliced, error) {
	if !p.take() {
		return nil, errors.New("the build was used or closed")
	}
	defer os.RemoveAll(p.dir)
	if err := os.WriteFile(filepath.Join(p.dir, "index"), vouched, 0o644); err != nil {
		p.jail.Discard()
		return nil, err
	}
	res, err := p.jail.Run(ctx, Args(), Env(nativesearch.ScratchPath, p.o.Jail.Dest, p.o.GitConfig))
	if err != nil {
		return nil, err
	}
	if res.Exit != 0 {
		return nil, fmt.Errorf("git status exited %d: %s", res.Exit, firstLine(res.Stderr))
	}
	built, written, err := ReadIndex(p.dir)
	if err != nil {
		return nil, err
	}
	if p.o.RefreshOff != "" {
		sp, err := Splice(vouched, built, p.o.Jail.Dest, time.Time{})
		if err == nil {
			sp.RefreshReason = p.o.RefreshOff
		}
		return sp, err
	}
	return Splice(vouched, built, p.o.Jail.Dest, Racy(token, written))
}

// ClockSlack is how far a file's timestamp may lag the clock the
// launcher reads: the kernel stamps files from its coarse clock, up to a
// tick behind (a few milliseconds); this is that with room to spare.
const ClockSlack = 100 * time.Millisecond

// Racy is the time from which Splice holds a refreshed entry racily
// clean: the earlier of the token's time (less ClockSlack) and the
// written index's mtime. The token's is what makes a taken entry safe for
// the sandbox's check (refresh.go): a change after the token is stamped
// in a later second than any entry taken. The index's is Git's own rule.
func Racy(token, written time.Time) time.Time {
	if t := token.Add(-ClockSlack); t.Before(written) {
		return t
	}
	return written
}

// Close ends an unused build: its jail and its scratch directory. It may
// be called more than once, and after Finish (then it does nothing).
func (p *Pending) Close() {
	if !p.take() {
		return
	}
	p.jail.Discard()
	os.RemoveAll(p.dir)
}

// Args is the jailed git's command line: status as the sandbox's first
// one runs it, with the cache on and the monitor off (this git must scan,
// not ask), submodules not entered (the sandbox's git enters none: its
// gitlinks have no Git dir there).
func Args() []string {
	return []string{"-c", "core.untrackedCache=true", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/nonexistent",
		"status", "--porcelain", "--ignore-submodules=all"}
}

// Env is the jailed git's environment, with scratch the scratch
// directory's path as git sees it: the scratch Git dir and index, the
// worktree, no system or global config (the sandbox's git reads none
// either but the Git settings its process carries, gitConfig), and HOME in
// the scratch directory, where no core.excludesFile is.
func Env(scratch, worktree string, gitConfig []string) []string {
	env := []string{"GIT_DIR=" + scratch + "/git", "GIT_WORK_TREE=" + worktree, "GIT_INDEX_FILE=" + scratch + "/index",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + scratch + "/git/no-global-config", "HOME=" + scratch, "LC_ALL=C"}
	for _, kv := range gitConfig {
		if k, _, ok := strings.Cut(kv, "="); ok && gitConfigVar(k) {
			env = append(env, kv)
		}
	}
	return env
}

// gitConfigVar is GIT_CONFIG_COUNT or GIT_CONFIG_KEY_n / GIT_CONFIG_VALUE_n.
func gitConfigVar(k string) bool {
	if k == "GIT_CONFIG_COUNT" {
		return true
	}
	for _, p := range []string{"GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"} {
		if n, ok := strings.CutPrefix(k, p); ok {
			_, err := strconv.ParseUint(n, 10, 16)
			return err == nil
		}
	}
	return false
}

// Prepare makes the scratch directory beneath parent (mode 0700, owned by
// uid and gid, who write the index there) holding a Git dir: HEAD on an
// unborn branch (status then compares the index with nothing: no object
// is read), a config of the format alone, empty objects and refs,
// info/exclude when exclude is not nil. The index (git's GIT_INDEX_FILE,
// "index" in the directory) is the caller's to write.
func Prepare(parent string, uid, gid int, exclude []byte) (string, error) {
	dir, err := os.MkdirTemp(parent, "untracked-")
	if err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	g := filepath.Join(dir, "git")
	for _, d := range []string{g, filepath.Join(g, "objects"), filepath.Join(g, "refs"), filepath.Join(g, "info")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
	}
	files := map[string][]byte{
		filepath.Join(g, "HEAD"):   []byte("ref: refs/heads/paseo-untracked\n"),
		filepath.Join(g, "config"): []byte("[core]\n\trepositoryformatversion = 0\n\tbare = false\n"),
	}
	if exclude != nil {
		files[filepath.Join(g, "info", "exclude")] = exclude
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return "", err
	}
	ok = true
	return dir, nil
}

// ReadIndex reads the index git wrote in the scratch directory dir,
// through a descriptor opened beneath it without following a link, a
// regular file of at most MaxIndexBytes, and returns its bytes and the
// mtime fstat gives on that descriptor.
func ReadIndex(dir string) ([]byte, time.Time, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, "index", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("git's index: %w", err)
	}
	f := os.NewFile(uintptr(fd), "index")
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, time.Time{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, time.Time{}, errors.New("git's index is not a regular file")
	}
	if st.Size > MaxIndexBytes {
		return nil, time.Time{}, ErrTooLarge
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxIndexBytes+1))
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(b) > MaxIndexBytes {
		return nil, time.Time{}, ErrTooLarge
	}
	return b, time.Unix(st.Mtim.Unix()), nil
}

func firstLine(b []byte) string {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}
