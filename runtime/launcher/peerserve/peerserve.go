// Package peerserve is the admission both host services on a sandbox's
// gateway share (the workspace monitor and the native search): accept
// connections on the listener, hand a connection to the service only if
// it comes from the sandbox's own address and fewer than the cap are
// being answered, and close every other one unanswered. The check holds
// even where an nftables rule would not (a process on the uplink host
// connecting to the gateway); the sandbox's client then does what it does
// without the service (a full scan, its own rg).
package peerserve

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Server admits connections for one sandbox.
type Server struct {
	ln      net.Listener
	peer    netip.Addr
	slots   chan struct{}
	handle  func(net.Conn)
	wg      sync.WaitGroup
	once    sync.Once
	refused atomic.Uint64
}

// Serve accepts on ln until Close, and runs handle (which closes the
// connection) for each connection from peer, at most maxConns at once.
func Serve(ln net.Listener, peer netip.Addr, maxConns int, handle func(net.Conn)) *Server {
	s := &Server{ln: ln, peer: peer.Unmap(), slots: make(chan struct{}, maxConns), handle: handle}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Refuse closes c unanswered and counts it; the service calls it for a
// connection it will not answer (a malformed or late request).
func (s *Server) Refuse(c net.Conn) {
	s.refused.Add(1)
	c.Close()
}

// Refused is how many connections were closed unanswered.
func (s *Server) Refused() uint64 { return s.refused.Load() }

// Close stops listening and waits for the connections being answered.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		err = s.ln.Close()
		s.wg.Wait()
	})
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a transient error (EMFILE): accept again
			continue
		}
		if !s.fromPeer(c) {
			s.Refuse(c)
			continue
		}
		select {
		case s.slots <- struct{}{}:
		default:
			s.Refuse(c) // too many at once
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.slots }()
			s.handle(c)
		}()
	}
}

// fromPeer reports whether c comes from the sandbox's address.
func (s *Server) fromPeer(c net.Conn) bool {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	return ok && a.AddrPort().Addr().Unmap() == s.peer
}
