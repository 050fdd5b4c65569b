//go:build amd64

package nativesearch

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp filter names amd64's system calls and audit architecture;
// the jail is built for amd64 only (Probe refuses elsewhere, and
// seccomp_other.go refuses too, so no other architecture runs a search
// under a filter written for this one).

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
