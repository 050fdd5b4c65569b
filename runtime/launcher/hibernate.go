package launcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
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

// ImageFile is the description of an image, beside the image directory.
const ImageFile = "image.json"

// OwnerFile names the process that took the checkpoint and alone can wake
// it (the sandbox's holder: it keeps the stdio pipes and the bridge the
// restored sandbox continues). It is written before runsc checkpoints, so
// gc never mistakes a checkpoint under way for an orphan.
const OwnerFile = "owner.json"

// HibernateDir is where container id's checkpoint lives: root's, 0700,
// under the state root and never in the bundle or the run dir, which the
// sandbox's gofer serves from.
func HibernateDir(stateRoot, id string) string {
	return filepath.Join(stateRoot, "hibernate", id)
}

func imageDir(stateRoot, id string) string {
	return filepath.Join(HibernateDir(stateRoot, id), "image")
}

// Image is what Checkpoint recorded about one checkpoint.
type Image struct {
	ID      string `json:"id"`
	Network string `json:"network"`
	// Link is the sandbox's /30 (network sandbox): gVisor restores the
	// netstack with its addresses and routes, so the wake rebuilds exactly
	// this link.
	Link netip.Prefix `json:"link,omitzero"`
	// Files are the sha256 digests of runsc's image files, by name.
	Files map[string]string `json:"files"`
	// LegacySecretsDigest is read and ignored: images taken while the
	// launcher still filled secret slots recorded the digest of the
	// values, which a wake compared. No launch puts a secret in the
	// sandbox now (the model key stays with the route proxy) and a bundle
	// with a slot is refused (PP-SECRET-SLOT), so there is nothing to
	// compare; the field stays so that such an image still decodes.
	LegacySecretsDigest string `json:"secretsDigest,omitempty"`
	// Ran is how long the sandbox ran, over every launch and wake: the
	// wake gets what is left of wallSeconds, so hibernating does not
	// extend it (time hibernated does not count).
	Ran   time.Duration `json:"ran"`
	Taken time.Time     `json:"taken"`
}

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
func Checkpoint(o CheckpointOptions) (img *Image, err error) {
	if o.StateRoot == "" {
		o.StateRoot = DefaultStateRoot
	}
	if _, err := newRunDirName(o.ID); err != nil {
		return nil, err
	}
	rec, err := recordOf(o.StateRoot, o.ID)
	if err != nil {
		return nil, err
	}
	// Right after a launch started runsc, runsc may not know the container
	// yet and its checkpoint would fail ("loading container: file does not
	// exist"): wait as Kill does.
	if err := (Inventory{StateRoot: o.StateRoot, RunscPath: o.RunscPath}).awaitStarted(o.ID); err != nil {
		return nil, err
	}
	img = &Image{ID: o.ID, Network: rec.Network, Files: map[string]string{}}
	if rec.Network == "sandbox" {
		link, ok, err := sandboxnet.LeasedLink(filepath.Join(o.StateRoot, "net"), o.Pool, o.ID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("sandbox %s holds no address lease", o.ID)
		}
		img.Link = link
	}
	if err := os.MkdirAll(filepath.Dir(HibernateDir(o.StateRoot, o.ID)), 0o700); err != nil {
		return nil, err
	}
	dir := HibernateDir(o.StateRoot, o.ID)
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
	// one but root can reach or swap it (hibernate_path.go).
	if err := checkRootOnlyDir(dir); err != nil {
		return nil, err
	}
	if err := writeOwner(dir); err != nil {
		return nil, err
	}
	rs := &runsc{path: o.RunscPath, root: filepath.Join(o.StateRoot, "runsc"), network: rec.Network}
	if err := rs.run("checkpoint", "--image-path", imageDir(o.StateRoot, o.ID), o.ID); err != nil {
		return nil, err
	}
	if img.Files, err = digestFiles(imageDir(o.StateRoot, o.ID)); err != nil {
		return nil, err
	}
	img.Taken = time.Now().UTC()
	img.Ran = rec.RanBefore + img.Taken.Sub(rec.Started)
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return nil, err
	}
	return img, os.WriteFile(filepath.Join(dir, ImageFile), append(data, '\n'), 0o600)
}

// RemoveImage deletes container id's checkpoint (a wake, once the
// restored container runs; its network now holds the kept lease).
func RemoveImage(stateRoot, id string) error {
	if _, err := newRunDirName(id); err != nil {
		return err
	}
	return os.RemoveAll(HibernateDir(stateRoot, id))
}

// RemoveHibernation deletes a hibernated sandbox's checkpoint and the
// address lease it kept (delete). A lease of a launch still running (a
// record exists) is that launch's and stays.
func RemoveHibernation(stateRoot, id string) error {
	err := RemoveImage(stateRoot, id)
	if _, rerr := recordOf(stateRoot, id); rerr == nil {
		return err
	}
	return errors.Join(err, sandboxnet.ReleaseLeases(filepath.Join(stateRoot, "net"), id))
}

// keepLinkIfHibernated keeps the launch's address lease when the launch
// ends because it was checkpointed (or a wake of a checkpoint failed):
// the link is what the wake needs, and no other sandbox may take it
// meanwhile. gc counts a sandbox with a checkpoint as live.
func (l *launch) keepLinkIfHibernated(n *sandboxnet.Network) {
	if _, err := os.Stat(HibernateDir(l.opts.StateRoot, l.opts.ID)); err == nil {
		n.KeepLease()
	}
}

// Hibernated reports whether container id has a checkpoint.
func Hibernated(stateRoot, id string) bool {
	_, err := os.Stat(filepath.Join(HibernateDir(stateRoot, id), ImageFile))
	return err == nil
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
	img      *Image
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
	if _, err := newRunDirName(l.opts.ID); err != nil {
		return refused(diag.LaunchID, "id", err)
	}
	img, err := loadImage(l.opts.StateRoot, l.opts.ID)
	if err != nil {
		return refused(diag.LaunchWake, "wake", err)
	}
	l.wake = &wake{img: img, imageDir: imageDir(l.opts.StateRoot, l.opts.ID)}
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
	l.cleanup.note("checkpoint image", RemoveImage(l.opts.StateRoot, l.opts.ID))
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
			return fmt.Errorf("runsc restore ended before the container ran (exit %d)", exitCode(err))
		case <-ctx.Done():
			_ = l.rs.stop(l.opts.ID, r.cmd, r.done, l.opts.Grace)
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if st, err := l.rs.status(l.opts.ID); err == nil && st == "running" {
			return nil
		}
	}
}

// runscCommand is `runsc run`, or for a wake `runsc restore` of the image.
func (l *launch) runscCommand() *exec.Cmd {
	if l.wake == nil {
		return l.rs.command(l.opts.ID, l.run.dir)
	}
	args := append(l.rs.flags(), "restore", "--image-path", l.wake.imageDir, "--bundle", l.run.dir, l.opts.ID)
	cmd := exec.Command(l.rs.path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

// status is runsc's status of container id.
func (r *runsc) status(id string) (string, error) {
	cmd := exec.Command(r.path, append(r.flags(), "state", id)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// loadImage reads the image description and checks every image file
// against its recorded digest, and that no file was added or removed.
func loadImage(stateRoot, id string) (*Image, error) {
	dir := HibernateDir(stateRoot, id)
	if err := checkRootOnlyDir(dir); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, ImageFile))
	if err != nil {
		return nil, fmt.Errorf("no checkpoint of %s: %w", id, err)
	}
	var img Image
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&img); err != nil {
		return nil, fmt.Errorf("checkpoint description of %s: %w", id, err)
	}
	if img.ID != id {
		return nil, fmt.Errorf("checkpoint description names %s, not %s", img.ID, id)
	}
	got, err := digestFiles(imageDir(stateRoot, id))
	if err != nil {
		return nil, err
	}
	for _, name := range sortedUnion(got, img.Files) {
		if got[name] != img.Files[name] {
			return nil, fmt.Errorf("checkpoint image file %s does not match the digest recorded at hibernate", name)
		}
	}
	return &img, nil
}

// digestFiles is the sha256 of every regular file in dir (runsc's image
// is flat); anything else refuses.
func digestFiles(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("checkpoint image holds %s, which is not a regular file", e.Name())
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out[e.Name()] = hex.EncodeToString(h.Sum(nil))
	}
	return out, nil
}

func sortedUnion(a, b map[string]string) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		out = append(out, k)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func recordOf(stateRoot, id string) (Record, error) {
	recs, err := Records(stateRoot)
	if err != nil {
		return Record{}, err
	}
	for _, r := range recs {
		if r.ID == id {
			return r, nil
		}
	}
	return Record{}, fmt.Errorf("no running sandbox %s", id)
}

func newRunDirName(id string) (string, error) {
	if strings.ContainsAny(id, "/\x00") || id == "" || id == "." || id == ".." {
		return "", fmt.Errorf("invalid container id")
	}
	return id, nil
}
