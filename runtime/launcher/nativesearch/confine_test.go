//go:build amd64

package nativesearch

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestSeccompFilter runs the jail's filter in a BPF interpreter on the
// calls rg makes and on the ones it must not: rg's reads, threads and exec
// pass; sockets, ptrace, mounts, namespaces (unshare, clone with a
// namespace flag) fail with EPERM, clone3 with ENOSYS; another
// architecture's call or x32's kills.
func TestSeccompFilter(t *testing.T) {
	var raw []bpf.RawInstruction
	for _, f := range filter() {
		raw = append(raw, bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K})
	}
	vm, err := bpf.NewVM(mustDisassemble(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	// seccomp_data: nr, arch, ip, args; the kernel loads its words in the
	// host's order, the interpreter in network order, so each word is
	// written big-endian where the kernel would read it.
	data := func(nr, arch uint32, arg0 uint64) []byte {
		b := make([]byte, 64)
		binary.BigEndian.PutUint32(b[0:], nr)
		binary.BigEndian.PutUint32(b[4:], arch)
		binary.BigEndian.PutUint32(b[16:], uint32(arg0))
		binary.BigEndian.PutUint32(b[20:], uint32(arg0>>32))
		return b
	}
	const x86 = unix.AUDIT_ARCH_X86_64
	eperm, enosys := unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM), unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS)
	threads := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM)
	for _, tc := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"read", data(unix.SYS_READ, x86, 0), unix.SECCOMP_RET_ALLOW},
		{"openat", data(unix.SYS_OPENAT, x86, 0), unix.SECCOMP_RET_ALLOW},
		{"mmap", data(unix.SYS_MMAP, x86, 0), unix.SECCOMP_RET_ALLOW},
		{"getdents64", data(unix.SYS_GETDENTS64, x86, 0), unix.SECCOMP_RET_ALLOW},
		{"execve", data(unix.SYS_EXECVE, x86, 0), unix.SECCOMP_RET_ALLOW},
		{"clone a thread", data(unix.SYS_CLONE, x86, threads), unix.SECCOMP_RET_ALLOW},
		{"clone a user namespace", data(unix.SYS_CLONE, x86, threads|unix.CLONE_NEWUSER), eperm},
		{"clone a mount namespace", data(unix.SYS_CLONE, x86, unix.CLONE_NEWNS), eperm},
		{"clone3", data(unix.SYS_CLONE3, x86, 0), enosys},
		{"socket", data(unix.SYS_SOCKET, x86, 0), eperm},
		{"ptrace", data(unix.SYS_PTRACE, x86, 0), eperm},
		{"mount", data(unix.SYS_MOUNT, x86, 0), eperm},
		{"unshare", data(unix.SYS_UNSHARE, x86, 0), eperm},
		{"io_uring_setup", data(unix.SYS_IO_URING_SETUP, x86, 0), eperm},
		{"execveat", data(unix.SYS_EXECVEAT, x86, 0), eperm},
		{"x32", data(unix.SYS_READ|0x40000000, x86, 0), unix.SECCOMP_RET_KILL_PROCESS},
		{"i386", data(3, unix.AUDIT_ARCH_I386, 0), unix.SECCOMP_RET_KILL_PROCESS},
	} {
		got, err := vm.Run(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if uint32(got) != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, uint32(got), tc.want)
		}
	}
}

func mustDisassemble(t *testing.T, raw []bpf.RawInstruction) []bpf.Instruction {
	t.Helper()
	prog, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the filter holds an instruction the interpreter does not know")
	}
	return prog
}
