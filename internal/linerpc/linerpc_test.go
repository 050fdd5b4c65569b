package linerpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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

type request struct {
	ID string `json:"id"`
	Op string `json:"op"`
}

type testError struct {
	Code  string   `json:"code"`
	Items []detail `json:"items,omitempty"`
}

type detail struct {
	Code string `json:"code"`
	Path string `json:"path"`
}

func (e *testError) Error() string { return e.Code }

// serve answers each connection's first line with answer(id), then closes
// it, as a released holder answers and exits.
func serve(t *testing.T, answer func(id string) string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req request
			if line, err := bufio.NewReader(c).ReadBytes('\n'); err == nil && json.Unmarshal(line, &req) == nil {
				_, _ = c.Write([]byte(answer(req.ID) + "\n"))
			}
			c.Close()
		}
	}()
	return sock
}

// A peer that answers and then closes is answered, never "connection
// closed", however the two reach the caller. The supervisor's delete of
// a released holder failed now and then before (make demo saw it).
func TestCallAnswerBeforeClose(t *testing.T) {
	sock := serve(t, func(id string) string { return `{"id":"` + id + `","ok":true,"result":{"released":"x"}}` })
	// Call's select picks at random among ready cases; 50 rounds would
	// all pass by chance once in 2^50.
	for i := 0; i < 50; i++ {
		raw, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		c := &Conn[struct{}]{peer: "test", prefix: "t", Events: make(chan struct{}, 1),
			wait: map[string]chan json.RawMessage{}, done: make(chan struct{})}
		c.c = writeUntilClosed{raw, c.done}
		go c.read()
		line, err := c.Call(context.Background(), func(id string) any { return request{ID: id, Op: "release"} })
		var got map[string]string
		if err == nil {
			err = Decode[*testError](line, "test", &got)
		}
		if err != nil || got["released"] != "x" {
			t.Fatalf("round %d: %v %v", i, got, err)
		}
		c.Close()
	}
}

// A response to no request before the close is the peer refusing the
// connection: Call reports it as *Refused with that line, whether the
// request was written or not.
func TestRefusedConnection(t *testing.T) {
	sock := serve(t, func(string) string { return `{"id":"","ok":false,"error":{"code":"busy"}}` })
	raw, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := New[struct{}](raw, 1, "test", "t")
	defer c.Close()
	_, err = c.Call(context.Background(), func(id string) any { return request{ID: id, Op: "list"} })
	var refused *Refused
	if !errors.As(err, &refused) {
		t.Fatalf("want *Refused, got %v", err)
	}
	if err := Decode[*testError](refused.Line, "test", nil); err == nil || err.Error() != "busy" {
		t.Fatalf("the refusal decodes to %v, want busy", err)
	}
	var te *testError
	if err := Refusal[*testError](err, "test"); !errors.As(err, &te) || te.Code != "busy" {
		t.Fatalf("Refusal: %v, want the typed busy", err)
	}
	other := errors.New("connection closed")
	if err := Refusal[*testError](other, "test"); err != other {
		t.Fatalf("Refusal of another error: %v", err)
	}
}

// Decode gives the peer's error, a generic one for a refusal without an
// error, and the result otherwise.
func TestDecode(t *testing.T) {
	var out struct{ N int }
	if err := Decode[*testError]([]byte(`{"ok":true,"result":{"N":3}}`), "p", &out); err != nil || out.N != 3 {
		t.Errorf("result: %v %+v", err, out)
	}
	var te *testError
	if err := Decode[*testError]([]byte(`{"ok":false,"error":{"code":"quota"}}`), "p", nil); !errors.As(err, &te) || te.Code != "quota" {
		t.Errorf("error: %v", err)
	}
	// The protocol's error decodes whole, nested data included (the
	// supervisor's refused carries the compiler's diagnostics).
	line := `{"ok":false,"error":{"code":"refused","items":[{"code":"PP-A","path":"x.y"},{"code":"PP-B","path":"z"}]}}`
	if err := Decode[*testError]([]byte(line), "p", nil); !errors.As(err, &te) || len(te.Items) != 2 || te.Items[1] != (detail{"PP-B", "z"}) {
		t.Errorf("nested error data: %v %+v", err, te)
	}
	if err := Decode[*testError]([]byte(`{"ok":false}`), "p", nil); err == nil || err.Error() != "p refused without an error" {
		t.Errorf("no error: %v", err)
	}
	if err := Decode[*testError]([]byte(`not json`), "p", nil); err == nil {
		t.Error("a malformed response decoded")
	}
}
