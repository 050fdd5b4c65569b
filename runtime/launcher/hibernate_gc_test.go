package launcher

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// gc and checkpoints: a checkpoint whose owner (the process that took it,
// the holder) lives is kept with its lease, and so is one whose owner
// cannot be told (unknown, unreadable, in another pid namespace); once the owner is dead nothing can wake it, and gc
// removes the image and the lease, leaving nothing.
func TestGCRemovesOrphanedHibernation(t *testing.T) {
	s, _ := hibernateSandbox(t)
	id := "pp-hibgc-" + fmt.Sprint(os.Getpid())
	r := s.startRun(t, id, staticSecret("v"), false)
	r.line(t, "one")
	if _, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc}); err != nil {
		t.Fatal(err)
	}
	r.ended(t)
	inv := inventory.Inventory{StateRoot: s.state, RunscPath: s.runsc}
	ownerPath := filepath.Join(statedir.HibernateDir(s.state, id), statedir.OwnerFile)
	var o statedir.Owner
	if data, err := os.ReadFile(ownerPath); err != nil || json.Unmarshal(data, &o) != nil || o.PID != os.Getpid() || o.Start != statedir.ProcessStart(os.Getpid()) || o.PidNS != statedir.PidNamespace() {
		t.Fatalf("owner file %+v (%v): want this process, which took the checkpoint", o, err)
	}
	listed := func(what string, garbage bool) {
		t.Helper()
		es, err := inv.PS()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(es, func(e inventory.Entry) bool { return e.ID == id })
		if i < 0 || es[i].Status != "hibernated" || es[i].Garbage != garbage || es[i].Network != "sandbox" {
			t.Fatalf("%s: ps lists %+v, want %s hibernated (network sandbox) with garbage %v", what, es, id, garbage)
		}
	}
	keeps := func(what string) {
		t.Helper()
		listed(what, false)
		rep, err := inv.GC()
		if err != nil || len(rep.Removed) > 0 || len(rep.Errors) > 0 {
			t.Fatalf("%s: gc %+v %v, want nothing removed", what, rep, err)
		}
		if !statedir.Hibernated(s.state, id) {
			t.Fatalf("%s: gc removed the checkpoint", what)
		}
		if _, ok, err := sandboxnet.LeasedLink(filepath.Join(s.state, "net"), netip.Prefix{}, id); !ok || err != nil {
			t.Fatalf("%s: gc released the lease (%v)", what, err)
		}
	}
	keeps("owner alive")

	// Fail safe: an owner nobody can tell (a checkpoint from before owners
	// were recorded) is kept.
	data, _ := os.ReadFile(ownerPath)
	if err := os.Remove(ownerPath); err != nil {
		t.Fatal(err)
	}
	keeps("owner unknown")
	if err := os.WriteFile(ownerPath, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	keeps("owner unreadable")
	if err := os.WriteFile(ownerPath, data, 0o600); err != nil {
		t.Fatal(err)
	}

	// The owner dies: here a real process that lived and was reaped
	// stands for the holder (a holder killed while its sandbox is
	// hibernated is in the supervisor's TestOrphanedHibernationGC).
	dead := exec.Command("/bin/sleep", "60")
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	gone := statedir.Owner{PID: dead.Process.Pid, Start: statedir.ProcessStart(dead.Process.Pid), PidNS: "pid:[1]"}
	_ = dead.Process.Kill()
	_ = dead.Wait()
	if gone.Start == 0 {
		t.Fatal("no start time for a live child")
	}
	// A dead pid of another pid namespace tells gc nothing: kept.
	data, _ = json.Marshal(gone)
	if err := os.WriteFile(ownerPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	keeps("owner in another pid namespace")
	gone.PidNS = statedir.PidNamespace()
	data, _ = json.Marshal(gone)
	if err := os.WriteFile(ownerPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	listed("owner dead", true)
	rep, err := inv.GC()
	if err != nil || !slices.Contains(rep.Removed, id) || len(rep.Errors) > 0 {
		t.Fatalf("gc of a checkpoint whose owner is dead: %+v %v", rep, err)
	}
	if _, err := os.Lstat(statedir.HibernateDir(s.state, id)); !os.IsNotExist(err) {
		t.Errorf("the orphaned checkpoint is still there (%v)", err)
	}
	s.assertClean(t)
	if rep, err := inv.GC(); err != nil || len(rep.Removed) > 0 {
		t.Errorf("a second gc found %+v %v", rep, err)
	}
}
