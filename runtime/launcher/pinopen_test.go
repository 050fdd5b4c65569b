package launcher

import (
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
)

// doctor and the launch open a pinned source with one opener
// (pathsafe.OpenPinned), so they agree on it. The workspace bind-mounted
// onto itself since compile is the same device and inode at the same path,
// but a mount beneath its registered root: the launch refuses it
// (RESOLVE_NO_XDEV, PP-PATH-XDEV), and so does doctor now. The control is
// the resolution doctor used before (by path from /, no root, no
// RESOLVE_BENEATH or RESOLVE_NO_XDEV): it opens the same pin and finds it
// unchanged, so doctor said launchable what the launch refused.
func TestDoctorAndLaunchOpenPinsAlike(t *testing.T) {
	skip.UnlessRoot(t, "it bind-mounts the workspace onto itself")
	s := compileScript(t, "echo started > $PASEO_AGENT_CWD/started", "")
	ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	pins, err := bundle.Files{bundle.PinsFile: mustReadFile(t, filepath.Join(s.bundle, bundle.PinsFile)),
		bundle.ManifestFile: mustReadFile(t, filepath.Join(s.bundle, bundle.ManifestFile))}.Pins()
	if err != nil {
		t.Fatal(err)
	}
	var pin bundle.Pin
	for _, p := range pins.Pins {
		if p.Source == ws {
			pin = p
		}
	}
	if pin.Source == "" || pin.Root == ws {
		t.Fatalf("no workspace pin beneath a root of its own in %+v", pins.Pins)
	}
	doctor := func() (preflight.Check, error) {
		t.Helper()
		r := preflight.Run(preflight.Options{RunscPath: s.runsc, BundleDir: s.bundle, SkipNftablesProbe: true})
		c, ok := r.Get(preflight.CheckBundlePins)
		if !ok {
			t.Fatal("doctor's report has no pins check")
		}
		return c, r.Err()
	}
	if c, _ := doctor(); !c.OK {
		t.Fatalf("before the mount, doctor refuses the pins: %s", c.Detail)
	}

	if err := unix.Mount(ws, ws, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting the workspace onto itself: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(ws, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", ws, err)
		}
	})

	// Control: the old doctor's resolution finds the pinned object.
	fd, err := unix.Openat2(unix.AT_FDCWD, pin.Source, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		t.Fatalf("control: the old doctor resolution refused the pin: %v", err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil || st.Dev != pin.Dev || st.Ino != pin.Ino || string(pathsafe.KindOf(st.Mode)) != pin.Kind {
		t.Fatalf("control: the old doctor resolution did not find the pinned object (%v): the mount changed the identity, so this scene shows no disagreement", err)
	}

	// The launch refuses it, with pathsafe's code, before anything starts.
	_, _, _, err = s.launch(t, staticSecret("v"))
	var ue *UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, diag.PathCrossMount) {
		t.Fatalf("launch: got %v, want sandbox-unavailable with %s", err, diag.PathCrossMount)
	}
	s.assertNotStarted(t)

	// doctor agrees, with the same code under its pins check's.
	c, err := doctor()
	if c.OK || c.Code != diag.PreflightBundlePins || !errors.Is(err, diag.PreflightBundlePins) || !errors.Is(err, diag.PathCrossMount) {
		t.Fatalf("doctor on the pins the launch refuses: %+v (%v), want %s with %s", c, err, diag.PreflightBundlePins, diag.PathCrossMount)
	}
}
