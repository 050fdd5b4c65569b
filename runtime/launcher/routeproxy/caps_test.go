package routeproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Each test floods one sandbox's proxy past one limit and shows that the
// next client of another sandbox's proxy is served at once, and (for the
// timeouts) that the flooded proxy frees the slot the flood held.

const validPath = "/mcp/agents?callerAgentId=agent-7f3c"

// pingBody is a request inside the scope that the stream test's upstream
// answers with an endless event stream (no tools/list: nothing to filter).
const pingBody = `{"jsonrpc":"2.0","id":1,"method":"ping"}`

// served is one well-formed request, on a fresh connection, answered 200.
func served(base string) error {
	req, _ := http.NewRequest("POST", base+validPath, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Close = true
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func rawConn(t *testing.T, base string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp4", strings.TrimPrefix(base, "http://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the proxy closes c within d (reading
// whatever it answers first).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

func neighbour(t *testing.T) string {
	_, base := setupWith(t, &fakeDaemon{}, Limits{})
	return base
}

func TestConnectionCap(t *testing.T) {
	p, base := setupWith(t, &fakeDaemon{}, Limits{MaxConns: 4})
	other := neighbour(t)
	var held []net.Conn
	for i := 0; i < 4; i++ {
		c := rawConn(t, base)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\n", validPath) // half a request: holds a slot
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // the proxy accepted them
	extra := 0
	for i := 0; i < 6; i++ {
		if c := rawConn(t, base); closedWithin(c, 2*time.Second) {
			extra++
		}
	}
	if extra != 6 || p.Stats.RefusedConns.Load() != 6 {
		t.Errorf("%d of 6 connections past the cap were closed, %d counted; want all", extra, p.Stats.RefusedConns.Load())
	}
	if err := served(other); err != nil {
		t.Errorf("another sandbox's proxy during the flood: %v", err)
	}
	held[0].Close()
	var err error
	for i := 0; i < 20; i++ {
		if err = served(base); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("a slot given back is not reused: %v", err)
	}
}

// A slow sender (headers never finished, or a body trickled) and an idle
// kept-alive connection are cut by their timeouts; with one slot, the
// next client of the same sandbox is served only once that happened.
func TestTimeoutsFreeTheSlot(t *testing.T) {
	lim := Limits{MaxConns: 1, ReadHeader: 300 * time.Millisecond, Read: 600 * time.Millisecond, Idle: 300 * time.Millisecond}
	cases := map[string]func(c net.Conn){
		"header": func(c net.Conn) { fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\n", validPath) },
		"body": func(c net.Conn) {
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", validPath)
			go func() {
				for i := 0; i < 20; i++ {
					time.Sleep(100 * time.Millisecond)
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}()
		},
		"idle": func(c net.Conn) {
			body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", validPath, len(body), body)
			_, _ = http.ReadResponse(bufio.NewReader(c), nil) // then stay silent, kept alive
		},
	}
	for name, slow := range cases {
		t.Run(name, func(t *testing.T) {
			p, base := setupWith(t, &fakeDaemon{}, lim)
			other := neighbour(t)
			c := rawConn(t, base)
			slow(c)
			if err := served(other); err != nil {
				t.Errorf("another sandbox's proxy while this one's slot is held: %v", err)
			}
			if !closedWithin(c, 5*time.Second) {
				t.Fatalf("the %s timeout did not cut the connection", name)
			}
			if err := served(base); err != nil {
				t.Errorf("after the %s timeout: %v", name, err)
			}
			// Only a request that never reached the guard is a cut: the
			// slow body was forwarded (and failed upstream), idle is no refusal.
			want := map[string]int64{"header": 1}[name]
			for i := 0; p.Stats.Cut.Load() != want && i < 50; i++ {
				time.Sleep(20 * time.Millisecond) // the server counts the close after making it
			}
			if p.Stats.Cut.Load() != want {
				t.Errorf("cut %d requests, want %d", p.Stats.Cut.Load(), want)
			}
		})
	}
}

// A client that stops reading a streamed answer is cut by the write
// timeout, which frees its slot.
func TestWriteTimeoutFreesTheSlot(t *testing.T) {
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			chunk := strings.Repeat("data: x\n\n", 4096)
			for r.Context().Err() == nil {
				if _, err := io.WriteString(w, chunk); err != nil {
					return
				}
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	_, base := setupWith(t, stream, Limits{MaxConns: 1, Write: 500 * time.Millisecond})
	other := neighbour(t)
	c := rawConn(t, base)
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", validPath, len(pingBody), pingBody)
	// The client reads nothing; socket buffers fill and the proxy's write blocks.
	if err := served(other); err != nil {
		t.Errorf("another sandbox's proxy: %v", err)
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = served(base); err == nil {
			break
		}
	}
	if err != nil {
		t.Errorf("the write timeout never freed the slot: %v", err)
	}
}

func TestHeaderAndBodySize(t *testing.T) {
	d := &fakeDaemon{}
	p, base := setupWith(t, d, Limits{MaxHeaderBytes: 4 << 10, MaxBody: 1 << 10})
	other := neighbour(t)
	req, _ := http.NewRequest("POST", base+validPath, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Pad", strings.Repeat("a", 64<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized headers: status %d", resp.StatusCode)
	}
	for i := 0; p.Stats.Cut.Load() != 1 && i < 50; i++ {
		time.Sleep(20 * time.Millisecond) // the server closes after answering
	}
	if p.Stats.Cut.Load() != 1 {
		t.Errorf("oversized headers counted as cut %d times, want 1", p.Stats.Cut.Load())
	}
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("x", 2<<10))
		if chunked {
			body = io.MultiReader(body) // unknown length: sent chunked
		}
		req, _ := http.NewRequest("POST", base+validPath, body)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("oversized body (chunked %v): status %d", chunked, resp.StatusCode)
		}
	}
	if got := p.Stats.Refused.Load(); got != 2 {
		t.Errorf("refused bodies counted %d, want 2", got)
	}
	d.mu.Lock()
	for _, b := range d.body {
		if len(b) > 1<<10 {
			t.Errorf("the daemon received a body of %d bytes", len(b))
		}
	}
	d.mu.Unlock()
	if err := served(other); err != nil {
		t.Errorf("another sandbox's proxy: %v", err)
	}
	if err := served(base); err != nil {
		t.Errorf("the same proxy after refusals: %v", err)
	}
}
