// Package inventory is ps, kill and gc over one state root: it joins the
// launcher's records (statedir) with runsc's own view of its containers
// (runsc), signals a live sandbox's container, and removes what no live
// launcher owns. It never imports the launcher: what it knows of a
// sandbox is what the state root and runsc say.
package inventory

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher/mounts"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// ps, kill and gc
//
// The launcher's records and runsc's own state are two views of the same
// sandboxes; ps joins them so an operator sees both what runs and what was
// left behind. Only a sandbox whose launcher is alive is live: everything
// else under the state root (a record of a dead launcher, a container
// runsc knows but no record names, a pinned namespace, a lease, a run dir
// or a cgroup without a live record) is garbage, and gc removes it. So is
// a sandbox whose teardown failed: its record names the failed steps, and
// its launch is over even while the process that ran it lives on (a
// holder outlives its launches).

// Entry is one sandbox as ps reports it.
type Entry struct {
	ID string `json:"id"`
	// Status is runsc's (created, running, stopped), "absent", or
	// "hibernated" (a checkpoint, no container; Started is when it was
	// taken).
	Status string `json:"status"`
	// Launcher is alive, dead (the record's launcher is gone) or none (no
	// record: the container was not made by this launcher or its record is
	// lost).
	Launcher   string `json:"launcher"`
	Profile    string `json:"profile,omitempty"`
	Agent      string `json:"agent,omitempty"`
	Deployment string `json:"deployment,omitempty"`
	Network    string `json:"network,omitempty"`
	Started    string `json:"started,omitempty"`
	// Garbage is true when gc would remove this sandbox.
	Garbage bool `json:"garbage"`
	// Teardown lists the steps of the sandbox's teardown that failed (its
	// record's); what they left is gc's.
	Teardown []statedir.UndoFailure `json:"teardown,omitempty"`
}

// Inventory reads sandboxes from one state root with one runsc.
type Inventory struct {
	StateRoot string
	RunscPath string
}

// runsc is the state root's runsc; the commands the inventory runs (kill,
// delete, list) take network mode none's flags.
func (inv Inventory) runsc() *runsc.Runner {
	return &runsc.Runner{Path: inv.RunscPath, Root: statedir.RunscRoot(inv.StateRoot), Network: "none"}
}

// PS joins the launcher's records with runsc's containers.
func (inv Inventory) PS() ([]Entry, error) {
	recs, err := statedir.Records(inv.StateRoot)
	if err != nil {
		return nil, err
	}
	cs, err := inv.runsc().List()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, r := range recs {
		e := Entry{ID: r.ID, Status: "absent", Launcher: "dead", Profile: r.Profile, Agent: r.Agent,
			Deployment: r.Deployment, Network: r.Network, Started: r.Started.Format("2006-01-02T15:04:05Z"),
			Garbage: r.Ended(), Teardown: r.Teardown}
		if st, ok := cs[r.ID]; ok {
			e.Status = st
			delete(cs, r.ID)
		}
		if r.LauncherAlive() {
			e.Launcher = "alive"
		}
		out = append(out, e)
	}
	for id, st := range cs {
		out = append(out, Entry{ID: id, Status: st, Launcher: "none", Garbage: true})
	}
	// A hibernated sandbox has no record and no container, only its
	// checkpoint: listed so that an operator sees what holds an address
	// lease and root-only memory images, and which of them gc removes
	// (their owner is gone, hibernate_owner.go).
	listed := map[string]bool{}
	for _, e := range out {
		listed[e.ID] = true
	}
	for _, id := range statedir.Names(statedir.HibernateDirs(inv.StateRoot)) {
		if listed[id] {
			continue
		}
		e := Entry{ID: id, Status: "hibernated", Launcher: "none", Garbage: !statedir.HibernationOwned(inv.StateRoot, id)}
		if img, err := statedir.LoadImage(inv.StateRoot, id); err == nil {
			e.Network, e.Started = img.Network, img.Taken.Format("2006-01-02T15:04:05Z")
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Kill's refusals: no record names the id, or the record's launch is over
// (its launcher is gone, or its teardown failed), so the sandbox is an
// orphan and gc's, even while runsc still runs it.
var (
	ErrNoSandbox   = errors.New("no sandbox")
	ErrLaunchEnded = errors.New("has no live launcher or its teardown failed; use gc")
)

// Kill signals the container of a live sandbox; its launcher then sees
// runsc end and tears everything down. SIGKILL reaches every process in
// the container.
func (inv Inventory) Kill(id string, sig unix.Signal) error {
	rec, ok, err := statedir.Lookup(inv.StateRoot, id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w %s under %s", ErrNoSandbox, id, inv.StateRoot)
	}
	if rec.Ended() {
		return fmt.Errorf("sandbox %s %w", id, ErrLaunchEnded)
	}
	if err := inv.AwaitStarted(id); err != nil {
		return err
	}
	args := []string{"kill"}
	if sig == unix.SIGKILL {
		args = append(args, "--all")
	}
	return inv.runsc().Exec(append(args, id, unix.SignalName(sig))...)
}

// startWait bounds how long Kill (and Checkpoint) waits for a launching
// sandbox's container to exist.
const startWait = 30 * time.Second

// AwaitStarted returns once runsc reports container id past its creation.
// A launch (or a wake) has a record and a live launcher from before `runsc
// run` until the end, but runsc knows the container only a moment after it
// starts: a signal in that window (a client's cancel right after
// createSandbox) would fail inside runsc with "loading container: file
// does not exist" and leave the agent running; a checkpoint in that
// window (a hibernate right after createSandbox) fails the same way.
// It fails if the launcher ends or the wait runs out first.
//
// It waits on events, not a clock: runsc writes the container's state in
// its root (created, then running), the launcher's record changes or goes
// when the launch ends, and the launcher's pidfd is readable once it
// exits; each event is a reason to ask runsc again. A holderless launch
// (paseo-policy launch, then kill from another process) shares nothing
// else with the process that signals it, and runsc's state is what the
// signal needs, so runsc is the right witness; a holder signals its own
// launch the same way (execution.Process.Signal).
func (inv Inventory) AwaitStarted(id string) error {
	rs := inv.runsc()
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("waiting for %s's container: %w", id, err)
	}
	defer unix.Close(ifd)
	// Watched before the first look, so a change after it is an event. Not
	// IN_CLOSE_WRITE: `runsc state` opens its lock file for writing, so
	// each look would wake the next.
	const mask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_MOVED_TO | unix.IN_DELETE
	for _, dir := range []string{rs.Root, statedir.RecordsDir(inv.StateRoot)} {
		if _, err := unix.InotifyAddWatch(ifd, dir, mask); err != nil {
			return fmt.Errorf("waiting for %s's container: watching %s: %w", id, dir, err)
		}
	}
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	buf := make([]byte, 4096)
	deadline := time.Now().Add(startWait)
	for {
		if st, err := rs.Status(id); err == nil && st != "creating" && st != "created" {
			return nil
		}
		rec, ok, err := statedir.Lookup(inv.StateRoot, id)
		if err != nil {
			return err
		}
		if !ok || rec.Ended() {
			return fmt.Errorf("sandbox %s ended before runsc started its container", id)
		}
		if pidfd < 0 {
			// Opened after the liveness check above: if the pid was reused
			// since, the next round's check says so (the start time).
			if pidfd, err = unix.PidfdOpen(rec.LauncherPID, 0); err != nil {
				return fmt.Errorf("sandbox %s: its launcher: %w", id, err)
			}
			continue
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("sandbox %s: runsc did not start its container within %v", id, startWait)
		}
		fds := []unix.PollFd{{Fd: int32(ifd), Events: unix.POLLIN}, {Fd: int32(pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("waiting for %s's container: %w", id, err)
		}
		for { // drain: one look answers every event so far
			if _, err := unix.Read(ifd, buf); err != nil {
				break
			}
		}
	}
}

// GCReport says what gc removed, by kind.
type GCReport struct {
	// Removed lists the sandbox ids whose leftovers were removed.
	Removed []string `json:"removed"`
	Errors  []string `json:"errors,omitempty"`
}

func (g *GCReport) note(what string, err error) {
	if err != nil {
		g.Errors = append(g.Errors, what+": "+err.Error())
	}
}

// GC removes everything under the state root that no live launcher owns:
// stopped and half-created containers, orphan namespaces, veths, tables,
// leases, cgroups, run dirs, and checkpoints (with their leases) whose
// holder is gone.
func (inv Inventory) GC() (GCReport, error) {
	var rep GCReport
	recs, err := statedir.Records(inv.StateRoot)
	if err != nil {
		return rep, err
	}
	live := map[string]bool{}
	uplinks := map[string]string{}
	var dead []string
	// A hibernated sandbox has no record but keeps its lease for its wake
	// (the launcher's checkpoint): while the process that can wake it lives, it is
	// live; once that process is gone it is an orphan (statedir/checkpoint.go).
	hibernated := statedir.Names(statedir.HibernateDirs(inv.StateRoot))
	for _, name := range hibernated {
		if statedir.HibernationOwned(inv.StateRoot, name) {
			live[name] = true
		}
	}
	for _, r := range recs {
		if !r.Ended() {
			live[r.ID] = true
			continue
		}
		if live[r.ID] {
			continue // a dead record beside a live checkpoint: keep both
		}
		dead = append(dead, r.ID)
		uplinks[r.ID] = r.Uplink
	}
	cs, err := inv.runsc().List()
	if err != nil {
		return rep, err
	}
	ids := map[string]bool{}
	for _, id := range dead {
		ids[id] = true
	}
	for id := range cs {
		if !live[id] {
			ids[id] = true
		}
	}
	netState := statedir.NetDir(inv.StateRoot)
	for _, name := range statedir.Names(filepath.Join(netState, "netns")) {
		if !live[name] {
			ids[name] = true
		}
	}
	for _, name := range statedir.Names(statedir.RunDirs(inv.StateRoot)) {
		if !live[name] {
			ids[name] = true
		}
	}
	for _, name := range hibernated {
		if !live[name] {
			ids[name] = true
		}
	}
	leases, _ := sandboxnet.Leases(sandboxnet.LeaseDir(netState))
	for _, owner := range leases {
		if !live[owner] {
			ids[owner] = true
		}
	}

	for _, id := range sortedKeys(ids) {
		_, known := cs[id]
		inv.remove(&rep, id, known, uplinks[id])
	}
	if len(ids) > 0 {
		rep.note("mounts under the runsc root", mounts.UnmountBeneath(inv.runsc().Root))
	}
	return rep, nil
}

// Remove removes one sandbox whose launcher is gone, as gc would; a
// sandbox with a live launcher is refused (kill it instead).
func (inv Inventory) Remove(id string) (GCReport, error) {
	var rep GCReport
	rec, ok, err := statedir.Lookup(inv.StateRoot, id)
	if err != nil {
		return rep, err
	}
	if ok && !rec.Ended() {
		return rep, fmt.Errorf("sandbox %s has a live launcher; kill it instead", id)
	}
	uplink := rec.Uplink
	cs, err := inv.runsc().List()
	if err != nil {
		return rep, err
	}
	_, known := cs[id]
	inv.remove(&rep, id, known, uplink)
	rep.note("mounts under the runsc root", mounts.UnmountBeneath(inv.runsc().Root))
	return rep, nil
}

// remove deletes every object named from id.
func (inv Inventory) remove(rep *GCReport, id string, container bool, uplink string) {
	if container {
		rep.note("container "+id, inv.runsc().Exec("delete", "--force", id))
	}
	rep.note("network of "+id, sandboxnet.Remove(statedir.NetDir(inv.StateRoot), id, uplink))
	rep.note("cgroups of "+id, removeCgroups(id))
	// The private overlay root and the staged bind sources.
	rep.note("run dir of "+id, mounts.RemoveDir(statedir.RunDir(inv.StateRoot, id)))
	if !statedir.HibernationOwned(inv.StateRoot, id) {
		rep.note("checkpoint of "+id, statedir.RemoveImage(inv.StateRoot, id))
	}
	rep.note("record of "+id, statedir.RemoveRecord(inv.StateRoot, id))
	rep.Removed = append(rep.Removed, id)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// removeCgroups removes the cgroup of id in every hierarchy. Only ids gc
// found under its own state root get here: the cgroup parent is shared by
// every state root on the host, so it is never scanned for ids. A cgroup with
// processes cannot be removed; the error says so.
func removeCgroups(id string) error {
	var errs []error
	for _, m := range mounts.Cgroups() {
		p := filepath.Join(m, statedir.CgroupsPath(id))
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
