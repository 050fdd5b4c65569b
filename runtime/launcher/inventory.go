package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// Inventory: ps, kill and gc
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
	Teardown []UndoFailure `json:"teardown,omitempty"`
}

// Inventory reads sandboxes from one state root with one runsc.
type Inventory struct {
	StateRoot string
	RunscPath string
}

func (inv Inventory) runsc() *runsc {
	return &runsc{path: inv.RunscPath, root: filepath.Join(inv.StateRoot, "runsc"), network: "none"}
}

type runscContainer struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// containers lists runsc's containers in the state root.
func (inv Inventory) containers() (map[string]string, error) {
	out := map[string]string{}
	if _, err := os.Stat(inv.runsc().root); errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	cmd := exec.Command(inv.RunscPath, "--root", inv.runsc().root, "list", "-format", "json")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	data, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	var cs []runscContainer
	if err := json.Unmarshal(data, &cs); err != nil {
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	for _, c := range cs {
		out[c.ID] = c.Status
	}
	return out, nil
}

// PS joins the launcher's records with runsc's containers.
func (inv Inventory) PS() ([]Entry, error) {
	recs, err := Records(inv.StateRoot)
	if err != nil {
		return nil, err
	}
	cs, err := inv.containers()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, r := range recs {
		e := Entry{ID: r.ID, Status: "absent", Launcher: "dead", Profile: r.Profile, Agent: r.Agent,
			Deployment: r.Deployment, Network: r.Network, Started: r.Started.Format("2006-01-02T15:04:05Z"),
			Garbage: r.ended(), Teardown: r.Teardown}
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
	for _, id := range dirNames(filepath.Join(inv.StateRoot, "hibernate")) {
		if listed[id] {
			continue
		}
		e := Entry{ID: id, Status: "hibernated", Launcher: "none", Garbage: !hibernationOwned(inv.StateRoot, id)}
		if img, err := loadImage(inv.StateRoot, id); err == nil {
			e.Network, e.Started = img.Network, img.Taken.Format("2006-01-02T15:04:05Z")
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Kill signals the container of a live sandbox; its launcher then sees
// runsc end and tears everything down. SIGKILL reaches every process in
// the container.
func (inv Inventory) Kill(id string, sig unix.Signal) error {
	recs, err := Records(inv.StateRoot)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(recs, func(r Record) bool { return r.ID == id })
	if i < 0 {
		return fmt.Errorf("no sandbox %s under %s", id, inv.StateRoot)
	}
	if recs[i].ended() {
		return fmt.Errorf("sandbox %s has no live launcher or its teardown failed; use gc", id)
	}
	if err := inv.awaitStarted(id); err != nil {
		return err
	}
	args := []string{"kill"}
	if sig == unix.SIGKILL {
		args = append(args, "--all")
	}
	return inv.runsc().run(append(args, id, unix.SignalName(sig))...)
}

// startWait bounds how long Kill (and Checkpoint) waits for a launching
// sandbox's container to exist.
const startWait = 30 * time.Second

// awaitStarted returns once runsc reports container id past its creation.
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
func (inv Inventory) awaitStarted(id string) error {
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
	for _, dir := range []string{rs.root, recordsDir(inv.StateRoot)} {
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
		if st, err := rs.status(id); err == nil && st != "creating" && st != "created" {
			return nil
		}
		recs, err := Records(inv.StateRoot)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(recs, func(r Record) bool { return r.ID == id })
		if i < 0 || recs[i].ended() {
			return fmt.Errorf("sandbox %s ended before runsc started its container", id)
		}
		if pidfd < 0 {
			// Opened after the liveness check above: if the pid was reused
			// since, the next round's check says so (the start time).
			if pidfd, err = unix.PidfdOpen(recs[i].LauncherPID, 0); err != nil {
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
	recs, err := Records(inv.StateRoot)
	if err != nil {
		return rep, err
	}
	live := map[string]bool{}
	uplinks := map[string]string{}
	var dead []string
	// A hibernated sandbox has no record but keeps its lease for its wake
	// (hibernate.go): while the process that can wake it lives, it is
	// live; once that process is gone it is an orphan (hibernate_owner.go).
	hibernated := dirNames(filepath.Join(inv.StateRoot, "hibernate"))
	for _, name := range hibernated {
		if hibernationOwned(inv.StateRoot, name) {
			live[name] = true
		}
	}
	for _, r := range recs {
		if !r.ended() {
			live[r.ID] = true
			continue
		}
		if live[r.ID] {
			continue // a dead record beside a live checkpoint: keep both
		}
		dead = append(dead, r.ID)
		uplinks[r.ID] = r.Uplink
	}
	cs, err := inv.containers()
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
	netState := filepath.Join(inv.StateRoot, "net")
	for _, name := range dirNames(filepath.Join(netState, "netns")) {
		if !live[name] {
			ids[name] = true
		}
	}
	for _, name := range dirNames(filepath.Join(inv.StateRoot, "run")) {
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
		rep.note("mounts under the runsc root", unmountBeneath(inv.runsc().root))
	}
	return rep, nil
}

// Remove removes one sandbox whose launcher is gone, as gc would; a
// sandbox with a live launcher is refused (kill it instead).
func (inv Inventory) Remove(id string) (GCReport, error) {
	var rep GCReport
	recs, err := Records(inv.StateRoot)
	if err != nil {
		return rep, err
	}
	uplink := ""
	for _, r := range recs {
		if r.ID == id {
			if !r.ended() {
				return rep, fmt.Errorf("sandbox %s has a live launcher; kill it instead", id)
			}
			uplink = r.Uplink
		}
	}
	cs, err := inv.containers()
	if err != nil {
		return rep, err
	}
	_, known := cs[id]
	inv.remove(&rep, id, known, uplink)
	rep.note("mounts under the runsc root", unmountBeneath(inv.runsc().root))
	return rep, nil
}

// remove deletes every object named from id.
func (inv Inventory) remove(rep *GCReport, id string, container bool, uplink string) {
	if container {
		rep.note("container "+id, inv.runsc().run("delete", "--force", id))
	}
	rep.note("network of "+id, sandboxnet.Remove(filepath.Join(inv.StateRoot, "net"), id, uplink))
	rep.note("cgroups of "+id, removeCgroups(id))
	runDir := filepath.Join(inv.StateRoot, "run", id)
	// The private overlay root and the staged bind sources (binds.go).
	rep.note("run dir of "+id, removeRunDir(runDir))
	if !hibernationOwned(inv.StateRoot, id) {
		rep.note("checkpoint of "+id, RemoveImage(inv.StateRoot, id))
	}
	rep.note("record of "+id, removeRecord(inv.StateRoot, id))
	rep.Removed = append(rep.Removed, id)
}

func dirNames(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// cgroupParent is the cgroup directory every sandbox's cgroup lives in.
const cgroupParent = "paseo-sandbox"

// cgroupMounts lists the mount points of cgroup (v1) and cgroup2
// hierarchies.
func cgroupMounts() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) > 4 && len(g) > 0 && (g[0] == "cgroup" || g[0] == "cgroup2") {
			out = append(out, f[4])
		}
	}
	return out
}

// removeCgroups removes the cgroup of id in every hierarchy. Only ids gc
// found under its own state root get here: the cgroup parent is shared by
// every state root on the host, so it is never scanned for ids. A cgroup with
// processes cannot be removed; the error says so.
func removeCgroups(id string) error {
	var errs []error
	for _, m := range cgroupMounts() {
		p := filepath.Join(m, cgroupParent, id)
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
