package nativesearch

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// The jail's init runs in this package's init, before main, when the
// process was started as the jail (argv[0] jailArg0): every binary that
// links the server (paseo-policy, the launcher's tests) can be the jail.
func init() {
	if len(os.Args) == 2 && os.Args[0] == jailArg0 {
		jailMain(os.Args[1])
	}
}

// Descriptors the server passes: the workspace and the image's /usr.
const (
	fdWorkspace = 3
	fdUsr       = 4
	// newRoot is where the init builds the jail's root before pivoting:
	// a tmpfs over /tmp in the jail's own mount namespace (the host's
	// /tmp is not touched).
	newRoot = "/tmp"
	// exitJail is the init's exit code when it could not build the jail;
	// rg's are 0 to 2.
	exitJail = 125
)

func jailMain(arg string) {
	// Landlock, capabilities, no_new_privs and seccomp are per thread, and
	// exec keeps the calling thread's: all of them on this one.
	runtime.LockOSThread()
	if err := buildJail(arg); err != nil {
		fmt.Fprintf(os.Stderr, "paseo-search-jail: %v\n", err)
		os.Exit(exitJail)
	}
}

func buildJail(arg string) error {
	var c jailConfig
	if err := json.Unmarshal([]byte(arg), &c); err != nil {
		return err
	}
	if err := mountRoot(c.Dest); err != nil {
		return err
	}
	cwd, err := openBeneath(c.Dest, c.Cwd)
	if err != nil {
		return fmt.Errorf("cwd %s: %w", c.Cwd, err)
	}
	if err := unix.Fchdir(cwd); err != nil {
		return err
	}
	unix.Close(cwd)
	for _, l := range []struct {
		res int
		v   uint64
	}{{unix.RLIMIT_CPU, c.CPU}, {unix.RLIMIT_AS, c.Memory}, {unix.RLIMIT_FSIZE, 0}, {unix.RLIMIT_CORE, 0}, {unix.RLIMIT_NOFILE, 1024}} {
		if err := unix.Setrlimit(l.res, &unix.Rlimit{Cur: l.v, Max: l.v}); err != nil {
			return fmt.Errorf("rlimit %d: %w", l.res, err)
		}
	}
	spec, ok := toolSpecs[c.Tool]
	if !ok {
		return fmt.Errorf("no tool %q", c.Tool)
	}
	if err := landlock(c.Dest, spec.bin); err != nil {
		return err
	}
	if err := dropPrivileges(); err != nil {
		return err
	}
	if err := seccomp(); err != nil {
		return err
	}
	env := c.Env
	if env == nil {
		env = []string{}
	}
	return syscall.Exec(spec.bin, append([]string{string(c.Tool)}, c.Argv...), env)
}

// mountRoot builds the jail's root and pivots into it.
func mountRoot(dest string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	usr, ws := filepath.Join(newRoot, "usr"), filepath.Join(newRoot, dest)
	for _, d := range []string{usr, ws} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The image's merged /usr: /bin, /lib and /lib64 are links into it.
	for _, l := range []string{"bin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(newRoot, l)); err != nil {
			return err
		}
	}
	if err := unix.MoveMount(fdUsr, "", unix.AT_FDCWD, usr, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("image /usr: %w", err)
	}
	if err := unix.MoveMount(fdWorkspace, "", unix.AT_FDCWD, ws, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := unix.Mount("", newRoot, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("root read-only: %w", err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's tree: %w", err)
	}
	return unix.Chdir("/")
}

// openBeneath opens rel beneath dir as a directory without following a
// link or crossing a mount.
func openBeneath(dir, rel string) (int, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(d)
	return unix.Openat2(d, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
}

// dropPrivileges clears the ambient capability the init ran with and every
// other one of this thread, and sets no_new_privs: the rg it execs has no
// capability, even in its own namespace.
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}
