package ociexec

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"paseo.dev/paseo-policy/runtime/execution"
)

// Once a Write returns, its bytes are input not yet taken until a reader
// has taken and written on every chunk: a pause in between is refused,
// whatever the goroutines' timing. With the pipe and pump this relay
// replaced, Write returned when the pump had read the last chunk but before
// it held it, and a pause in that window went through.
func TestRelayWrittenInputIsPending(t *testing.T) {
	for i := 0; i < 200; i++ {
		r := newInputRelay()
		in := r.open()
		took := make(chan []byte, 4)
		go func() { // a launch's copier that writes on one chunk and then blocks
			buf := make([]byte, relayChunk)
			n, _ := in.Read(buf)
			took <- append([]byte(nil), buf[:n]...)
		}()
		data := bytes.Repeat([]byte("x"), relayChunk+relayChunk/2)
		if n, err := r.Write(data); err != nil || n != len(data) {
			t.Fatalf("write: %d, %v", n, err)
		}
		if err := r.pause(time.Millisecond); !errors.Is(err, execution.ErrInputPending) {
			t.Fatalf("round %d: a pause with input not taken: %v, want input pending", i, err)
		}
		if got := <-took; len(got) != relayChunk {
			t.Fatalf("the copier took %d bytes, want a chunk", len(got))
		}
		r.closeBackend()
	}
}

// A pause goes through once every chunk was taken and written on, and
// nothing is handed out until resume.
func TestRelayPauseAfterTakenAndResume(t *testing.T) {
	r := newInputRelay()
	in := r.open()
	done := make(chan error, 1)
	go func() { _, err := r.Write([]byte("hello")); done <- err }()
	buf := make([]byte, 16)
	if n, err := in.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read: %q, %v", buf[:n], err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The copier comes back for more: what it took is written on.
	next := make(chan string, 1)
	go func() { n, _ := in.Read(buf); next <- string(buf[:n]) }()
	deadline := time.Now().Add(5 * time.Second)
	for r.pause(10*time.Millisecond) != nil {
		if time.Now().After(deadline) {
			t.Fatal("pause refused with everything taken")
		}
	}
	go func() { _, err := r.Write([]byte("more")); done <- err }()
	select {
	case s := <-next:
		t.Fatalf("handed %q while paused", s)
	case <-time.After(50 * time.Millisecond):
	}
	r.resume()
	if s := <-next; s != "more" {
		t.Fatalf("after resume: %q", s)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Close ends the input for the reader after what was held; the backend's
// end fails a writer that waits and every later one.
func TestRelayCloseAndBackendEnd(t *testing.T) {
	r := newInputRelay()
	in := r.open()
	go func() { _, _ = r.Write([]byte("last")); _ = r.Close() }()
	got, err := io.ReadAll(in)
	if err != nil || string(got) != "last" {
		t.Fatalf("read to EOF: %q, %v", got, err)
	}

	r = newInputRelay()
	r.open()
	if _, err := r.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := r.Write([]byte("waits")); done <- err }()
	time.Sleep(10 * time.Millisecond)
	r.closeBackend()
	if err := <-done; !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("a waiting write after the process ended: %v", err)
	}
	if _, err := r.Write([]byte("x")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("a write after the process ended: %v", err)
	}
}
