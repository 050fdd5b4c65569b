package fsmonitor

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"time"

	"paseo.dev/paseo-policy/runtime/launcher/peerserve"
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
	w  *Watcher
	ps *peerserve.Server
}

// Serve answers requests on ln, a TCP listener (the launcher's is on the
// sandbox network's gateway, which nftables opens to this sandbox's
// address only), until Close. A connection from any address but peer is
// closed unanswered (peerserve): the check holds even where a rule would
// not (a process on the uplink host connecting to the gateway).
func Serve(w *Watcher, ln net.Listener, peer netip.Addr) *Server {
	s := &Server{w: w}
	s.ps = peerserve.Serve(ln, peer, maxConns, s.answer)
	return s
}

// Refused is how many connections were closed without an answer.
func (s *Server) Refused() uint64 { return s.ps.Refused() }

// Close stops listening and waits for the connections being answered.
func (s *Server) Close() error { return s.ps.Close() }

func (s *Server) answer(c net.Conn) {
	c.SetDeadline(time.Now().Add(connDeadline))
	tok, ok := readRequest(c)
	if !ok {
		s.ps.Refuse(c)
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
