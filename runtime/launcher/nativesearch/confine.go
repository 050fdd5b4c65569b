package nativesearch

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// landlock restricts this thread (and the rg it execs) to reading the
// image's /usr and the workspace at dest, and to executing rg and its
// loader only; every other access right this kernel's Landlock knows is
// handled, so denied (writes anywhere, TCP from ABI 4, signals and
// abstract sockets out of the domain from ABI 6). Without Landlock the
// jail is not built (Probe refuses the option before any search).
func landlock(dest string) error {
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
	for _, r := range []struct {
		path   string
		access uint64
	}{
		{"/usr", read},
		{dest, read},
		{rgPath, unix.LANDLOCK_ACCESS_FS_EXECUTE},
		{"/lib64/ld-linux-x86-64.so.2", unix.LANDLOCK_ACCESS_FS_EXECUTE}, // opened through its links: the file itself
	} {
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

// denied are system calls rg never makes that reach kernel surface beyond
// reading files: they fail with EPERM. rg's own (open, read, mmap, getdents,
// statx, threads) pass; its exec is the init's last call, and Landlock
// keeps any later exec to rg itself.
var denied = []uintptr{
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD, unix.SYS_PIDFD_OPEN,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT, unix.SYS_UNSHARE, unix.SYS_SETNS,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD, unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE, unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_SYSLOG, unix.SYS_REBOOT, unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_ACCT, unix.SYS_QUOTACTL, unix.SYS_FANOTIFY_INIT,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX, unix.SYS_IOPL, unix.SYS_IOPERM,
	unix.SYS_SOCKET, unix.SYS_SOCKETPAIR, unix.SYS_CONNECT, unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_EXECVEAT,
	unix.SYS_PERSONALITY, unix.SYS_VHANGUP, unix.SYS_LOOKUP_DCOOKIE, unix.SYS_USELIB, unix.SYS_SYSFS,
}

// namespaceFlags are clone's flags that make a namespace: denied.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// seccomp installs the filter: another architecture's (or x32's) calls
// kill the process, the denied list and clone with a namespace flag fail
// with EPERM, clone3 with ENOSYS (its flags are behind a pointer the
// filter cannot read; glibc then uses clone), the rest pass.
func seccomp() error {
	prog := filter()
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	return unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fp)), 0, 0)
}

func filter() []unix.SockFilter {
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	// Labels are the last four instructions: allow, EPERM, ENOSYS, kill.
	type insn struct {
		code   uint16
		jt, jf int // label (-1 .. -4) or 0 for the next instruction
		k      uint32
	}
	const allow, eperm, enosys, kill = -1, -2, -3, -4
	p := []insn{
		{code: ld, k: 4}, // seccomp_data.arch
		{code: jeq, jf: kill, k: unix.AUDIT_ARCH_X86_64},
		{code: ld, k: 0}, // seccomp_data.nr
		{code: jge, jt: kill, k: 0x40000000},
	}
	for _, nr := range denied {
		p = append(p, insn{code: jeq, jt: eperm, k: uint32(nr)})
	}
	p = append(p, insn{code: jeq, jt: enosys, k: unix.SYS_CLONE3})
	p = append(p, insn{code: jeq, jf: allow, k: unix.SYS_CLONE})
	p = append(p, insn{code: ld, k: 16}, // args[0], low half (little-endian)
		insn{code: jset, jt: eperm, jf: allow, k: namespaceFlags})
	n := len(p)
	at := map[int]int{allow: n, eperm: n + 1, enosys: n + 2, kill: n + 3}
	out := make([]unix.SockFilter, 0, n+4)
	for i, x := range p {
		off := func(l int) uint8 {
			if l == 0 {
				return 0
			}
			return uint8(at[l] - i - 1)
		}
		out = append(out, unix.SockFilter{Code: x.code, Jt: off(x.jt), Jf: off(x.jf), K: x.k})
	}
	return append(out,
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_KILL_PROCESS})
}
