package supervisor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/runtime/launcher/statedir"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// An agent that has not read the input it was given is busy, not idle: a
// hibernate is refused with the stable code input-pending (not internal),
// nothing is checkpointed, and the sandbox runs on and can be deleted.
// The agent here never reads its stdin, and one write of more than its
// stdin pipe holds leaves a chunk in flight.
func TestHibernateRefusedInputPending(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "pi")
	if err := os.WriteFile(agent, []byte("#!/bin/busybox sh\nexec /bin/busybox sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := newFixtureAgent(t, agent, 200)
	c := f.dial(t)
	in := f.create(t, c)
	h := &hibernateSession{t: t, c: c, id: in.Sandbox, tr: &transcript{}}
	if err := h.attach(c); err != nil {
		t.Fatal(err)
	}
	// More than the sandbox's stdin pipe holds (64 KiB), less than the
	// pipe and the relay's chunk in flight: the write is taken whole, and
	// the launcher's stdin copier is left blocked on a chunk.
	data := bytes.Repeat([]byte("x"), 100<<10)
	if err := c.Call(tctx(t), Request{Op: "write", Sandbox: h.id, Epoch: h.epoch, InputID: "big", Data: data}, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
	err := c.Call(tctx(t), Request{Op: "hibernate", Sandbox: h.id}, nil)
	var e *Error
	if !isCode(err, rpcerr.InputPending) || !asError(err, &e) || e.StartFresh {
		t.Fatalf("hibernate of an agent that has not read its input: %v, want %s", err, rpcerr.InputPending)
	}
	if st := h.status(); st != StatusRunning {
		t.Fatalf("after the refused hibernate the sandbox is %s, want running", st)
	}
	if _, err := os.Lstat(statedir.HibernateDir(f.sc.State, h.id)); !os.IsNotExist(err) {
		t.Errorf("a refused hibernate left a checkpoint dir (%v)", err)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: h.id}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}
