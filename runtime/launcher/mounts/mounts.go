// Package mounts is the launcher's mountinfo housekeeping: the one parser
// of /proc/self/mountinfo, detaching every mount beneath a directory, and
// removing a directory only once nothing is mounted beneath it.
package mounts

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one line of /proc/self/mountinfo: the mount point, with
// mountinfo's octal escapes decoded, and the filesystem type.
type Mount struct {
	Point  string
	FSType string
}

// List lists this namespace's mounts in mount order, with mountinfo's
// octal escapes (space, tab, newline, backslash) decoded: a path that only
// matched escaped would otherwise look unmounted.
func List() ([]Mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []Mount
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if len(f) <= 4 {
			continue
		}
		m := Mount{Point: unescape(f[4])}
		if g := strings.Fields(post); len(g) > 0 {
			m.FSType = g[0]
		}
		out = append(out, m)
	}
	return out, nil
}

// Points lists this namespace's mount points in mount order (List's).
func Points() ([]string, error) {
	ms, err := List()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Point
	}
	return out, nil
}

// Cgroups lists the mount points of cgroup (v1) and cgroup2 hierarchies;
// none when mountinfo is unreadable.
func Cgroups() []string {
	ms, _ := List()
	var out []string
	for _, m := range ms {
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			out = append(out, m.Point)
		}
	}
	return out
}

// Beneath lists the mount points at or beneath dir in this mount
// namespace.
func Beneath(dir string) []string {
	points, err := Points()
	if err != nil {
		return []string{"/proc/self/mountinfo unreadable"}
	}
	var out []string
	for _, p := range points {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// UnmountBeneath detaches every mount at or beneath root, deepest first,
// and reports those that would not go. A mount already gone (EINVAL: no
// longer a mount point; ENOENT) is not a failure: the runsc root is shared
// by every sandbox of the state root, and their teardowns race for it.
func UnmountBeneath(root string) error {
	points, err := Points()
	if err != nil {
		return err
	}
	var targets []string
	for _, p := range points {
		if p == root || strings.HasPrefix(p, root+"/") {
			targets = append(targets, p)
		}
	}
	var errs []error
	for i := len(targets) - 1; i >= 0; i-- {
		if err := unix.Unmount(targets[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", targets[i], err))
		}
	}
	return errors.Join(errs...)
}

// RemoveDir unmounts everything beneath dir and removes it, but only
// once nothing is mounted there any more: a run dir's staged bind is the
// user's workspace, and os.RemoveAll through a mount that failed to go
// would delete it on the host.
func RemoveDir(dir string) error {
	UnmountBeneath(dir)
	if left := Beneath(dir); len(left) > 0 {
		return fmt.Errorf("%s still has %d mount(s) beneath it (%s); not removed", dir, len(left), left[0])
	}
	return os.RemoveAll(dir)
}

func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
