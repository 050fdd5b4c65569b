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

// Descriptors the server passes: the workspace and the image's /usr (the
// detached trees the init attaches), the request pipe's read end and the
// ready pipe's write end.
const (
	fdWorkspace = 3
	fdUsr       = 4
	fdRequest   = 5
	fdReady     = 6
	// fdScratch is the launcher's git's scratch directory (gitjail.go),
	// passed only to a jail whose config says Scratch.
	fdScratch = 7
	// jailReady is the byte the init writes on fdReady once it is
	// confined; only then does the server write the request.
	jailReady = 'R'
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

// buildJail builds and confines the jail (mounts, rlimits, Landlock, no
// capability, no_new_privs, seccomp: what the config says, nothing of a
// request), reports that on fdReady, and only then reads its one request
// from fdRequest: the cwd, opened beneath the workspace without following
// a link, and the tool's argv and environment, then execs the tool.
func buildJail(arg string) error {
	var c jailConfig
	if err := json.Unmarshal([]byte(arg), &c); err != nil {
		return err
	}
	spec, ok := specOf(c.Tool)
	if !ok {
		return fmt.Errorf("no tool %q", c.Tool)
	}
	if err := mountRoot(c.Dest, c.Scratch); err != nil {
		return err
	}
	// Attached now; the tool inherits none.
	unix.Close(fdWorkspace)
	unix.Close(fdUsr)
	if c.Scratch {
		unix.Close(fdScratch)
	}
	for _, fd := range []int{fdRequest, fdReady} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return fmt.Errorf("descriptor %d: %w", fd, err)
		}
	}
	for _, l := range []struct {
		res int
		v   uint64
	}{{unix.RLIMIT_CPU, c.CPU}, {unix.RLIMIT_AS, c.Memory}, {unix.RLIMIT_FSIZE, c.FSize}, {unix.RLIMIT_CORE, 0}, {unix.RLIMIT_NOFILE, 1024}} {
		if err := unix.Setrlimit(l.res, &unix.Rlimit{Cur: l.v, Max: l.v}); err != nil {
			return fmt.Errorf("rlimit %d: %w", l.res, err)
		}
	}
	scratch := ""
	if c.Scratch {
		scratch = ScratchPath
	}
	if err := landlock(c.Dest, spec.bin, scratch); err != nil {
		return err
	}
	if err := dropPrivileges(); err != nil {
		return err
	}
	if err := seccomp(); err != nil {
		return err
	}
	// Confined: report it, then read the request.
	if _, err := unix.Write(fdReady, []byte{jailReady}); err != nil {
		return fmt.Errorf("ready: %w", err)
	}
	unix.Close(fdReady)
	b, err := readRequest(fdRequest)
	if err != nil {
		return err
	}
	unix.Close(fdRequest)
	var r jailRequest
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	cwd, err := openBeneath(c.Dest, r.Cwd)
	if err != nil {
		return fmt.Errorf("cwd %s: %w", r.Cwd, err)
	}
	if err := unix.Fchdir(cwd); err != nil {
		return err
	}
	unix.Close(cwd)
	env := r.Env
	if env == nil {
		env = []string{}
	}
	return syscall.Exec(spec.bin, append([]string{string(c.Tool)}, r.Argv...), env)
}

// readRequest reads fd to its end, at most maxJailRequest bytes; nothing
// (the server discarded the jail unused) ends the jail.
func readRequest(fd int) ([]byte, error) {
	var b []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("request: %w", err)
		}
		if n == 0 {
			break
		}
		if b = append(b, buf[:n]...); len(b) > maxJailRequest {
			return nil, fmt.Errorf("request: over %d bytes", maxJailRequest)
		}
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("no request")
	}
	return b, nil
}

// mountRoot builds the jail's root and pivots into it.
func mountRoot(dest string, scratch bool) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	usr, ws, sc := filepath.Join(newRoot, "usr"), filepath.Join(newRoot, dest), filepath.Join(newRoot, ScratchPath)
	dirs := []string{usr, ws}
	if scratch {
		dirs = append(dirs, sc)
	}
	for _, d := range dirs {
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
	if scratch {
		if err := unix.MoveMount(fdScratch, "", unix.AT_FDCWD, sc, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("scratch: %w", err)
		}
		// git opens /dev/null at every start (sanitize_stdfds): the
		// host's, bound (a user namespace makes no device node).
		null := filepath.Join(newRoot, "dev", "null")
		if err := os.Mkdir(filepath.Dir(null), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(null, nil, 0o644); err != nil {
			return err
		}
		if err := unix.Mount("/dev/null", null, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("/dev/null: %w", err)
		}
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
		Resolve: plainResolve})
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
