package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/lineserve"
)

// Listen creates the socket (0660, root:SocketGID) in a root-owned
// directory, or serves the inherited Listener, until ctx ends.
func (s *Server) Listen(ctx context.Context) error {
	dir := filepath.Dir(s.cfg.Socket)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if st.Uid != 0 || st.Mode&0o022 != 0 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("socket directory %s must be a root-owned directory no one else can write", dir)
	}
	if st.Mode&0o011 == 0 {
		return fmt.Errorf("socket directory %s must be searchable by the socket's group (mode 0711 or 0755)", dir)
	}
	if filepath.Clean(dir) == filepath.Clean(s.cfg.StateRoot) {
		// The launcher keeps the state root 0700, which would lock peers out.
		return fmt.Errorf("the socket may not live in the state root %s itself", s.cfg.StateRoot)
	}
	ln, err := s.listener()
	if err != nil {
		return err
	}
	// Under the lock: Close may run as soon as the socket answers.
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	go func() { <-ctx.Done(); ln.Close() }()
	go s.idleHibernation(ctx, time.Second)
	go s.reapExited(ctx, time.Second)
	proto := s.protocol()
	err = lineserve.Accept(ln, func(c *net.UnixConn) { proto.Serve(ctx, c) })
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// listener is the inherited socket, checked, or a new one made at Socket
// (a stale socket there is replaced): 0660, root:SocketGID.
func (s *Server) listener() (net.Listener, error) {
	ln := s.cfg.Listener
	if ln == nil {
		return lineserve.Listen(s.cfg.Socket, 0o660, s.cfg.SocketGID)
	}
	a, ok := ln.Addr().(*net.UnixAddr)
	if !ok || filepath.Clean(a.Name) != filepath.Clean(s.cfg.Socket) {
		return nil, fmt.Errorf("the inherited socket listens on %v, not on %s", ln.Addr(), s.cfg.Socket)
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.cfg.Socket, &st); err != nil {
		return nil, fmt.Errorf("the inherited socket: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Uid != 0 || int(st.Gid) != s.cfg.SocketGID || st.Mode&0o7777 != 0o660 {
		return nil, fmt.Errorf("the inherited socket %s must be a socket of mode 0660 owned by root:%d (systemd: SocketMode=0660, SocketGroup=%d)", s.cfg.Socket, s.cfg.SocketGID, s.cfg.SocketGID)
	}
	return ln, nil
}
