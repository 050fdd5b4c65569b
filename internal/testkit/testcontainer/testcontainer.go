// Package testcontainer runs a process the way the official Paseo container
// runs its daemon, without Docker: the namespaces and mounts Docker would
// make, made directly. The process gets its own mount, pid and network
// namespaces (its loopback is not the host's, as on Docker's bridge
// network; listeners it should serve on the host are handed to it as
// ExtraFiles, as a published port) and a fresh root holding only what the container has: the image's /usr
// (the host's, read-only, standing for the image's OS), a new /proc, the
// host dirs Compose binds at container paths, and fresh tmpfs dirs (such as
// /run) with single files bound into them (the supervisor socket alone). It
// runs as a non-root uid with supplementary groups (Compose's group_add).
//
// The test binary is run twice more: first as root in the new namespaces
// (MaybeEnter, from TestMain), which builds the root and pivots into it,
// then, from inside, as the container's user with the argv the test gave.
package testcontainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/childproc"
)

// Bind is one bind mount of a host path (a directory or a single file) at
// a container path.
type Bind struct {
	Host, Container string
	ReadOnly        bool
}

// Spec is the container.
type Spec struct {
	// Root is an empty host directory the container's root tmpfs is
	// mounted on (in the container's mount namespace only).
	Root string
	// Tmpfs are container dirs that get a fresh, empty tmpfs (mode 0755).
	Tmpfs []string
	Binds []Bind
	UID   uint32
	GID   uint32
	// Groups are the supplementary groups (Compose group_add).
	Groups []uint32
	// Argv runs inside, as UID, through the test binary (argv[0] is
	// ignored: /proc/self/exe is run); Env is its whole environment.
	Argv []string
	Env  []string
	// ExtraFiles are passed through to the process inside (fd 3 on).
	ExtraFiles []*os.File `json:"-"`
	Passed     int        // len(ExtraFiles), for the first process
}

const envSpec = "PASEO_TESTCONTAINER_SPEC"

// Command is the test binary re-run as the container: root in new mount,
// pid and network namespaces until MaybeEnter has built the container's view, then
// spec.Argv as spec.UID. Start it with childproc.Start (its parent-death
// signal is SIGKILL, which ends the whole pid namespace).
func Command(spec Spec) (*exec.Cmd, error) {
	spec.Passed = len(spec.ExtraFiles)
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{envSpec + "=" + string(data), "PATH=/usr/bin:/bin"}
	cmd.ExtraFiles = spec.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET,
		Pdeathsig:  syscall.SIGKILL,
	}
	return cmd, nil
}

// Run runs the container to its end, at most timeout (then it is killed),
// and returns what it wrote to stdout and stderr.
func Run(spec Spec, timeout time.Duration) ([]byte, error) {
	cmd, err := Command(spec)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done, err := childproc.Start(cmd)
	if err != nil {
		return nil, err
	}
	select {
	case err = <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		err = fmt.Errorf("timed out after %s: %v", timeout, <-done)
	}
	return out.Bytes(), err
}

// MaybeEnter is the container's first process (pid 1 of its namespace): if
// this process was started by Command, it builds the container's view,
// runs the argv inside and exits with its status; otherwise it returns.
func MaybeEnter() {
	data := os.Getenv(envSpec)
	if data == "" {
		return
	}
	var spec Spec
	if err := json.Unmarshal([]byte(data), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "testcontainer: spec:", err)
		os.Exit(120)
	}
	if err := enter(spec); err != nil {
		fmt.Fprintln(os.Stderr, "testcontainer:", err)
		os.Exit(121)
	}
	os.Exit(run(spec))
}

// enter builds the root and pivots into it. Propagation is made private
// first, so that nothing mounted here reaches the host's namespace.
func enter(spec Spec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private propagation: %w", err)
	}
	root := spec.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	// The image's OS: the host's /usr read-only, with the merged-/usr links.
	if err := bind(root, Bind{Host: "/usr", Container: "/usr", ReadOnly: true}); err != nil {
		return err
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if target, err := os.Readlink("/" + l); err == nil {
			if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
				return err
			}
		}
	}
	if err := bind(root, Bind{Host: "/dev/null", Container: "/dev/null"}); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o555); err != nil {
		return err
	}
	// A /proc of the new pid namespace: the host's processes are not in it.
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("proc: %w", err)
	}
	for _, d := range spec.Tmpfs {
		p := filepath.Join(root, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs %s: %w", d, err)
		}
	}
	binds := slices.Clone(spec.Binds)
	slices.SortFunc(binds, func(a, b Bind) int { return len(a.Container) - len(b.Container) })
	for _, b := range binds {
		if err := bind(root, b); err != nil {
			return err
		}
	}
	old := filepath.Join(root, ".oldroot")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.oldroot", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	return os.Remove("/.oldroot")
}

// bind mounts b.Host at b.Container beneath root, creating the mount
// point: a directory for a directory, an empty file for anything else.
func bind(root string, b Bind) error {
	dst := filepath.Join(root, b.Container)
	st, err := os.Stat(b.Host)
	if err != nil {
		return err
	}
	if st.IsDir() {
		err = os.MkdirAll(dst, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return err
	}
	if err := unix.Mount(b.Host, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", b.Host, b.Container, err)
	}
	if b.ReadOnly {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", b.Container, err)
		}
	}
	return nil
}

// run starts the argv inside as the container's user and waits for it (as
// pid 1 it also reaps whatever it leaves).
func run(spec Spec) int {
	// /proc/self/exe still names the test binary, which lies outside the
	// new root.
	cmd := exec.Command("/proc/self/exe", spec.Argv[1:]...)
	cmd.Args[0] = spec.Argv[0]
	cmd.Env = spec.Env
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	for i := range spec.Passed {
		cmd.ExtraFiles = append(cmd.ExtraFiles, os.NewFile(uintptr(3+i), fmt.Sprintf("extra-%d", i)))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: spec.Groups}}
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "testcontainer: run:", err)
		return 122
	}
	return 0
}
