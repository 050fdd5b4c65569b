package lineserve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A toy protocol over a real socket: what the loop does is the same for
// every protocol, so it is tested apart from the supervisor and holders.
type toyReq struct {
	V    int    `json:"v"`
	ID   string `json:"id"`
	Op   string `json:"op"`
	Data string `json:"data,omitempty"`
}

func (r toyReq) Head() Head { return Head{V: r.V, ID: r.ID, Op: r.Op} }

type toyErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type toyServer struct {
	proto    *Protocol[toyReq, *toyErr]
	sock     string
	admitted atomic.Int32
	released atomic.Int32
}

func newToy(t *testing.T, edit func(*Protocol[toyReq, *toyErr])) *toyServer {
	t.Helper()
	ts := &toyServer{sock: filepath.Join(t.TempDir(), "toy.sock")}
	ts.proto = &Protocol[toyReq, *toyErr]{
		Version: 1, MaxFrame: 64, Frames: map[string]int{"big": 256}, ReadBuffer: 16,
		Admit: func(Peer) (func(), *toyErr) {
			ts.admitted.Add(1)
			return func() { ts.released.Add(1) }, nil
		},
		Malformed: func(m string) *toyErr { return &toyErr{Code: "malformed", Message: m} },
		Handle: func(ctx context.Context, c *Conn, r toyReq) (any, *toyErr) {
			switch r.Op {
			case "echo", "big", "end":
				return map[string]string{"data": r.Data}, nil
			case "stream":
				done := c.Streaming()
				go func() {
					defer done()
					for ctx.Err() == nil && c.Send(map[string]any{"v": 1, "event": "tick"}) == nil {
						time.Sleep(50 * time.Millisecond)
					}
				}()
				return map[string]bool{"streaming": true}, nil
			}
			return nil, &toyErr{Code: "unknown-op", Message: r.Op}
		},
		Answered: func(r toyReq) bool { return r.Op == "end" },
	}
	if edit != nil {
		edit(ts.proto)
	}
	ln, err := Listen(ts.sock, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = Accept(ln, func(c *net.UnixConn) { ts.proto.Serve(ctx, c) }) }()
	return ts
}

type toyClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (ts *toyServer) dial(t *testing.T) *toyClient {
	t.Helper()
	c, err := net.Dial("unix", ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &toyClient{t: t, c: c, br: bufio.NewReader(c)}
}

// ask sends line and returns the next line that is not an event.
func (tc *toyClient) ask(line string) string {
	tc.t.Helper()
	go func() { _, _ = io.WriteString(tc.c, line) }()
	return tc.next(5 * time.Second)
}

func (tc *toyClient) next(d time.Duration) string {
	tc.t.Helper()
	_ = tc.c.SetReadDeadline(time.Now().Add(d))
	for {
		got, err := tc.br.ReadString('\n')
		if err != nil {
			tc.t.Fatalf("no answer: %v", err)
		}
		if !strings.Contains(got, `"event"`) {
			return strings.TrimSuffix(got, "\n")
		}
	}
}

// closed reports whether the server closes the connection within d
// (events aside).
func (tc *toyClient) closed(d time.Duration) bool {
	_ = tc.c.SetReadDeadline(time.Now().Add(d))
	for {
		line, err := tc.br.ReadString('\n')
		if (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) && line == "" {
			return true // reset: the server closed with the rest of our frame unread
		}
		if err != nil || !strings.Contains(line, `"event"`) {
			return false
		}
	}
}

const wantOne = `{"v":1,"id":%q,"ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`

// Requests are answered by id; a request that is not one strict JSON
// object of the version with an id is refused and the connection goes on.
func TestServeAnswersAndRefuses(t *testing.T) {
	ts := newToy(t, nil)
	c := ts.dial(t)
	for _, s := range []struct{ req, want string }{
		{`{"v":1,"id":"a","op":"echo","data":"x"}` + "\n", `{"v":1,"id":"a","ok":true,"result":{"data":"x"}}`},
		{`{"v":1,"id":"b","op":"nope"}` + "\r\n", `{"v":1,"id":"b","ok":false,"error":{"code":"unknown-op","message":"nope"}}`},
		{"not json\n", fmt.Sprintf(wantOne, "")},
		{`{"v":2,"id":"c","op":"echo"}` + "\n", fmt.Sprintf(wantOne, "c")},
		{`{"v":1,"op":"echo"}` + "\n", fmt.Sprintf(wantOne, "")},
		{`{"v":1,"id":"d","op":"echo","extra":1}` + "\n", fmt.Sprintf(wantOne, "d")},
		{`{"v":1,"id":"e","op":"echo"}` + "\n", `{"v":1,"id":"e","ok":true,"result":{"data":""}}`},
	} {
		if got := c.ask(s.req); got != s.want {
			t.Errorf("%q:\n got %s\nwant %s", s.req, got, s.want)
		}
	}
	// Answered ends the connection once the answer is out.
	if got, want := c.ask(`{"v":1,"id":"z","op":"end"}`+"\n"), `{"v":1,"id":"z","ok":true,"result":{"data":""}}`; got != want || !c.closed(5*time.Second) {
		t.Errorf("end: %s, want %s and the connection closed", got, want)
	}
	for deadline := time.Now().Add(5 * time.Second); ts.released.Load() != 1 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	if ts.admitted.Load() != 1 || ts.released.Load() != 1 {
		t.Errorf("admitted %d, released %d; want 1 and 1", ts.admitted.Load(), ts.released.Load())
	}
}

// Every op's frame is bounded by MaxFrame, and an op of Frames by its
// own bound; a frame past its bound is refused and the connection cut.
func TestServeFrameSizes(t *testing.T) {
	ts := newToy(t, nil)
	pad := func(n int) string { return strings.Repeat("a", n) }
	for _, s := range []struct{ name, req, want string }{
		{"a big op within its bound", `{"v":1,"id":"b","op":"big","data":"` + pad(150) + `"}`, `{"v":1,"id":"b","ok":true,"result":{"data":"` + pad(150) + `"}}`},
		{"another op past MaxFrame", `{"v":1,"id":"e","op":"echo","data":"` + pad(100) + `"}`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request longer than 64 bytes (only big may be longer, up to 256)"}}`},
		{"the op after the cut", `{"v":1,"id":"e","data":"` + pad(100) + `","op":"big"}`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request longer than 64 bytes (only big may be longer, up to 256)"}}`},
		{"a big op past its bound", `{"v":1,"id":"b","op":"big","data":"` + pad(300) + `"}`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"big request longer than 256 bytes"}}`},
		{"a duplicate op key", `{"v":1,"id":"d","op":"big","data":"` + pad(100) + `","op":"echo"}`, `{"v":1,"id":"d","ok":false,"error":{"code":"malformed","message":"only big may be longer than 64 bytes"}}`},
	} {
		c := ts.dial(t)
		got := c.ask(s.req + "\n")
		closed := c.closed(2 * time.Second)
		if got != s.want || closed == strings.Contains(s.want, `"ok":true`) {
			t.Errorf("%s:\n got %s (closed %v)\nwant %s", s.name, got, closed, s.want)
		}
	}
	// Without Frames, the one bound.
	ts = newToy(t, func(p *Protocol[toyReq, *toyErr]) { p.Frames = nil })
	c := ts.dial(t)
	if got, want := c.ask(`{"v":1,"id":"b","op":"big","data":"`+pad(100)+`"}`+"\n"), `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request longer than 64 bytes"}}`; got != want {
		t.Errorf("no Frames:\n got %s\nwant %s", got, want)
	}
}

// Half a frame is cut after FrameTimeout; a silent connection after
// IdleTimeout, unless a stream pushes to it.
func TestServeTimeouts(t *testing.T) {
	ts := newToy(t, func(p *Protocol[toyReq, *toyErr]) {
		p.FrameTimeout, p.IdleTimeout = 200*time.Millisecond, 300*time.Millisecond
	})
	half := ts.dial(t)
	fmt.Fprint(half.c, `{"v":1,"id":"h","op":"ec`)
	if got, want := half.next(5*time.Second), `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request did not arrive whole within 200ms"}}`; got != want || !half.closed(2*time.Second) {
		t.Errorf("half a frame:\n got %s\nwant %s, closed", got, want)
	}
	idle := ts.dial(t)
	if !idle.closed(5 * time.Second) {
		t.Error("an idle connection was not cut")
	}
	streaming := ts.dial(t)
	if got := streaming.ask(`{"v":1,"id":"s","op":"stream"}` + "\n"); got != `{"v":1,"id":"s","ok":true,"result":{"streaming":true}}` {
		t.Fatalf("stream: %s", got)
	}
	time.Sleep(time.Second)
	if got := streaming.ask(`{"v":1,"id":"e","op":"echo"}` + "\n"); got != `{"v":1,"id":"e","ok":true,"result":{"data":""}}` {
		t.Errorf("a streamed-to connection after the idle timeout: %s", got)
	}
}

// Admit turns a peer away: with its refusal as the one response, or with
// none.
func TestServeAdmit(t *testing.T) {
	busy := newToy(t, func(p *Protocol[toyReq, *toyErr]) {
		p.Admit = func(Peer) (func(), *toyErr) { return nil, &toyErr{Code: "busy", Message: "full"} }
	})
	c := busy.dial(t)
	if got, want := c.next(5*time.Second), `{"v":1,"id":"","ok":false,"error":{"code":"busy","message":"full"}}`; got != want || !c.closed(2*time.Second) {
		t.Errorf("refused with an answer:\n got %s\nwant %s, closed", got, want)
	}
	silent := newToy(t, func(p *Protocol[toyReq, *toyErr]) {
		p.Admit = func(Peer) (func(), *toyErr) { return nil, nil }
	})
	if c := silent.dial(t); !c.closed(5 * time.Second) {
		t.Error("refused without an answer: not closed")
	}
}

// The peer is the connecting process, as the kernel knows it.
func TestPeerOf(t *testing.T) {
	got := make(chan Peer, 1)
	ts := newToy(t, func(p *Protocol[toyReq, *toyErr]) {
		p.Admit = func(p Peer) (func(), *toyErr) { got <- p; return func() {}, nil }
	})
	ts.dial(t)
	select {
	case p := <-got:
		if p.UID != os.Getuid() || p.GID != os.Getgid() || p.PID != os.Getpid() {
			t.Errorf("peer %+v, want uid %d gid %d pid %d", p, os.Getuid(), os.Getgid(), os.Getpid())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no connection admitted")
	}
}

// Listen replaces a stale socket, refuses anything else at its path, and
// gives the socket its mode.
func TestListen(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	ln, err := Listen(sock, 0o640, -1)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o640 {
		t.Fatalf("socket %v %v, want a socket of mode 0640", fi.Mode(), err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // stale: the file stays, nothing listens
	ln, err = Listen(sock, 0o600, -1)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	ln.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file, 0o600, -1); err == nil {
		t.Error("Listen replaced a regular file")
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("the regular file is gone: %v", err)
	}
}

func TestOpOf(t *testing.T) {
	for in, want := range map[string]string{
		`{"v":1,"id":"a","op":"write","data":"AAAA`: "write",
		`{"facts":{"op":"x"},"op":"list"}`:          "list",
		`{"facts":{"a":"bbbbbbbbbbbb`:               "",
		`["op","write"]`:                            "",
	} {
		if got := opOf([]byte(in)); got != want {
			t.Errorf("opOf(%s) = %q, want %q", in, got, want)
		}
	}
}

// Listen leaves the process's umask alone: files other goroutines create
// while it binds keep the mode they ask for. With the umask set around
// bind, a file created meanwhile came out 0600 (a daemon-readable
// configuration written beside a starting supervisor was unreadable).
func TestListenLeavesUmask(t *testing.T) {
	dir := t.TempDir()
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	stop := make(chan struct{})
	done := make(chan []string)
	go func() {
		var bad []string
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- bad
				return
			default:
			}
			p := filepath.Join(dir, fmt.Sprintf("f%d", i))
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				bad = append(bad, err.Error())
				continue
			}
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o644 {
				bad = append(bad, fmt.Sprintf("%s: %v %v", p, fi.Mode(), err))
			}
			os.Remove(p)
		}
	}()
	for i := 0; i < 300; i++ {
		sock := filepath.Join(dir, fmt.Sprintf("s%d.sock", i))
		ln, err := Listen(sock, 0o600, -1)
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
	}
	close(stop)
	if bad := <-done; len(bad) > 0 {
		t.Errorf("%d files created while Listen ran lost their mode, first %s", len(bad), bad[0])
	}
	if got := unix.Umask(0o022); got != 0o022 {
		t.Errorf("process umask %o after Listen, want 022", got)
	}
}
