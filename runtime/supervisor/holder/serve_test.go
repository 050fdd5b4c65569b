package holder

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/runtime/bridge"
	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// protocolHolder is a holder serving its protocol over a real socket and a
// real bridge whose sandbox is a pair of pipes (the launch is the
// supervisor tests' business, with real runsc): what this tests is the
// holder API itself.
func protocolHolder(t *testing.T) (sock string, stdin *bufio.Reader, stdout io.Writer) {
	t.Helper()
	h, stdin, stdout := newProtocolHolder(t)
	return Socket(h.spec.StateRoot, h.spec.ID), stdin, stdout
}

// newProtocolHolder is protocolHolder's holder itself, for a test that
// ends its "sandbox" (closes h.done).
func newProtocolHolder(t *testing.T) (h *holder, stdin *bufio.Reader, stdout io.Writer) {
	t.Helper()
	root := t.TempDir()
	h, err := newHolder(Spec{ID: "pp-t", StateRoot: root, Deployment: "d", Agent: "a", Profile: "p", Linger: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	h.sess = bridge.Start(inW, map[string]io.Reader{"stdout": outR}, bridge.Limits{MemBytes: 1 << 20, SpillBytes: 1 << 20, SpillDir: t.TempDir()})
	go func() { _ = lineserve.Accept(h.ln, h.serve) }()
	t.Cleanup(func() { h.ln.Close(); outW.Close(); inR.Close() })
	return h, bufio.NewReader(inR), outW
}

// signalled is a process that records the signals it is sent (and fails
// them with err); the holder calls nothing else of it here.
type signalled struct {
	execution.Process
	got []syscall.Signal
	err error
}

func (p *signalled) Signal(sig syscall.Signal) error {
	p.got = append(p.got, sig)
	return p.err
}

// The socket is 0600 in a 0700 directory; the ops answer with their typed
// results and the shared error codes.
func TestHolderAPI(t *testing.T) {
	skip.UnlessRoot(t, "the holder answers only root peers")
	h, stdin, stdout := newProtocolHolder(t)
	sock := Socket(h.spec.StateRoot, h.spec.ID)
	sigs := &signalled{}
	h.proc = sigs
	for p, want := range map[string]os.FileMode{filepath.Dir(sock): 0o700, sock: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want %v", p, fi.Mode().Perm(), err, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	st, err := Inspect(ctx, sock)
	if err != nil || st.Sandbox != "pp-t" || st.Deployment != "d" || st.Exited {
		t.Fatalf("inspect: %+v %v", st, err)
	}
	c, err := Dial(sock, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	att, err := c.Attach(ctx, 0)
	if err != nil || att.Epoch != 1 {
		t.Fatalf("attach: %+v %v", att, err)
	}
	if _, err := stdout.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-c.Events:
		if e.Event != EventOutput || string(e.Data) != "hello\n" || e.Sandbox != "pp-t" {
			t.Fatalf("event: %+v", e)
		}
	case <-ctx.Done():
		t.Fatal("no output event")
	}
	got := make(chan string, 1)
	go func() { line, _ := stdin.ReadString('\n'); got <- line }() // io.Pipe: the write waits for its reader
	w, err := Write(ctx, sock, att.Epoch, "i1", []byte("in\n"))
	if err != nil || !w.Applied {
		t.Fatalf("write: %+v %v", w, err)
	}
	if line := <-got; line != "in\n" {
		t.Fatalf("stdin got %q", line)
	}
	if w, err := Write(ctx, sock, att.Epoch, "i1", []byte("in\n")); err != nil || w.Applied {
		t.Fatalf("duplicate write: %+v %v", w, err)
	}
	wantCode := func(what string, err error, code rpcerr.Code) {
		t.Helper()
		var he *Error
		if !errors.As(err, &he) || he.Code != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
	}
	_, err = Write(ctx, sock, att.Epoch+1, "i2", []byte("x"))
	wantCode("write under a wrong epoch", err, rpcerr.Fenced)
	if a, err := Ack(ctx, sock, 1); err != nil || a.Acked != 1 {
		t.Fatalf("ack: %+v %v", a, err)
	}
	_, err = c.Attach(ctx, 0)
	wantCode("attach behind the ack", err, rpcerr.OutOfOrder)
	wantCode("release while running", Release(ctx, sock), rpcerr.State)
	wantCode("unknown op", call(ctx, sock, Request{Op: "bogus"}, nil), rpcerr.UnknownOp)
	wantCode("bad token", SetMCPToken(ctx, sock, "has space"), rpcerr.Malformed)
	if err := SetMCPToken(ctx, sock, "tok-1"); err != nil {
		t.Fatalf("mcpToken: %v", err)
	}
	// signal goes to the process the holder owns; a name outside
	// Signals is refused before it.
	if r, err := Signal(ctx, sock, "TERM"); err != nil || r.Signal != "SIGTERM" || len(sigs.got) != 1 || sigs.got[0] != syscall.SIGTERM {
		t.Fatalf("signal: %+v %v, the process got %v", r, err, sigs.got)
	}
	_, err = Signal(ctx, sock, "USR1")
	wantCode("signal USR1", err, rpcerr.Malformed)
	sigs.err = errors.New("no sandbox pp-t")
	_, err = Signal(ctx, sock, "KILL")
	wantCode("signal to a process that cannot take it", err, rpcerr.State)
	if len(sigs.got) != 2 {
		t.Fatalf("the process got %v", sigs.got)
	}
	if r, err := CloseInput(ctx, sock, att.Epoch); err != nil || !r.Closed {
		t.Fatalf("closeInput: %+v %v", r, err)
	}

	// A frame of another version, or with a field the API lacks, is refused.
	raw, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	br := bufio.NewReader(raw)
	for _, line := range []string{`{"v":2,"id":"x","op":"inspect"}`, `{"v":1,"id":"x","op":"inspect","sandbox":"pp-t"}`} {
		if _, err := raw.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := br.ReadString('\n')
		if err != nil || !strings.Contains(resp, `"code":"malformed"`) {
			t.Fatalf("%s: %q %v", line, resp, err)
		}
	}
}
