package peerserve

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// A connection from the peer is answered; one from any other address is
// closed unanswered and counted; past the cap, the next is refused too.
func TestAdmitsThePeerOnly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	s := Serve(ln, netip.MustParseAddr("127.0.0.1"), 1, func(c net.Conn) {
		defer c.Close()
		io.WriteString(c, "hi")
		<-hold
	})
	defer s.Close()
	defer close(hold)

	first := dial(t, ln.Addr().String())
	if got := read(t, first); got != "hi" {
		t.Fatalf("the peer got %q, want an answer", got)
	}
	// The one slot is taken: the second is closed unanswered.
	if got := read(t, dial(t, ln.Addr().String())); got != "" {
		t.Errorf("past the cap: %q, want nothing", got)
	}
	if s.Refused() != 1 {
		t.Errorf("refused %d, want 1", s.Refused())
	}

	// Another address (the same host, as the uplink host's processes are):
	// a server for 127.0.0.2 refuses 127.0.0.1.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s2 := Serve(ln2, netip.MustParseAddr("127.0.0.2"), 4, func(c net.Conn) { io.WriteString(c, "hi"); c.Close() })
	defer s2.Close()
	if got := read(t, dial(t, ln2.Addr().String())); got != "" || s2.Refused() != 1 {
		t.Errorf("another address: %q, refused %d; want nothing, 1", got, s2.Refused())
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func read(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b := make([]byte, 2)
	n, _ := io.ReadFull(c, b)
	return string(b[:n])
}
