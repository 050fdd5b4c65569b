package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// hibernateSession drives one attached client of a sandbox: prompts, reads
// and checks the transcript (a gap or duplicate fails the test).
type hibernateSession struct {
	t     *testing.T
	c     *Client
	id    string
	epoch uint64
	tr    *transcript
	n     int // requests sent, for unique ids
}

func (h *hibernateSession) attach(c *Client) error {
	h.c = c
	var att struct{ Epoch uint64 }
	if err := c.Call(tctx(h.t), Request{Op: "attach", Sandbox: h.id, Cursor: h.tr.Cursor}, &att); err != nil {
		return err
	}
	h.epoch = att.Epoch
	return nil
}

// send writes one Pi command under a fresh input id and returns its id.
func (h *hibernateSession) send(typ, extra string) string {
	h.t.Helper()
	h.n++
	id := fmt.Sprintf("%s-%d", typ, h.n)
	line := fmt.Sprintf(`{"id":%q,"type":%q%s}`+"\n", id, typ, extra)
	if err := h.c.Call(tctx(h.t), Request{Op: "write", Sandbox: h.id, Epoch: h.epoch, InputID: "in-" + id, Data: []byte(line)}, nil); err != nil {
		h.t.Fatalf("write %s: %v", id, err)
	}
	return id
}

// turn prompts and waits for the turn to settle.
func (h *hibernateSession) turn() {
	h.t.Helper()
	settled := strings.Count(h.tr.Stdout.String(), `"agent_settled"`)
	h.send("prompt", `,"message":"hello"`)
	deadline := time.After(60 * time.Second)
	for strings.Count(h.tr.Stdout.String(), `"agent_settled"`) == settled {
		select {
		case e, ok := <-h.c.Events:
			if !ok {
				h.t.Fatal("the attachment ended mid-turn")
			}
			h.tr.add(h.t, e)
		case <-deadline:
			var in Info
			_ = h.c.Call(tctx(h.t), Request{Op: "inspect", Sandbox: h.id}, &in)
			h.t.Fatalf("the turn did not settle (cursor %d, %+v): %q", h.tr.Cursor, in, tail(h.tr.Stdout.String()))
		}
	}
	_ = h.c.Call(tctx(h.t), Request{Op: "ack", Sandbox: h.id, Cursor: h.tr.Cursor}, nil)
}

// messageCount asks Pi for its state: the count lives in its memory only.
func (h *hibernateSession) messageCount() int {
	h.t.Helper()
	id := h.send("get_state", "")
	if !readUntil(h.t, h.c, h.id, h.tr, `"id":"`+id+`"`, 60*time.Second) {
		h.t.Fatalf("no answer to %s: %q", id, tail(h.tr.Stdout.String()))
	}
	for _, fr := range h.tr.frames(h.t) {
		if fr["id"] == id {
			data, _ := fr["data"].(map[string]any)
			n, _ := data["messageCount"].(float64)
			return int(n)
		}
	}
	h.t.Fatalf("no frame %s", id)
	return 0
}

func (h *hibernateSession) status() string {
	h.t.Helper()
	var in Info
	if err := h.c.Call(tctx(h.t), Request{Op: "inspect", Sandbox: h.id}, &in); err != nil {
		h.t.Fatalf("inspect: %v", err)
	}
	return in.Status
}

func (h *hibernateSession) hibernate() {
	h.t.Helper()
	var in Info
	if err := h.c.Call(tctx(h.t), Request{Op: "hibernate", Sandbox: h.id}, &in); err != nil {
		h.t.Fatalf("hibernate: %v", err)
	}
	if in.Status != StatusHibernated {
		h.t.Fatalf("hibernate answered %+v", in)
	}
}

// Explicit hibernate between turns, woken by the next write, five times:
// Pi's memory (its message count) survives, the transcript is complete and
// in order across every wake, inspect and list say hibernated, the image
// is root-only under the state root and gone after the wake. A supervisor
// restart while hibernated adopts it hibernated and an attach wakes it. A
// key rotated while hibernated wakes it all the same: the provider key is
// in no image (the model route adds it, issue 24), so the wake takes the
// key as it is now; delete then leaves nothing.
func TestHibernateThroughSupervisor(t *testing.T) {
	f := newFixture(t, 200)
	c := f.dial(t)
	in := f.create(t, c)
	h := &hibernateSession{t: t, id: in.Sandbox, tr: &transcript{}}
	if err := h.attach(c); err != nil {
		t.Fatal(err)
	}
	h.turn()
	for round := 1; round <= 5; round++ {
		h.hibernate()
		if st := h.status(); st != StatusHibernated {
			t.Fatalf("round %d: inspect says %s", round, st)
		}
		var list []Info
		if err := h.c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 1 || list[0].Status != StatusHibernated {
			t.Fatalf("round %d: list %+v %v", round, list, err)
		}
		fi, err := os.Stat(statedir.HibernateDir(f.sc.State, h.id))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("round %d: checkpoint dir %v %v", round, fi, err)
		}
		if got, want := h.messageCount(), 2*round; got != want { // the write woke it
			t.Fatalf("round %d: after wake Pi has %d messages, want %d", round, got, want)
		}
		if st := h.status(); st != StatusRunning {
			t.Fatalf("round %d: after the write the sandbox is %s", round, st)
		}
		if statedir.Hibernated(f.sc.State, h.id) {
			t.Fatalf("round %d: the image outlived the wake", round)
		}
		h.turn()
	}

	h.hibernate()
	f.stop()
	f.start(t)
	c = f.dial(t)
	h.c = c
	if st := h.status(); st != StatusHibernated {
		t.Fatalf("after a supervisor restart: %s, want hibernated", st)
	}
	if err := h.attach(c); err != nil { // wakes it
		t.Fatalf("attach after restart: %v", err)
	}
	if got := h.messageCount(); got != 12 {
		t.Fatalf("after restart and wake: %d messages, want 12", got)
	}

	h.hibernate()
	f.stop()
	f.cfg.Secrets = func(_, _ string) ([]byte, error) { return []byte("rotated-key"), nil }
	f.start(t)
	c = f.dial(t)
	h.c = c
	if err := h.attach(c); err != nil {
		t.Fatalf("wake after the key rotated: %v, want it woken", err)
	}
	if st := h.status(); st != StatusRunning {
		t.Fatalf("after the wake with a rotated key: %s, want running", st)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: h.id}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
	if ents, _ := os.ReadDir(f.sc.State + "/hibernate"); len(ents) > 0 {
		t.Errorf("checkpoints left: %v", ents)
	}
}

// With hibernateAfterSeconds set, a settled sandbox hibernates on its own
// while its client stays attached, and the next write wakes it.
func TestIdleHibernation(t *testing.T) {
	f := newFixture(t, 200)
	var reg map[string]any
	if err := json.Unmarshal(f.sc.Registry, &reg); err != nil {
		t.Fatal(err)
	}
	reg["deployments"].(map[string]any)["host-alice"].(map[string]any)["hibernateAfterSeconds"] = 2
	data, _ := json.Marshal(reg)
	f.cfg.Registry = schema.Input{Name: "registry.json", Data: data}
	f.restartWith(t, Limits{})
	c := f.dial(t)
	in := f.create(t, c)
	h := &hibernateSession{t: t, id: in.Sandbox, tr: &transcript{}}
	if err := h.attach(c); err != nil {
		t.Fatal(err)
	}
	h.turn()
	deadline := time.Now().Add(30 * time.Second)
	for h.status() != StatusHibernated {
		if time.Now().After(deadline) {
			t.Fatal("an idle sandbox did not hibernate in 30 s with hibernateAfterSeconds 2")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := h.messageCount(); got != 2 {
		t.Fatalf("after the idle wake: %d messages, want 2", got)
	}
	h.turn()
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: h.id}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}

func asError(err error, e **Error) bool { return errors.As(err, e) }

// A hibernate right after createSandbox, before the first turn, lands in
// the moment when the launch has started runsc but runsc does not know
// the container yet (the window Inventory.Kill waits out): runsc
// checkpoint would fail with "loading container: file does not exist"
// and the caller get internal. The checkpoint waits as kill does; the
// sandbox hibernates, a write wakes it and Pi answers, delete leaves
// nothing.
func TestHibernateRightAfterCreate(t *testing.T) {
	f := newFixture(t, 200)
	c := f.dial(t)
	in := f.create(t, c)
	h := &hibernateSession{t: t, id: in.Sandbox, tr: &transcript{}}
	if err := h.attach(c); err != nil {
		t.Fatal(err)
	}
	h.hibernate()
	if got := h.messageCount(); got != 0 { // the write woke it
		t.Fatalf("after the wake Pi has %d messages, want 0", got)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: h.id}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}
