package fsmonitor

import (
	"golang.org/x/sys/unix"
)

// Closes and attribute events that change nothing (see the package comment)
//
// The watcher keeps, for each name it names, the inode, size,
// modification and change time it read when it named it (a stat beneath
// the workspace's descriptor, not following a link: never an open of a
// file). A close-after-write (IN_CLOSE_WRITE) or attribute (IN_ATTRIB)
// event on a name whose four values are still the kept ones is left out of
// the journal. Every other event (a write, a truncation, a create, a
// delete, a rename) is always named, whatever the times say.
//
// Why that cannot hide a change from Git: every kept value was read while
// an event naming the same name, or a name in the same directory, was
// drained (the name is then in the journal, and Git lstats it, or reads
// its directory again, only after the answer that names it, so after the
// read). Git therefore holds a state at least as new as the kept one. A
// write or truncation since then has its own event, named. What a close
// or attribute event can stand for alone (a write through a shared
// mapping: no write event, the kernel moves the times at the page fault;
// a chmod, chown or utimensat; an extended attribute) moves the change
// time, which the kernel sets and no process can choose, so it no longer
// matches and the event is named. The one gap is a clock that does not
// tick between two changes: a mapped write in the same timestamp tick as
// the change last read. Kernels with multigrain timestamps (Linux 6.13 and
// later, on ext4, xfs, btrfs and tmpfs) close it: once a stat has read the
// change time, the next change gets a fine-grained, different one, and
// this stat always reads it. A name with nothing kept (not named since the
// watch began, past Limits.Times, or since an overflow made the journal
// start again) is named, as before. No clock is compared: only a recorded
// value with the same inode's value now.

// fileTime is what is kept of a name.
type fileTime struct {
	ino, size    int64
	mtime, ctime unix.Timespec
}

func timeOf(st *unix.Stat_t) fileTime {
	return fileTime{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// keepStat stats name beneath fd (fd's directory itself for an empty
// name) and keeps its values under rel; it returns the stat, and whether
// it could be read.
func (w *Watcher) keepStat(rel string, fd int, name string, flags int) (unix.Stat_t, bool) {
	var st unix.Stat_t
	var err error
	if name == "" {
		err = unix.Fstat(fd, &st)
	} else {
		err = unix.Fstatat(fd, name, &st, flags)
	}
	if err != nil {
		delete(w.times, rel)
		return st, false
	}
	if _, ok := w.times[rel]; ok || len(w.times) < w.limits.Times {
		w.times[rel] = timeOf(&st)
	}
	return st, true
}

// openDir opens dir (relative to the root; "" the root) as a path
// descriptor beneath the root, never through a link or a mount.
func (w *Watcher) openDir(dir string) (int, error) {
	if dir == "" {
		dir = "."
	}
	return unix.Openat2(w.root, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveFlags})
}

// unchanged reports whether dir/name's values are still the kept ones.
func (w *Watcher) unchanged(dir, name string) bool {
	kept, ok := w.times[join(dir, name)]
	if !ok {
		return false
	}
	fd, err := w.openDir(dir)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return timeOf(&st) == kept
}

// remember keeps dir/name's values and dir's own, as of this event (the
// name is being noted, and so a name in dir: Git reads both again after
// the answer that names them).
func (w *Watcher) remember(dir, name string) {
	if w.limits.Times == 0 {
		return
	}
	fd, err := w.openDir(dir)
	if err != nil {
		delete(w.times, join(dir, name))
		return
	}
	defer unix.Close(fd)
	w.keepStat(join(dir, name), fd, name, unix.AT_SYMLINK_NOFOLLOW)
	if dir != "" {
		w.keepStat(dir, fd, "", 0)
	}
}
