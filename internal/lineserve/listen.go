package lineserve

import (
	"fmt"
	"net"
	"os"

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
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
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
