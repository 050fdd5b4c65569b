package nativesearch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathform"
)

// cat read with the agent's credentials (docs/spec.md, "cat read by the
// agent's credentials")
//
// A cat runs no program: its answer is the bytes of the files it names,
// in order. So the server copies them itself, from a thread of its own
// whose file-system uid and gid are the agent's, with no supplementary
// group: the kernel's own permission checks (every directory searched,
// the file read) are then the ones the sandbox's cat meets as that uid,
// made atomically at each open, on the object read. Setting the
// file-system uid from 0 to another clears the thread's capabilities that
// bypass them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER:
// capabilities(7)); the thread checks that they are gone, and that its
// file-system ids are the agent's, before it opens anything, and ends
// with its goroutine (locked to it, never unlocked), its credentials
// with it.
//
// Each name is opened beneath a detached copy of the workspace's mount
// (the host's staged bind), read-only and nodev as the jail has it, with
// no link followed and no mount crossed (openat2 RESOLVE_BENEATH,
// NO_SYMLINKS, NO_XDEV) and O_NONBLOCK: a device node does not open on a
// nodev mount, a FIFO opens at once; the bytes are read only when that
// object, by fstat on the same descriptor, is a regular file. Anything
// else (a missing file, a directory, a link, a file the agent may not
// read, a name the sandbox sees through a mount of its own, past the
// spool's room or the wall time) stops the copy at that file: the answer
// says from which file on the rest is the sandbox's own cat's, which then
// gives its own output, messages and exit code for them. So the answer is
// the sandbox's cat's: the bytes of the files before, read here, and the
// sandbox's for the rest.
//
// Where the bytes go: the spool (spool.go), in regions this answer
// reserves, written by sendfile (in the kernel, no copy through the
// server). A frame names only the bytes of files copied whole.

const (
	// catRegion is how much of the spool a cat's answer reserves at a
	// time (the last region's unused rest stays unused until the spool
	// is emptied).
	catRegion = 4 << 20
	// catFrame is how many bytes of whole files the answer gathers before
	// it names them in a frame: each frame costs the client a few system
	// calls under gVisor.
	catFrame = 1 << 20
	// catFileMax is the largest file the server copies: the client holds
	// a frame's bytes whole before it writes them (so that what it wrote
	// always ends where a file does), and a frame holds up to catFrame
	// and one file more. A larger file, and the rest, are the sandbox's.
	catFileMax = 16 << 20
)

// catCopied is the part of a cat's answer done so far.
type catCopied struct {
	files int   // files copied whole, from the first
	bytes int64 // their bytes
}

// catSpan is a run of a cat's output in the spool.
type catSpan struct{ off, n int64 }

// catRead copies the files of r (a checked cat's request) into sp in
// order, with the agent's credentials (above), and calls emit with the
// runs of the spool that hold whole files, in order, each with the count
// of files done through its end. It stops at the first file it does not
// copy whole, past wall, when ctx ends or when emit fails (whose error it
// returns); it returns what it copied whole.
func (j Jail) catRead(ctx context.Context, r Request, sp *spool, wall time.Duration, emit func(catSpan, int) error) (catCopied, error) {
	type result struct {
		done catCopied
		err  error
	}
	out, err := sp.writer()
	if err != nil {
		return catCopied{}, fmt.Errorf("%w: the spool: %v", ErrFallback, err)
	}
	defer out.Close()
	// The workspace as the jail has it: a detached copy of its mount,
	// read-only, nodev (a device node in it opens as nothing), made as
	// root before the thread becomes the agent.
	ws, err := detachedTree(j.Workspace, true)
	if err != nil {
		return catCopied{}, fmt.Errorf("%w: the workspace: %v", ErrFallback, err)
	}
	defer ws.Close()
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, and the
		// agent's credentials with it.
		runtime.LockOSThread()
		if err := j.becomeAgent(); err != nil {
			ch <- result{err: err}
			return
		}
		c := catCopier{j: j, ws: int(ws.Fd()), out: int(out.Fd()), sp: sp, emit: emit, deadline: time.Now().Add(wall), ctx: ctx}
		done, err := c.copyAll(r)
		ch <- result{done, err}
	}()
	res := <-ch
	return res.done, res.err
}

// becomeAgent gives the calling thread (locked to its goroutine) the
// agent's file-system uid and gid and no supplementary group, and checks
// that it took: the ids read back, and none of the capabilities that
// bypass a file's permissions left in its effective set. These system
// calls are this thread's only (not x/sys's or the runtime's all-threads
// ones).
func (j Jail) becomeAgent() error {
	if j.UID == 0 || j.GID == 0 {
		return fmt.Errorf("%w: the agent's uid or gid is 0", ErrFallback)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("%w: setgroups: %v", ErrFallback, e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(j.GID), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(j.UID), 0, 0)
	// setfsuid and setfsgid return the ids before the call, and an
	// invalid id (-1) changes nothing: so they read the ids back.
	fsgid, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0)
	fsuid, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
	if uint32(fsuid) != j.UID || uint32(fsgid) != j.GID {
		return fmt.Errorf("%w: the file-system ids are %d:%d, not the agent's", ErrFallback, uint32(fsuid), uint32(fsgid))
	}
	n, _, e := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if e != 0 || n != 0 {
		return fmt.Errorf("%w: %d supplementary groups left", ErrFallback, n)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: int32(unix.Gettid())}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: capget: %v", ErrFallback, err)
	}
	const bypass = 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH | 1<<unix.CAP_FOWNER
	if data[0].Effective&bypass != 0 {
		return fmt.Errorf("%w: the thread can still bypass file permissions", ErrFallback)
	}
	return nil
}

// catCopier is one answer's copy, on the agent's thread.
type catCopier struct {
	j        Jail
	ws       int // the workspace's top: its detached mount
	out      int // the answer's own description of the spool
	sp       *spool
	emit     func(catSpan, int) error
	deadline time.Time
	ctx      context.Context

	region  catSpan // the reserved region being written: off is the next byte, n what is left
	pending catSpan // whole files' bytes not yet named in a frame
	done    catCopied
}

// errCatStop ends a copy at a file: the rest is the sandbox's cat's.
var errCatStop = errors.New("the rest is the sandbox's cat's")

func (c *catCopier) copyAll(r Request) (catCopied, error) {
	for _, p := range r.Paths {
		span, err := c.copyFile(c.name(r.Cwd, p))
		if err == nil {
			err = c.add(span)
		}
		if errors.Is(err, errCatStop) {
			break
		}
		if err != nil {
			return c.done, err
		}
	}
	if c.pending.n > 0 {
		if err := c.emit(c.pending, c.done.files); err != nil {
			return c.done, err
		}
	}
	return c.done, nil
}

// name is p (a checked path of the request) relative to the workspace's
// top, or "" when the sandbox would not read the workspace's own file
// there (beneath a Covered name).
func (c *catCopier) name(cwd, p string) string {
	rel := c.j.rel(cwd, p)
	for _, cv := range c.j.Covered {
		if pathform.Beneath("/"+cv, "/"+rel) {
			return ""
		}
	}
	return rel
}

// copyFile copies the file at rel whole into one span of the spool and
// returns it; errCatStop when it is not one to copy here, or could not be
// copied whole.
func (c *catCopier) copyFile(rel string) (catSpan, error) {
	stop := catSpan{}
	if rel == "" || rel == "." || time.Now().After(c.deadline) || c.ctx.Err() != nil {
		return stop, errCatStop
	}
	// O_NONBLOCK: a FIFO opens at once (and is then not read); the
	// mount is nodev, so a device node does not open at all.
	fd, err := unix.Openat2(c.ws, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: plainResolve})
	if err != nil {
		return stop, errCatStop
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > catFileMax {
		return stop, errCatStop
	}
	// A file's bytes go into one region, so every frame ends where a file
	// does: a new region when this one has no room for it as it is now.
	if c.region.n == 0 || c.region.n < st.Size {
		off, n := c.sp.reserve(max(catRegion, st.Size), max(st.Size, 1))
		if n == 0 {
			return stop, errCatStop
		}
		if _, err := unix.Seek(c.out, off, 0); err != nil {
			return stop, errCatStop
		}
		c.region = catSpan{off, n}
	}
	span := catSpan{off: c.region.off}
	// A region is at most catFileMax (or catRegion), so is the span.
	for c.region.n > 0 {
		if time.Now().After(c.deadline) || c.ctx.Err() != nil {
			return stop, errCatStop
		}
		n, err := unix.Sendfile(c.out, fd, nil, int(min(c.region.n, 1<<30)))
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return stop, errCatStop
		}
		if n == 0 {
			return span, nil
		}
		span.n += int64(n)
		c.region.off += int64(n)
		c.region.n -= int64(n)
	}
	// The region is full: the file ends here only if nothing follows (it
	// grew past the room it had when it was opened).
	var b [1]byte
	if n, err := unix.Pread(fd, b[:], span.n); err != nil || n != 0 {
		return stop, errCatStop
	}
	return span, nil
}

// add counts a file copied whole into s, and names what is pending in a
// frame once it is catFrame or more, or before s when the spool's run
// breaks there (another region between).
func (c *catCopier) add(s catSpan) error {
	if c.pending.n > 0 && c.pending.off+c.pending.n != s.off {
		if err := c.emit(c.pending, c.done.files); err != nil {
			return err
		}
		c.pending = catSpan{}
	}
	if c.pending.n == 0 {
		c.pending.off = s.off
	}
	c.pending.n += s.n
	c.done.bytes += s.n
	c.done.files++
	if c.pending.n >= catFrame {
		if err := c.emit(c.pending, c.done.files); err != nil {
			return err
		}
		c.pending = catSpan{}
	}
	return nil
}
