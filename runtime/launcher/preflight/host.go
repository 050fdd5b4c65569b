package preflight

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Kernel 5.6 is the first with openat2, which pin re-resolution and the
// compiler's path resolution rely on.
const (
	minKernelMajor = 5
	minKernelMinor = 6
)

// cgroupRoot is where the launcher expects the unified hierarchy.
const cgroupRoot = "/sys/fs/cgroup"

// requiredControllers must be available at cgroupRoot for the bundle's
// limits (cpu, memory, pids) to be enforced.
var requiredControllers = []string{"cpu", "memory", "pids"}

func checkRoot(euid int) error {
	if euid != 0 {
		return because(ErrNotRoot, "running as euid %d; the launcher must run as root (euid 0) to create namespaces, cgroups and nftables rules", euid)
	}
	return nil
}

func kernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// parseKernelRelease reads major.minor from a uname release such as
// "6.1.0-18-amd64" or "5.15.153.1-microsoft-standard-WSL2".
func parseKernelRelease(release string) (major, minor int, err error) {
	bad := because(ErrKernelRelease, "cannot parse kernel release %q as major.minor", release)
	majStr, rest, ok := strings.Cut(release, ".")
	if !ok {
		return 0, 0, bad
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	if major, err = strconv.Atoi(majStr); err != nil || major < 0 {
		return 0, 0, bad
	}
	if end == 0 {
		return 0, 0, bad
	}
	if minor, err = strconv.Atoi(rest[:end]); err != nil {
		return 0, 0, bad
	}
	return major, minor, nil
}

func checkKernel(release string) error {
	major, minor, err := parseKernelRelease(release)
	if err != nil {
		return err
	}
	if major < minKernelMajor || (major == minKernelMajor && minor < minKernelMinor) {
		return because(ErrKernelTooOld, "kernel %s is older than %d.%d; openat2 (needed to re-resolve pinned bind sources without following links) is missing", release, minKernelMajor, minKernelMinor)
	}
	return nil
}

// checkCgroup accepts the unified hierarchy (cgroup2 at root whose
// cgroup.controllers lists every required controller) or a cgroup v1
// layout with each required controller mounted at root/<controller>;
// runsc enforces the bundle's limits through either. It returns what it
// found.
func checkCgroup(root string) (string, error) {
	err2 := isCgroup2(root)
	if err2 == nil {
		data, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err != nil {
			return "", fmt.Errorf("reading cgroup.controllers: %w", err)
		}
		have := strings.Join(strings.Fields(string(data)), " ")
		if missing := missingControllers(string(data)); len(missing) > 0 {
			return "", because(ErrControllers, "cgroup2 at %s lacks controller(s) %s (available: %q); they may be bound to a cgroup v1 hierarchy", root, strings.Join(missing, ", "), have)
		}
		return "cgroup2 at " + root + " with controllers " + have, nil
	}
	if err1 := checkCgroupV1(root); err1 != nil {
		return "", because(ErrNoCgroup, "%v; nor is there a cgroup v1 layout: %v", err2, err1)
	}
	return "cgroup v1 at " + root + " with controllers " + strings.Join(requiredControllers, " "), nil
}

// checkCgroupV1 requires a cgroup v1 mount for every required controller.
func checkCgroupV1(root string) error {
	for _, c := range requiredControllers {
		var st unix.Statfs_t
		p := filepath.Join(root, c)
		if err := unix.Statfs(p, &st); err != nil || int64(st.Type) != unix.CGROUP_SUPER_MAGIC {
			return fmt.Errorf("controller %s is not mounted at %s", c, p)
		}
	}
	return nil
}

func isCgroup2(root string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return because(ErrNoCgroup, "%s does not exist; cgroup v2 is not mounted", root)
		}
		return fmt.Errorf("statfs %s: %w", root, err)
	}
	if int64(st.Type) != unix.CGROUP2_SUPER_MAGIC {
		return because(ErrNoCgroup, "%s is %s, not a cgroup2 mount; the launcher needs the unified hierarchy (cgroup v1 and hybrid layouts are refused)", root, fsTypeName(int64(st.Type)))
	}
	return nil
}

func fsTypeName(magic int64) string {
	switch magic {
	case unix.TMPFS_MAGIC:
		return "tmpfs (a cgroup v1 or hybrid layout)"
	case unix.CGROUP_SUPER_MAGIC:
		return "a cgroup v1 mount"
	case unix.SYSFS_MAGIC:
		return "sysfs (nothing mounted there)"
	}
	return fmt.Sprintf("filesystem type %#x", magic)
}

// missingControllers returns the required controllers absent from the
// contents of a cgroup.controllers file.
func missingControllers(controllers string) []string {
	have := map[string]bool{}
	for _, c := range strings.Fields(controllers) {
		have[c] = true
	}
	var missing []string
	for _, c := range requiredControllers {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	return missing
}
