// Package fsmonitor answers the sandbox's git, from the host, which names
// in the workspace changed since it last asked: Git's fsmonitor protocol 2
// (core.fsmonitor, githooks(5) "fsmonitor-watchman"), so a `git status`
// in the sandbox lstats the turn's changes instead of every tracked file
// through the gofer (docs/spec.md, "An agent's tools and the file path").
//
// A Watcher holds inotify watches on the workspace's directories, each
// added through a descriptor opened beneath the workspace's own descriptor
// with openat2 (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV, O_NOFOLLOW | O_DIRECTORY), so a
// symlink, a mount point or a name swapped under it leads it nowhere. It
// never opens a file that is not a directory, never reads a file's bytes
// and never writes: it reads directory entries and names. It keeps a
// journal of changed names (a sequence number each) and answers one typed
// request on a Unix socket (server.go): "since TOKEN" -> a new token and
// the names changed since TOKEN, or "/" (everything changed, Git's own
// fail-safe: a full scan) whenever it cannot vouch for the list: a token
// it did not issue or no longer holds, an inotify queue overflow, a watch
// it could not add, a reply past its count or byte limit.
//
// A close or attribute event on a file whose inode, size and times are
// still those the watcher read when it last named it is left out
// (times.go): gVisor's gofer keeps a host descriptor open for as long as
// the Sentry caches the file, so the close of a file the agent wrote
// seconds ago reaches inotify whenever the Sentry drops it (a later `git
// status` walking the tree drops hundreds), and without this every such
// close would hand Git names it has already read again.
//
// The launcher runs it in its own process, as root: every name it opens is
// a directory beneath the staged workspace mount, opened as above, and the
// only thing that leaves it is a list of names inside the workspace, sent
// to the sandbox that can list them itself. An unprivileged uid would
// differ only on a directory the agent made unreadable: root still lists
// its names (to the agent who made it).
package fsmonitor

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limits bound what a Watcher keeps and answers.
type Limits struct {
	// Paths and Bytes bound one reply's list; past either the reply is
	// "everything changed".
	Paths int
	Bytes int
	// Journal is how many changed names are kept; past it the older half
	// is dropped and tokens from before it get "everything changed".
	Journal int
	// Watches bounds the directories watched (one inotify watch each, out
	// of the host user's fs.inotify.max_user_watches, which every root
	// process shares): past it every watch is dropped and every answer is
	// "everything", so an agent making directories by the hundred
	// thousand costs the host nothing more.
	Watches int
	// Times bounds the names whose inode, size and times are kept
	// (times.go); past it every event on a new name is named, as with
	// none kept.
	Times int
}

// DefaultLimits are the launcher's.
var DefaultLimits = Limits{Paths: 20000, Bytes: 1 << 20, Journal: 1 << 16, Watches: 16384, Times: 1 << 16}

const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

const openFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Everything is the one name that tells Git every path may have changed.
const Everything = "/"

type entry struct {
	seq  uint64
	name string
}

// Stats count what a Watcher did, for tests and the result.
type Stats struct {
	Watches    int    // directories watched now
	Events     uint64 // inotify events read
	Overflows  uint64 // queue overflows (each answered "everything")
	Everything uint64 // replies that were "everything changed"
	Lists      uint64 // replies that were a list
	Unchanged  uint64 // close and attribute events left out: nothing Git reads had changed
	Degraded   bool   // a watch could not be held: every reply is "everything"
}

// Watcher watches one directory tree.
type Watcher struct {
	limits Limits
	inst   string

	mu       sync.Mutex
	root     int // O_PATH descriptor of the tree's root
	ifd      int // inotify, non-blocking
	wds      map[int32]string
	times    map[string]fileTime // times.go
	seq      uint64
	issued   uint64 // the last sequence number handed out in a token
	floor    uint64 // tokens below it are answered "everything"
	journal  []entry
	degraded bool
	stats    Stats
	closed   bool

	stop chan struct{}
	done chan struct{}
}

// Watch opens root (an absolute path, not following a symlink at its last
// component) and watches every directory beneath it. What it cannot watch
// makes it degraded (every answer "everything"), not an error; an error is
// a root it cannot open or an inotify it cannot make.
func Watch(root string, lim Limits) (*Watcher, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fsmonitor: opening the workspace: %w", err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		unix.Close(rfd)
		return nil, err
	}
	w := &Watcher{limits: lim, inst: hex.EncodeToString(b[:]), root: rfd, ifd: -1, wds: map[int32]string{}, times: map[string]fileTime{},
		stop: make(chan struct{}), done: make(chan struct{})}
	// Out of inotify instances (fs.inotify.max_user_instances, which every
	// root process shares), the watcher is degraded, not an error: every
	// answer is "everything", and git scans as it would without it.
	w.ifd, err = unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		w.ifd, w.degraded = -1, true
		close(w.done)
		return w, nil
	}
	w.mu.Lock()
	w.addTree("", false)
	w.mu.Unlock()
	go w.loop()
	return w, nil
}

// Close stops the watcher and releases its descriptors.
func (w *Watcher) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if w.ifd >= 0 {
		err = unix.Close(w.ifd)
	}
	return errors.Join(err, unix.Close(w.root))
}

// Stats returns the counters now.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Watches, s.Degraded = len(w.wds), w.degraded
	return s
}

// loop drains the inotify queue as events come, so the kernel's queue
// rarely fills; Since drains it again before it answers.
func (w *Watcher) loop() {
	defer close(w.done)
	fds := []unix.PollFd{{Fd: int32(w.ifd), Events: unix.POLLIN}}
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		n, err := unix.Poll(fds, 100)
		if err != nil && err != unix.EINTR {
			w.mu.Lock()
			w.degraded = true
			w.mu.Unlock()
			return
		}
		if n > 0 {
			w.mu.Lock()
			w.drain()
			w.mu.Unlock()
		}
	}
}

// Since answers Git's question: the names changed since token, and the
// token to ask with next. Every event the kernel queued before the call
// (every change whose system call returned) is in the answer: the queue
// is drained first. names is [Everything] when the list cannot be vouched
// for.
func (w *Watcher) Since(token string) (next string, names []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed && w.ifd >= 0 {
		w.drain()
	}
	next = w.token()
	w.issued = w.seq
	from, ok := w.parse(token)
	if !ok || w.degraded || w.closed {
		w.stats.Everything++
		return next, []string{Everything}
	}
	seen := map[string]bool{}
	bytes := 0
	for i := w.firstAfter(from); i < len(w.journal); i++ {
		n := w.journal[i].name
		if seen[n] {
			continue
		}
		seen[n] = true
		bytes += len(n) + 1
		names = append(names, n)
		if len(names) > w.limits.Paths || bytes > w.limits.Bytes {
			w.stats.Everything++
			return next, []string{Everything}
		}
	}
	w.stats.Lists++
	return next, names
}

// Token issues a token Since honours, naming this moment: the queue is
// drained first, so a change whose event the kernel queued before the
// call is before the token and every later one is after it (Since names
// it). The launcher's vouch (runtime/launcher/fsmonitor/vouch) takes one
// after Watch returned and before it reads the workspace, and hands it to
// the sandbox's git in the index it writes.
func (w *Watcher) Token() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed && w.ifd >= 0 {
		w.drain()
	}
	w.issued = w.seq
	return w.token()
}

func (w *Watcher) token() string { return "pp1:" + w.inst + ":" + strconv.FormatUint(w.seq, 10) }

// parse returns the sequence number of a token this watcher issued and
// still answers for.
func (w *Watcher) parse(token string) (uint64, bool) {
	rest, ok := strings.CutPrefix(token, "pp1:"+w.inst+":")
	if !ok {
		return 0, false
	}
	s, err := strconv.ParseUint(rest, 10, 64)
	if err != nil || s > w.seq || s < w.floor || strconv.FormatUint(s, 10) != rest {
		return 0, false
	}
	return s, true
}

func (w *Watcher) firstAfter(seq uint64) int {
	lo, hi := 0, len(w.journal)
	for lo < hi {
		m := (lo + hi) / 2
		if w.journal[m].seq <= seq {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// note records a changed name (relative to the root, no leading slash).
func (w *Watcher) note(name string) {
	if k := len(w.journal); k > 0 && w.journal[k-1].name == name && w.journal[k-1].seq > w.issued {
		return // no token was issued since the same name was noted
	}
	w.seq++
	w.journal = append(w.journal, entry{w.seq, name})
	if len(w.journal) > w.limits.Journal {
		drop := len(w.journal) / 2
		w.journal = append(w.journal[:0:0], w.journal[drop:]...)
		w.floor = w.journal[0].seq - 1
	}
}

// distrust makes every token issued so far answer "everything".
func (w *Watcher) distrust() {
	w.seq++
	w.floor = w.seq
	w.journal = nil
	clear(w.times)
}

// drain reads every queued event (the caller holds mu).
func (w *Watcher) drain() {
	var buf [64 << 10]byte
	for {
		n, err := unix.Read(w.ifd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return // EAGAIN: the queue is empty
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := string(buf[off+unix.SizeofInotifyEvent : end])
			if i := strings.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			w.stats.Events++
			w.event(ev.Wd, ev.Mask, name)
			off = end
		}
	}
}

// event handles one inotify event.
func (w *Watcher) event(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		// Events were lost: nothing issued so far can be vouched for, and
		// directories made meanwhile may be unwatched. Watch again.
		w.stats.Overflows++
		w.rewatch()
		return
	}
	dir, ok := w.wds[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, wd)
		if ok && dir == "" {
			w.degrade() // the root itself went away
		}
		return
	}
	if !ok {
		return // a watch removed since (its directory moved or went away; reported then)
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0 {
		if dir == "" {
			w.degrade()
		}
		return // the parent's event names it
	}
	if name == "" {
		return
	}
	rel := join(dir, name)
	if ev := mask &^ unix.IN_ISDIR; (ev == unix.IN_CLOSE_WRITE || ev == unix.IN_ATTRIB) && w.unchanged(dir, name) {
		w.stats.Unchanged++
		return
	}
	w.note(rel)
	w.remember(dir, name)
	if mask&unix.IN_ISDIR == 0 {
		return
	}
	w.note(rel + "/")
	switch {
	case mask&(unix.IN_MOVED_FROM|unix.IN_DELETE) != 0:
		w.unwatch(rel)
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		if dir == "" && name == ".git" {
			return
		}
		w.unwatch(rel) // a directory moved over one watched
		w.addTree(rel, true)
	}
}

// unwatch removes the watches of rel and every directory beneath it.
func (w *Watcher) unwatch(rel string) {
	for wd, d := range w.wds {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			unix.InotifyRmWatch(w.ifd, uint32(wd))
			delete(w.wds, wd)
		}
	}
}

func (w *Watcher) degrade() {
	w.degraded = true
	w.distrust()
	for wd := range w.wds {
		unix.InotifyRmWatch(w.ifd, uint32(wd))
	}
	clear(w.wds)
}

// rewatch drops every watch and watches the tree again.
func (w *Watcher) rewatch() {
	for wd := range w.wds {
		unix.InotifyRmWatch(w.ifd, uint32(wd))
	}
	clear(w.wds)
	w.distrust()
	w.addTree("", false)
}

// addTree watches rel and the directories beneath it. With report, every
// name found is noted (the directory is new to the watcher: whatever was
// made in it before its watch held is in the list). Failing to watch a
// directory that exists degrades the watcher; one that is gone or is not a
// directory (a symlink, a file swapped in) is only a name.
func (w *Watcher) addTree(rel string, report bool) {
	stack := []string{rel}
	for len(stack) > 0 && !w.degraded {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		subs, err := w.addDir(d, report)
		if err != nil {
			if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
				w.degrade()
				return
			}
			if d == "" {
				w.degrade()
				return
			}
			continue
		}
		stack = append(stack, subs...)
	}
}

// addDir watches one directory through a descriptor opened beneath the
// root and returns its subdirectories.
func (w *Watcher) addDir(rel string, report bool) ([]string, error) {
	fd := w.root
	if rel != "" {
		var err error
		fd, err = unix.Openat2(w.root, rel, &unix.OpenHow{Flags: openFlags, Resolve: resolveFlags})
		if err != nil {
			if err == unix.EXDEV {
				return nil, fmt.Errorf("%s: a mount point: %w", rel, err)
			}
			return nil, err
		}
		defer unix.Close(fd)
	} else {
		// The root descriptor is O_PATH: open it for reading its entries.
		var err error
		fd, err = unix.Openat2(w.root, ".", &unix.OpenHow{Flags: openFlags, Resolve: resolveFlags})
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
	}
	if len(w.wds) >= w.limits.Watches {
		return nil, fmt.Errorf("watching %q: past the limit of %d directories", rel, w.limits.Watches)
	}
	wd, err := unix.InotifyAddWatch(w.ifd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if err != nil {
		return nil, fmt.Errorf("watching %q: %w", rel, err)
	}
	w.wds[int32(wd)] = rel
	var subs []string
	err = readDir(fd, func(name string, typ uint8) {
		p := join(rel, name)
		if typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				typ = unix.DT_DIR
			}
		}
		if report {
			w.note(p)
		}
		if typ == unix.DT_DIR {
			if report {
				w.note(p + "/")
			}
			if !(rel == "" && name == ".git") {
				subs = append(subs, p)
			}
		}
	})
	return subs, err
}

// readDir calls f with each entry's name and type (DT_*), without "." and
// "..".
func readDir(fd int, f func(name string, typ uint8)) error {
	var buf [32 << 10]byte
	for {
		n, err := unix.Getdents(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		for off := 0; off < n; {
			d := (*unix.Dirent)(unsafe.Pointer(&buf[off]))
			if d.Reclen == 0 || off+int(d.Reclen) > n {
				return fmt.Errorf("getdents: a malformed record")
			}
			nameOff := int(unsafe.Offsetof(d.Name))
			raw := buf[off+nameOff : off+int(d.Reclen)]
			name := string(raw)
			if i := strings.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			off += int(d.Reclen)
			if name == "." || name == ".." || name == "" {
				continue
			}
			f(name, d.Type)
		}
	}
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return path.Join(dir, name)
}
