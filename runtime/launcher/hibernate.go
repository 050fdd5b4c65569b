package launcher

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// Hibernate and wake (issue 14; docs/supervisor.md "Hibernate")
//
// Checkpoint has runsc write a running sandbox's memory into a root-only
// directory of the state root and stop it; the Launch that ran it then
// ends and tears down as at delete (container, cgroup, proxies, network,
// run dir, record). What a wake needs is kept beside the image: the /30
// the netstack was configured with and the digests of the image files and
// of the injected secrets. Wake is a launch whose start is `runsc restore`:
// the bundle read and preflighted again, the secrets materialized again,
// every bind source staged by descriptor with its pin re-checked, the
// network rebuilt from the bundle on the same link, then restore. Anything
// that does not match refuses the wake (sandbox-unavailable, start fresh);
// nothing ever falls back to a cold start with different state.

// CheckpointOptions name the running sandbox to checkpoint.
type CheckpointOptions struct {
	ID        string
	StateRoot string
	RunscPath string
	// Pool is the launch's address pool (zero: sandboxnet.DefaultPool).
	Pool netip.Prefix
}

// Checkpoint checkpoints the running container and records the image. On
// success runsc has stopped the sandbox and its Launch returns; on failure
// nothing is kept and the sandbox's fate is runsc's (it keeps running
// unless the checkpoint got as far as stopping it).
func Checkpoint(o CheckpointOptions) (img *statedir.Image, err error) {
	if o.StateRoot == "" {
		o.StateRoot = DefaultStateRoot
	}
	if err := statedir.ValidID(o.ID); err != nil {
		return nil, err
	}
	rec, ok, err := statedir.Lookup(o.StateRoot, o.ID)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("no running sandbox %s", o.ID)
	}
	// Right after a launch started runsc, runsc may not know the container
	// yet and its checkpoint would fail ("loading container: file does not
	// exist"): wait as Kill does.
	if err := (inventory.Inventory{StateRoot: o.StateRoot, RunscPath: o.RunscPath}).AwaitStarted(o.ID); err != nil {
		return nil, err
	}
	img = &statedir.Image{ID: o.ID, Network: rec.Network, Files: map[string]string{}}
	if rec.Network == "sandbox" {
		link, ok, err := sandboxnet.LeasedLink(statedir.NetDir(o.StateRoot), o.Pool, o.ID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("sandbox %s holds no address lease", o.ID)
		}
		img.Link = link
	}
	if err := os.MkdirAll(statedir.HibernateDirs(o.StateRoot), 0o700); err != nil {
		return nil, err
	}
	dir := statedir.HibernateDir(o.StateRoot, o.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint dir of %s: %w (is it hibernated already?)", o.ID, err)
	}
	defer func() {
		if err != nil {
			if rerr := os.RemoveAll(dir); rerr != nil {
				err = fmt.Errorf("%w (removing the unfinished checkpoint dir: %v)", err, rerr)
			}
			img = nil
		}
	}()
	// The image will hold the agent's memory and its key: only where no
	// one but root can reach or swap it (statedir/rootonly.go).
	if err := statedir.CheckRootOnlyDir(dir); err != nil {
		return nil, err
	}
	if err := statedir.WriteOwner(dir); err != nil {
		return nil, err
	}
	rs := &runsc.Runner{Path: o.RunscPath, Root: statedir.RunscRoot(o.StateRoot), Network: rec.Network}
	if err := rs.Exec("checkpoint", "--image-path", statedir.ImageDir(o.StateRoot, o.ID), o.ID); err != nil {
		return nil, err
	}
	if img.Files, err = statedir.DigestFiles(statedir.ImageDir(o.StateRoot, o.ID)); err != nil {
		return nil, err
	}
	img.Taken = time.Now().UTC()
	img.Ran = rec.RanBefore + img.Taken.Sub(rec.Started)
	return img, statedir.WriteImage(o.StateRoot, img)
}

// RemoveHibernation deletes a hibernated sandbox's checkpoint and the
// address lease it kept (delete). A lease of a launch still running (a
// record exists) is that launch's and stays.
func RemoveHibernation(stateRoot, id string) error {
	err := statedir.RemoveImage(stateRoot, id)
	if _, ok, rerr := statedir.Lookup(stateRoot, id); rerr == nil && ok {
		return err
	}
	return errors.Join(err, sandboxnet.ReleaseLeases(statedir.NetDir(stateRoot), id))
}

// keepLinkIfHibernated keeps the launch's address lease when the launch
// ends because it was checkpointed (or a wake of a checkpoint failed):
// the link is what the wake needs, and no other sandbox may take it
// meanwhile. gc counts a sandbox with a checkpoint as live.
func (l *launch) keepLinkIfHibernated(n *sandboxnet.Network) {
	if _, err := os.Stat(statedir.HibernateDir(l.opts.StateRoot, l.opts.ID)); err == nil {
		n.KeepLease()
	}
}

// Wake restores container opts.ID from its checkpoint and runs it to
// completion, as Launch does. OnStart is called once runsc reports the
// restored container running; the image is deleted then. Any refusal or
// failure before that is an *UnavailableError and the image is kept for
// the caller to delete when it starts fresh.
func Wake(ctx context.Context, opts Options) (res Result, err error) {
	if opts.ID == "" {
		err := refused(diag.LaunchWake, "wake", errors.New("no container id: a wake restores a hibernated container by its id"))
		return Result{}, &UnavailableError{Reason: "wake: " + err.Error() + "; start the agent fresh", Err: err}
	}
	l := newLaunch(opts)
	defer func() {
		l.teardown()
		res = l.res
	}()
	if err := l.wakePhases(ctx); err != nil {
		err = coded(err)
		return res, &UnavailableError{Reason: "wake: " + err.Error() + "; the checkpoint was not restored, start the agent fresh", Err: err}
	}
	return res, nil
}

// wake is what a restoring launch knows of its image.
type wake struct {
	img      *statedir.Image
	imageDir string
}

func (l *launch) wakeLink() netip.Prefix {
	if l.wake == nil {
		return netip.Prefix{}
	}
	return l.wake.img.Link
}

func (l *launch) ranBefore() time.Duration {
	if l.wake == nil {
		return 0
	}
	return l.wake.img.Ran
}

func (l *launch) wakePhases(ctx context.Context) error {
	if err := statedir.ValidID(l.opts.ID); err != nil {
		return refused(diag.LaunchID, "id", err)
	}
	img, err := statedir.LoadImage(l.opts.StateRoot, l.opts.ID)
	if err != nil {
		return refused(diag.LaunchWake, "wake", err)
	}
	l.wake = &wake{img: img, imageDir: statedir.ImageDir(l.opts.StateRoot, l.opts.ID)}
	onStart := l.opts.OnStart
	l.opts.OnStart = nil
	if err := l.prepare(); err != nil {
		return err
	}
	if l.plan.Network != img.Network {
		return refused(diag.LaunchWake, "wake", fmt.Errorf("the bundle's network mode is %s, the checkpoint's %s", l.plan.Network, img.Network))
	}
	if l.limits.Wall > 0 {
		if l.limits.Wall <= img.Ran {
			return refused(diag.LaunchWake, "wake", fmt.Errorf("the sandbox has run %v of its wall time %v", img.Ran.Round(time.Second), l.limits.Wall))
		}
		l.limits.Wall -= img.Ran
	}
	if l.plan.Network == "sandbox" {
		if err := l.network(ctx); err != nil {
			return err
		}
	}
	r, err := l.start(ctx)
	if err != nil {
		return err
	}
	if err := l.restored(ctx, r); err != nil {
		return err
	}
	// The restored sandbox runs on; an image that would not go is a
	// leftover of this launch, reported with its teardown failures (and
	// keeping its record for ps and gc).
	l.cleanup.note("checkpoint image", statedir.RemoveImage(l.opts.StateRoot, l.opts.ID))
	if onStart != nil {
		onStart()
	}
	l.wait(ctx, r)
	return nil
}

// restored waits until runsc reports the restored container running, or
// fails if runsc restore ends first.
func (l *launch) restored(ctx context.Context, r *running) error {
	for {
		select {
		case err := <-r.done:
			return fmt.Errorf("runsc restore ended before the container ran (exit %d)", runsc.ExitCode(err))
		case <-ctx.Done():
			_ = l.rs.Stop(l.opts.ID, r.proc, r.done, l.opts.Grace)
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if st, err := l.rs.Status(l.opts.ID); err == nil && st == "running" {
			return nil
		}
	}
}

// imageDir is the checkpoint image a wake restores; none for a launch.
func (l *launch) imageDir() string {
	if l.wake == nil {
		return ""
	}
	return l.wake.imageDir
}
