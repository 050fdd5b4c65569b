package supervisor

import (
	"testing"
	"time"
)

// A sandbox created with deleteOnExit is deleted by the supervisor once it
// has exited and the connection that created it is closed (the client was
// killed before it could delete it). Controls: the same sandbox without
// the flag stays listed after its end, and one whose creator's connection
// is still open is left to that client.
func TestDeleteOnExitReapsAnAbandonedSandbox(t *testing.T) {
	f := newFixture(t, 200)
	creator := f.dial(t)
	other := f.dial(t)
	create := func(c *Client, del bool) string {
		var in Info
		if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: f.sc.Facts, DeleteOnExit: del}, &in); err != nil {
			t.Fatalf("createSandbox: %v", err)
		}
		return in.Sandbox
	}
	abandoned := create(creator, true)
	control := create(creator, false)
	held := create(other, true)
	creator.Close() // the client is killed

	status := func() map[string]string {
		var l []Info
		if err := other.Call(tctx(t), Request{Op: "list"}, &l); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, in := range l {
			m[in.Sandbox] = in.Status
		}
		return m
	}
	if m := status(); m[abandoned] != StatusRunning {
		t.Fatalf("a running sandbox whose creator is gone was not kept running: %v", m)
	}
	for _, id := range []string{abandoned, control, held} {
		if err := other.Call(tctx(t), Request{Op: "signal", Sandbox: id, Signal: "KILL"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var m map[string]string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if m = status(); m[abandoned] == "" && m[control] == StatusExited && m[held] == StatusExited {
			break
		}
	}
	if m[abandoned] != "" {
		t.Errorf("the exited deleteOnExit sandbox with no client is still listed: %v", m)
	}
	time.Sleep(3 * time.Second) // several reaper ticks
	if m = status(); m[control] != StatusExited || m[held] != StatusExited {
		t.Errorf("controls: without the flag, and with its creator's connection open, an exited sandbox stays: %v", m)
	}
	for _, id := range []string{control, held} {
		if err := other.Call(tctx(t), Request{Op: "delete", Sandbox: id}, nil); err != nil {
			t.Fatal(err)
		}
	}
	f.assertNothingLeft(t)
}

// The holder keeps deleteOnExit: a supervisor started after the creator's
// was stopped adopts the sandbox and reaps it once it ended with nobody
// holding it. Control: an adopted sandbox created without it stays.
func TestDeleteOnExitAfterSupervisorRestart(t *testing.T) {
	f := newFixture(t, 200)
	c := f.dial(t)
	var reaped, kept Info
	for _, x := range []struct {
		in  *Info
		del bool
	}{{&reaped, true}, {&kept, false}} {
		if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: f.sc.Facts, DeleteOnExit: x.del}, x.in); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	f.stop()
	f.start(t)
	c = f.dial(t)
	for _, id := range []string{reaped.Sandbox, kept.Sandbox} {
		if err := c.Call(tctx(t), Request{Op: "signal", Sandbox: id, Signal: "KILL"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	gone := false
	for deadline := time.Now().Add(60 * time.Second); !gone && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: reaped.Sandbox}, nil)
		gone = isCode(err, "not-found")
	}
	if !gone {
		t.Error("the adopted deleteOnExit sandbox was not reaped after its end")
	}
	var in Info
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = c.Call(tctx(t), Request{Op: "inspect", Sandbox: kept.Sandbox}, &in); err != nil || in.Status == StatusExited {
			break
		}
	}
	time.Sleep(3 * time.Second) // several reaper ticks
	if err = c.Call(tctx(t), Request{Op: "inspect", Sandbox: kept.Sandbox}, &in); err != nil || in.Status != StatusExited {
		t.Errorf("control: the adopted sandbox without the flag: %+v %v", in, err)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: kept.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}
