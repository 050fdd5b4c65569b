package lineserve

import (
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Listen makes a listening socket at path. A stale socket there is
// replaced; anything else at path is refused. The socket is born 0600
// (umask), so no one else can connect before its group and mode are set:
// then, when gid >= 0, it is chowned to root:gid, and chmod'ed to mode.
func Listen(path string, mode os.FileMode, gid int) (net.Listener, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		_ = os.Remove(path)
	}
	ln, err := listenPrivate(path)
	if err != nil {
		return nil, err
	}
	if gid >= 0 {
		if err := os.Chown(path, 0, gid); err != nil {
			ln.Close()
			return nil, err
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// listenPrivate binds path under umask 0177 without touching the
// process's umask. The umask is shared by every thread of the process, so
// setting it around bind would make any file another goroutine creates
// meanwhile 0600 (the supervisor's callers write files beside it: a
// configuration the daemon user must read came out unreadable). Instead
// the bind runs on a thread of its own that unshares its filesystem
// attributes (CLONE_FS: root, cwd, umask) and sets the umask there; the
// goroutine ends still locked to that thread, so Go discards the thread
// rather than reuse it with a different umask.
func listenPrivate(path string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread's fs attributes are not the
		// process's any more.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			ch <- result{err: fmt.Errorf("unshare the listening thread's umask: %w", err)}
			return
		}
		unix.Umask(0o177)
		ln, err := net.Listen("unix", path)
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

// Accept serves every connection ln accepts, each in a goroutine of its
// own, until Accept fails (ln was closed), and returns that error.
func Accept(ln net.Listener, serve func(*net.UnixConn)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serve(c.(*net.UnixConn))
	}
}
