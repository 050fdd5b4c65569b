package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

// Bind sources by descriptor
//
// config.json names bind sources by host path, and runsc's gofer resolves
// those paths itself, as root, following symlinks, tens of milliseconds
// after any check the launcher could make by name. Whoever can rename in a
// source's parent (the daemon user in its workspace root, a neighbouring
// sandbox whose workspace holds this one's cwd) could swap the source for a
// symlink in that window and have runsc mount the link's target (the class
// of runc's CVE-2021-30465). So the launcher resolves each source once,
// beneath its registered root with openat2 and no symlinks, checks device,
// inode and kind against the pin on that descriptor, clones a mount of the
// descriptor (open_tree, non-recursive: no submount comes along) and moves
// it onto <run>/binds/<n>. The run copy of config.json names that path,
// which lies in the 0700 root-owned run dir: only root can change what it
// is. The reviewed bundle keeps the host paths (explain and diff show them).

// stagedBind is one bind source mounted in the run dir.
type stagedBind struct {
	mount int // index in config.json's mounts
	pin   bundle.Pin
	path  string // <run>/binds/<n>
}

// stageBinds stages every pinned bind of the plan (its config.json's binds
// paired with pins.json when the plan was loaded); any failure refuses the
// launch, naming the pin (never file contents). Mounts already made are
// left for runDir.remove.
func (r *runDir) stageBinds(plan *launchplan.Plan) ([]stagedBind, error) {
	if plan.BindsErr != nil {
		return nil, plan.BindsErr
	}
	spec, pairs := plan.Spec, plan.Binds
	if len(pairs) == 0 {
		return nil, nil
	}
	dir := filepath.Join(r.dir, "binds")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	out := make([]stagedBind, 0, len(pairs))
	for n, bp := range pairs {
		target := filepath.Join(dir, strconv.Itoa(n))
		ro := slices.Contains(spec.Mounts[bp.Mount].Options, "ro")
		if err := stageBind(bp.Pin, target, ro); err != nil {
			return nil, fmt.Errorf("bind source pin %s (source %s): %w", bp.Pin.Destination, bp.Pin.Source, err)
		}
		out = append(out, stagedBind{mount: bp.Mount, pin: bp.Pin, path: target})
	}
	return out, nil
}

// stageBind opens p's source beneath its root, checks it against p on the
// descriptor and mounts a clone of that descriptor at target.
func stageBind(p bundle.Pin, target string, readOnly bool) error {
	fd, err := openPinned(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// The mount point matches the kind: a bind of a file needs a file.
	if p.Kind == string(pathsafe.Dir) {
		err = os.Mkdir(target, 0o700)
	} else {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("mount point: %w", err)
	}
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tree)
	// Defence in depth: the host-side mount is nosuid and nodev, and
	// read-only for a read-only grant, whatever runsc does with it.
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if readOnly {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	setattr := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attr})
	if setattr != nil && !errors.Is(setattr, unix.ENOSYS) {
		return fmt.Errorf("mount_setattr: %w", setattr)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	if setattr != nil {
		// Kernels before 5.12 have no mount_setattr: remount the bind,
		// which only root can reach in the 0700 run dir.
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
		if readOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			return fmt.Errorf("remounting the staged bind nosuid,nodev: %w", err)
		}
	}
	return nil
}

// openPinned opens the pin's source with the one opener of pinned sources
// (pathsafe.OpenPinned, as the compiler resolved it and doctor checks it):
// its root from / without following symlinks, the source beneath the root
// without symlinks, magic links or mount crossings. It returns the O_PATH
// descriptor only when device, inode and kind match the pin; a refusal
// carries pathsafe's code (PP-PATH-SYMLINK, PP-PATH-XDEV, PP-PATH-REPLACED...).
func openPinned(p bundle.Pin) (int, error) {
	return pathsafe.Resolver{}.OpenPinned(p.Root, p.Source, pathsafe.Identity{Dev: p.Dev, Ino: p.Ino, Kind: pathsafe.Kind(p.Kind)})
}

// useStaged points each staged mount of the run copy's spec at its staged
// path, then refuses the spec if any bind still names a host path: runsc
// must never resolve a host path itself.
func useStaged(spec *rspec.Spec, staged []stagedBind, runDir string) error {
	for _, s := range staged {
		if s.mount >= len(spec.Mounts) {
			return fmt.Errorf("run copy of %s lost the bind %s", bundle.ConfigFile, s.pin.Destination)
		}
		m := &spec.Mounts[s.mount]
		if m.Destination != s.pin.Destination || m.Source != s.pin.Source {
			return fmt.Errorf("run copy of %s: mount %d is %s from %s, staged for %s from %s", bundle.ConfigFile, s.mount, m.Destination, m.Source, s.pin.Destination, s.pin.Source)
		}
		m.Source = s.path
	}
	for _, m := range spec.Mounts {
		if bundle.IsBind(m) && !slices.Contains(bundle.InternalSources, m.Source) && !strings.HasPrefix(m.Source, runDir+"/binds/") {
			return fmt.Errorf("bind %s: source %s was not staged; an unpinned bind is refused", m.Destination, m.Source)
		}
	}
	return nil
}
