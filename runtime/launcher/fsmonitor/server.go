package fsmonitor

import (
	"bufio"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// The protocol (TCP): one request per connection, a line
//
//	since TOKEN\n
//
// (TOKEN: 1 to 128 bytes of printable ASCII without spaces, as Git passes
// it to the hook), answered with Git's hook output, NUL-separated: the
// next token, then the changed names or the single name "/". Anything
// else (a longer line, other bytes, a second line, no line within the
// deadline) closes the connection with no answer, which the hook turns
// into a failed query and Git into a full scan.
const (
	maxLine      = len("since ") + 128 + 1
	connDeadline = 5 * time.Second
	maxConns     = 8
)

// Server answers the monitor's requests from a Watcher.
type Server struct {
	w    *Watcher
	ln   net.Listener
	peer netip.Addr
	wg   sync.WaitGroup
	sem  chan struct{}
	once sync.Once
	// Refused counts connections closed without an answer.
	mu      sync.Mutex
	refused uint64
}

// Serve answers requests on ln, a TCP listener (the launcher's is on the
// sandbox network's gateway, which nftables opens to this sandbox's
// address only), until Close. A connection from any address but peer is
// closed unanswered: the check holds even where a rule would not (a
// process on the uplink host connecting to the gateway).
func Serve(w *Watcher, ln net.Listener, peer netip.Addr) *Server {
	s := &Server{w: w, ln: ln, peer: peer.Unmap(), sem: make(chan struct{}, maxConns)}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Refused is how many connections were closed without an answer.
func (s *Server) Refused() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

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
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !s.from(c) {
			s.refuse(c)
			continue
		}
		select {
		case s.sem <- struct{}{}:
		default:
			s.refuse(c) // too many at once: this one scans
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem }()
			s.answer(c)
		}()
	}
}

// from reports whether c comes from the peer's address.
func (s *Server) from(c net.Conn) bool {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	ap := a.AddrPort()
	return ap.Addr().Unmap() == s.peer
}

func (s *Server) refuse(c net.Conn) {
	s.mu.Lock()
	s.refused++
	s.mu.Unlock()
	c.Close()
}

func (s *Server) answer(c net.Conn) {
	c.SetDeadline(time.Now().Add(connDeadline))
	tok, ok := readRequest(c)
	if !ok {
		s.refuse(c)
		return
	}
	next, names := s.w.Since(tok)
	var b strings.Builder
	b.WriteString(next)
	b.WriteByte(0)
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte(0)
	}
	c.Write([]byte(b.String()))
	c.Close()
}

// readRequest reads the one request line and checks it is all there is.
func readRequest(c net.Conn) (string, bool) {
	r := bufio.NewReaderSize(c, maxLine+1)
	line, err := r.ReadSlice('\n')
	if err != nil || len(line) > maxLine {
		return "", false
	}
	tok, ok := strings.CutPrefix(string(line[:len(line)-1]), "since ")
	if !ok || !ValidToken(tok) {
		return "", false
	}
	// The client half-closes after its line: anything more is refused.
	var extra [1]byte
	if n, err := r.Read(extra[:]); n != 0 || err == nil {
		return "", false
	}
	return tok, true
}

// ValidToken reports whether tok can be a request's token.
func ValidToken(tok string) bool {
	if len(tok) == 0 || len(tok) > 128 {
		return false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] <= ' ' || tok[i] > '~' {
			return false
		}
	}
	return true
}
