package nativesearch

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// landlock restricts this thread (and the tool it execs) to reading the
// image's /usr and the workspace at dest, and to executing bin (the
// tool's binary) and its loader only; every other access right this kernel's Landlock knows is
// handled, so denied (writes anywhere, TCP from ABI 4, signals and
// abstract sockets out of the domain from ABI 6). Without Landlock the
// jail is not built (Probe refuses the option before any search). A
// scratch directory (the launcher's git only, gitjail.go) is also
// readable and writable: files made, written, truncated and removed in
// it, nothing else (no directory, link, device or socket made), and
// /dev/null read and written.
func landlock(dest, bin, scratch string) error {
	abi, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 || int(abi) < 1 {
		return fmt.Errorf("landlock: not available (%v)", e)
	}
	attr := unix.LandlockRulesetAttr{Access_fs: 1<<13 - 1}
	size := unsafe.Offsetof(attr.Access_net)
	if abi >= 2 {
		attr.Access_fs |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		attr.Access_fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 4 {
		attr.Access_net = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
		size = unsafe.Offsetof(attr.Scoped)
	}
	if abi >= 5 {
		attr.Access_fs |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	if abi >= 6 {
		attr.Scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
		size = unsafe.Sizeof(attr)
	}
	rs, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if e != 0 {
		return fmt.Errorf("landlock ruleset: %w", e)
	}
	defer unix.Close(int(rs))
	const read = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	type rule struct {
		path   string
		access uint64
	}
	rules := []rule{
		{"/usr", read},
		{dest, read},
		{bin, unix.LANDLOCK_ACCESS_FS_EXECUTE},
		{"/lib64/ld-linux-x86-64.so.2", unix.LANDLOCK_ACCESS_FS_EXECUTE}, // opened through its links: the file itself
	}
	if scratch != "" {
		rw := uint64(read | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE)
		if abi >= 3 {
			rw |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
		}
		rules = append(rules, rule{scratch, rw}, rule{"/dev/null", unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE})
	}
	for _, r := range rules {
		fd, err := unix.Open(r.path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("landlock rule %s: %w", r.path, err)
		}
		pb := unix.LandlockPathBeneathAttr{Allowed_access: r.access, Parent_fd: int32(fd)}
		_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, rs, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&pb)), 0, 0, 0)
		unix.Close(fd)
		if e != 0 {
			return fmt.Errorf("landlock rule %s: %w", r.path, e)
		}
	}
	// landlock_restrict_self needs no_new_privs (or CAP_SYS_ADMIN, which
	// the init still has in its namespace); set it here as well.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rs, 0, 0); e != 0 {
		return fmt.Errorf("landlock restrict: %w", e)
	}
	return nil
}
