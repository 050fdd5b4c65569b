// Package nsutil creates, pins, enters and removes network namespaces for
// the launcher and for the test worlds that exercise it.
package nsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Namespaces are changed only on throwaway OS threads: a goroutine locks
// its thread, enters the namespace, does its work and returns without
// unlocking, so the Go runtime discards the thread instead of handing a
// thread in the wrong namespace to other goroutines.

// Do runs f on a thread that has joined the network namespace nsFD.
// It is used for what only works from inside a namespace: sysctls under
// /proc/sys/net and listening sockets that must live there.
func Do(nsFD int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately never unlocked; see above.
		if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Create creates a fresh network namespace and pins it by
// bind-mounting its nsfs file at path, so runsc can join it by path and
// teardown or gc can find it after a crash. It returns an open fd.
func Create(path string) (int, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return -1, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o400)
	if err != nil {
		return -1, fmt.Errorf("netns file: %w (is the id in use?)", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately never unlocked: this thread ends in the new namespace.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("pinning the namespace at %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return -1, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		Remove(path)
		return -1, fmt.Errorf("opening the namespace: %w", err)
	}
	return fd, nil
}

// Remove unpins a namespace; the kernel destroys it, with the
// sandbox end of the veth, once nothing else holds it.
func Remove(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Open opens a namespace file, or the launcher's own namespace when
// path is empty: the calling thread's, read on a thread locked for the
// read. Not /proc/self/ns/net, which is the main thread's: a goroutine
// that entered another namespace and ended locked to the main thread
// (Go wedges the main thread rather than end it; preflight's nftables
// probe is one such goroutine) leaves the main thread there for good,
// while every thread that runs goroutines unlocked is in the process's.
func Open(path string) (int, error) {
	var fd int
	var err error
	if path == "" {
		path = "/proc/thread-self/ns/net"
		runtime.LockOSThread()
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		runtime.UnlockOSThread()
	} else {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || (st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a network namespace", path)
	}
	return fd, nil
}

// Sysctl writes one value under /proc/sys/net inside the namespace nsFD.
func Sysctl(nsFD int, key, value string) error {
	return Do(nsFD, func() error {
		p := filepath.Join("/proc/sys/net", filepath.FromSlash(key))
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl net/%s=%s: %w", key, value, err)
		}
		return nil
	})
}

// ReadSysctl reads one value under /proc/sys/net inside the namespace nsFD.
func ReadSysctl(nsFD int, key string) (string, error) {
	var out string
	err := Do(nsFD, func() error {
		b, err := os.ReadFile(filepath.Join("/proc/sys/net", filepath.FromSlash(key)))
		out = string(trimNL(b))
		return err
	})
	return out, err
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
