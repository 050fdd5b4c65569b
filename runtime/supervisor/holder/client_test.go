package holder

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// writeUntilClosed holds a request's Write until the connection's reader
// has seen both the answer and the close, so Call finds both ready.
type writeUntilClosed struct {
	net.Conn
	closed <-chan struct{}
}

func (w writeUntilClosed) Write(p []byte) (int, error) {
	n, err := w.Conn.Write(p)
	select {
	case <-w.closed:
	case <-time.After(5 * time.Second):
	}
	return n, err
}

// A holder that answers and then closes (release: it exits) is answered,
// never "connection closed", however the two reach the caller. The
// supervisor's delete failed now and then before (make demo saw it).
func TestCallAnswerBeforeClose(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "h.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req Request
			if line, err := bufio.NewReader(c).ReadBytes('\n'); err == nil && json.Unmarshal(line, &req) == nil {
				out, _ := json.Marshal(Response{V: Version, ID: req.ID, OK: true, Result: map[string]string{"released": "x"}})
				_, _ = c.Write(append(out, '\n'))
			}
			c.Close()
		}
	}()
	// Call's select picks at random among ready cases; 50 rounds would
	// all pass by chance once in 2^50.
	for i := 0; i < 50; i++ {
		raw, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		hc := &Conn{wait: map[string]chan Response{}, Events: make(chan Event, 1), done: make(chan struct{})}
		hc.c = writeUntilClosed{raw, hc.done}
		go hc.read()
		var got map[string]string
		if err := hc.Call(context.Background(), Request{Op: OpRelease}, &got); err != nil || got["released"] != "x" {
			t.Fatalf("round %d: %v %v", i, got, err)
		}
		hc.Close()
	}
}
