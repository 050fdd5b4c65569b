package nativesearch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// The protocol (TCP on the sandbox network's gateway): one request per
// connection, the client's wire form (Request.Encode) then a half-close;
// the answer is a line
//
//	paseo-search 1 ok EXIT STDOUT-BYTES STDERR-BYTES\n
//
// followed by rg's stdout and stderr, or the line "paseo-search 1
// fallback\n" (a request off the list, a limit, the jail failed, too many
// at once): the client then runs the sandbox's own rg. A connection from
// any address but the sandbox's, or one that sends nothing within the
// deadline, is closed unanswered (the client falls back too).
const (
	readDeadline = 5 * time.Second
	maxConns     = 8
	maxRunning   = 2
	queueWait    = 10 * time.Second
)

// Server answers one sandbox's searches.
type Server struct {
	j    Jail
	ln   net.Listener
	peer netip.Addr
	wg   sync.WaitGroup
	conn chan struct{}
	run  chan struct{}
	once sync.Once
	ctx  context.Context
	stop context.CancelFunc

	mu    sync.Mutex
	stats Stats
}

// Stats count a server's connections.
type Stats struct {
	Answered, Fallback, Refused uint64
}

// Serve answers requests on ln (the launcher's is on the gateway, which
// nftables opens to this sandbox's address only) until Close; the server
// itself closes a connection from any address but peer unanswered.
func Serve(j Jail, ln net.Listener, peer netip.Addr) *Server {
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{j: j, ln: ln, peer: peer.Unmap(), conn: make(chan struct{}, maxConns), run: make(chan struct{}, maxRunning), ctx: ctx, stop: stop}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Stats are the counters so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close stops listening, kills the searches running and waits for them.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		err = s.ln.Close()
		s.stop()
		s.wg.Wait()
	})
	return err
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		a, ok := c.RemoteAddr().(*net.TCPAddr)
		if !ok || a.AddrPort().Addr().Unmap() != s.peer {
			s.count(func(st *Stats) { st.Refused++ })
			c.Close()
			continue
		}
		select {
		case s.conn <- struct{}{}:
		default:
			s.count(func(st *Stats) { st.Refused++ })
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.conn }()
			s.answer(c)
		}()
	}
}

func (s *Server) answer(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(readDeadline))
	b, err := io.ReadAll(io.LimitReader(c, MaxRequest+1))
	if err != nil {
		s.count(func(st *Stats) { st.Refused++ })
		return
	}
	res, err := s.search(b)
	c.SetWriteDeadline(time.Now().Add(readDeadline + s.j.Limits.Wall))
	if err != nil {
		s.count(func(st *Stats) { st.Fallback++ })
		io.WriteString(c, magic+" fallback\n")
		return
	}
	s.count(func(st *Stats) { st.Answered++ })
	var h bytes.Buffer
	fmt.Fprintf(&h, "%s ok %d %d %d\n", magic, res.Exit, len(res.Stdout), len(res.Stderr))
	c.Write(append(append(h.Bytes(), res.Stdout...), res.Stderr...))
}

func (s *Server) search(b []byte) (Result, error) {
	r, err := Decode(b, s.j.Dest)
	if err != nil {
		return Result{}, err
	}
	if !s.j.PlainPaths(r) {
		return Result{}, fmt.Errorf("%w: a path or the cwd is a link (the sandbox's rg follows it)", ErrFallback)
	}
	t := time.NewTimer(queueWait)
	defer t.Stop()
	select {
	case s.run <- struct{}{}:
	case <-t.C:
		return Result{}, fmt.Errorf("%w: %d searches running", ErrFallback, maxRunning)
	case <-s.ctx.Done():
		return Result{}, ErrFallback
	}
	defer func() { <-s.run }()
	return s.j.Run(s.ctx, r)
}
