package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// A hibernated sandbox whose holder dies while no supervisor runs has no
// owner left: the next supervisor drops the dead holder's socket and
// cannot adopt it, and no holder can wake another's checkpoint. gc keeps
// the checkpoint while the holder lives (supervisor down or not) and
// removes it once the holder is dead.
func TestOrphanedHibernationGC(t *testing.T) {
	f := newFixture(t, 200)
	c := f.dial(t)
	in := f.create(t, c)
	h := &hibernateSession{t: t, id: in.Sandbox, tr: &transcript{}}
	if err := h.attach(c); err != nil {
		t.Fatal(err)
	}
	h.turn()
	pid := holderPID(t, f.sc.State, h.id)
	h.hibernate()
	f.stop()
	inv := inventory.Inventory{StateRoot: f.sc.State, RunscPath: f.sc.Runsc}
	if rep, err := inv.GC(); err != nil || len(rep.Removed) > 0 || !statedir.Hibernated(f.sc.State, h.id) {
		t.Fatalf("gc with the holder alive and no supervisor: %+v %v (hibernated %v)", rep, err, statedir.Hibernated(f.sc.State, h.id))
	}

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed holder was not reaped in 30 s")
		}
	}
	f.start(t)
	c = f.dial(t)
	if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: h.id}, nil); !isCode(err, rpcerr.NotFound) {
		t.Fatalf("a supervisor adopted a sandbox whose holder is dead: %v", err)
	}
	rep, err := inv.GC()
	if err != nil || !slices.Contains(rep.Removed, h.id) || len(rep.Errors) > 0 {
		t.Fatalf("gc of the orphaned checkpoint: %+v %v", rep, err)
	}
	if _, err := os.Lstat(statedir.HibernateDir(f.sc.State, h.id)); !os.IsNotExist(err) {
		t.Errorf("the orphaned checkpoint is still there (%v)", err)
	}
	// The supervisor that found the holder dead removed what was only
	// the holder's: its bundle, its log, its socket.
	for _, d := range []string{"hibernate", "run", "records", "net/leases", "bundles", "holders"} {
		if ents, _ := os.ReadDir(filepath.Join(f.sc.State, d)); len(ents) > 0 {
			t.Errorf("%s left: %v", d, ents)
		}
	}
}
