package lineserve

import (
	"net"

	"golang.org/x/sys/unix"
)

// Peer is who is on the other end of a connection: the kernel's record of
// the process that connected (SO_PEERCRED), nothing the peer sent.
type Peer struct{ UID, GID, PID int }

// PeerOf reads c's peer credentials.
func PeerOf(c *net.UnixConn) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if cerr != nil {
		return Peer{}, cerr
	}
	return Peer{UID: int(cred.Uid), GID: int(cred.Gid), PID: int(cred.Pid)}, nil
}
