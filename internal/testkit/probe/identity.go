package probe

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Identity and authority probes: what the sandboxed process is, and which
// privileged operations it can still perform.

// uidNonroot: root inside the sandbox is not an escape by itself, but it
// turns every other gap into one, so the policy runs the agent non-root.
func uidNonroot() outcome {
	euid, uid := unix.Geteuid(), unix.Getuid()
	if euid == 0 {
		return outcome{Escaped, fmt.Sprintf("euid=0 uid=%d", uid)}
	}
	return outcome{Blocked, fmt.Sprintf("euid=%d uid=%d", euid, uid)}
}

// statusField returns one "Name:\tvalue" field of /proc/self/status.
func statusField(name string) (string, bool) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "", false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// effectiveCaps reads CapEff from /proc/self/status (what the harness
// would read too) and falls back to capget(2) when /proc lacks the field.
func effectiveCaps() (caps uint64, source string, err error) {
	if v, ok := statusField("CapEff"); ok {
		if caps, err := strconv.ParseUint(v, 16, 64); err == nil {
			return caps, "/proc/self/status", nil
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, "capget", err
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32, "capget", nil
}

// capabilities: any effective capability is authority the agent does not
// need; the bundle drops them all.
func capabilities() outcome {
	caps, source, err := effectiveCaps()
	if err != nil {
		return outcome{Inconclusive, "cannot read capabilities: " + errText(err)}
	}
	if caps != 0 {
		return outcome{Escaped, fmt.Sprintf("CapEff=%016x (%s)", caps, source)}
	}
	return outcome{Blocked, fmt.Sprintf("CapEff=0 (%s)", source)}
}

// setuidRoot tries to become uid 0. When already euid 0 it trivially
// succeeds, which is reported as such (uid-nonroot says the same thing).
// syscall.Setuid applies to every thread, as the kernel call alone would
// not in a Go process.
func setuidRoot() outcome {
	was := unix.Geteuid()
	if err := syscall.Setuid(0); err != nil {
		return outcome{Blocked, errText(err)}
	}
	if was == 0 {
		return outcome{Escaped, "setuid(0) succeeded (already euid 0)"}
	}
	return outcome{Escaped, fmt.Sprintf("setuid(0) succeeded from euid %d", was)}
}

// chownWorkspaceFile gives a workspace file away, which needs CAP_CHOWN.
// The target is 0:0; when the probe already is root, chown to 0:0 would
// need no capability, so 65534:65534 is used instead to still test it.
func chownWorkspaceFile(c Config) outcome {
	if c.Workspace == "" {
		return notConfigured("workspace")
	}
	p := c.Workspace + "/" + uniqueName("paseo-probe-chown-")
	if created, err := createFile(p); !created {
		return outcome{Inconclusive, "could not create a workspace file: " + errText(err)}
	}
	defer os.Remove(p)
	target := 0
	if unix.Geteuid() == 0 {
		target = 65534
	}
	if err := os.Lchown(p, target, target); err != nil {
		return outcome{Blocked, errText(err)}
	}
	return outcome{Escaped, fmt.Sprintf("chown to %d:%d succeeded", target, target)}
}

// mountTmpfs needs CAP_SYS_ADMIN; the policy gives the agent a fixed
// mount table.
func mountTmpfs(c Config) outcome {
	if c.Workspace == "" {
		return notConfigured("workspace")
	}
	dir := c.Workspace + "/" + uniqueName("paseo-probe-mnt-")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return outcome{Inconclusive, "could not create a workspace directory: " + errText(err)}
	}
	defer os.Remove(dir)
	if err := unix.Mount("paseo-probe", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k"); err != nil {
		return outcome{Blocked, errText(err)}
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return outcome{Escaped, "mounted tmpfs on a workspace directory; unmount failed: " + errText(err)}
	}
	return outcome{Escaped, "mounted tmpfs on a workspace directory (unmounted again)"}
}

// rawSocket needs CAP_NET_RAW; raw sockets bypass port-level filtering and
// allow spoofing.
func rawSocket() outcome {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return outcome{Blocked, errText(err)}
	}
	unix.Close(fd)
	return outcome{Escaped, "opened an AF_INET raw ICMP socket"}
}

// mknodNull creates a character device (1:3, the harmless /dev/null) in
// the workspace; CAP_MKNOD would allow any device, e.g. a disk.
func mknodNull(c Config) outcome {
	if c.Workspace == "" {
		return notConfigured("workspace")
	}
	p := c.Workspace + "/" + uniqueName("paseo-probe-dev-")
	if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		return outcome{Blocked, errText(err)}
	}
	os.Remove(p)
	return outcome{Escaped, "created char device 1:3 in the workspace (removed again)"}
}

// deviceNodes opens host memory and disk devices read-only (opening is
// enough to prove access; nothing is read). O_NONBLOCK so no device open
// can block the probe.
func deviceNodes(devices []string) outcome {
	if len(devices) == 0 {
		return notConfigured("devices")
	}
	outs := make([]outcome, len(devices))
	for i, d := range devices {
		f, err := os.OpenFile(d, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != nil {
			outs[i] = outcome{Blocked, errText(err)}
			continue
		}
		f.Close()
		outs[i] = outcome{Escaped, "opened"}
	}
	return combine(devices, outs)
}

// ptraceHostPID tries three ways to reach a host process: signal 0 (only
// evidence: it shows the pid is visible), ptrace attach (escape), and its
// /proc environ (escape if the canary marker is in it).
func ptraceHostPID(ctx context.Context, c Config) outcome {
	if c.HostPID == 0 {
		return notConfigured("host-pid")
	}
	pid := c.HostPID
	kill := "ok"
	if err := unix.Kill(pid, 0); err != nil {
		kill = errText(err)
	}
	attach := "ok"
	attachErr := ptraceSeize(ctx, pid)
	if attachErr != nil {
		attach = errText(attachErr)
	}
	env := environOutcome(pid, c.CanaryMarker)
	evidence := fmt.Sprintf("kill(0): %s; ptrace attach: %s; environ: %s", kill, attach, env.evidence)
	switch {
	case attachErr == nil || env.verdict == Escaped:
		return outcome{Escaped, evidence}
	case ctx.Err() != nil:
		return outcome{Inconclusive, evidence} // the attach never answered
	}
	return outcome{Blocked, evidence}
}

// environOutcome reads /proc/<pid>/environ and looks for the marker.
func environOutcome(pid int, marker string) outcome {
	data, err := readHead(fmt.Sprintf("/proc/%d/environ", pid))
	return canaryOutcome(data, err, marker)
}

// ptraceSeize attaches to pid with PTRACE_SEIZE, which, unlike
// PTRACE_ATTACH, does not stop the target: the control run must not
// disturb the host process it points at. The attach has the same
// permission check as PTRACE_ATTACH, so success is the escape.
func ptraceSeize(ctx context.Context, pid int) error {
	res := make(chan error, 1)
	go func() {
		// Never unlocked: a tracee belongs to the tracer thread, and if
		// the detach below fails, this thread's exit with the goroutine
		// detaches it anyway.
		runtime.LockOSThread()
		err := unix.PtraceSeize(pid)
		if err == nil {
			detachSeized(pid)
		}
		res <- err
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// detachSeized detaches a seized tracee. PTRACE_DETACH needs the tracee
// stopped, so it is interrupted first and its stop collected with wait4.
func detachSeized(pid int) {
	if unix.PtraceInterrupt(pid) != nil {
		return
	}
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG|unix.WALL, nil)
		if err != nil || (wpid == pid && !ws.Stopped()) {
			return // gone
		}
		if wpid == pid {
			_ = unix.PtraceDetach(pid)
			return
		}
	}
}

// envCanary: the launcher holds the marker in its own environment; the
// sandbox must get a fresh, explicit environment, not an inherited one.
// Only the variable's name goes into the evidence.
func envCanary(c Config) outcome {
	if c.CanaryMarker == "" {
		return notConfigured("canary-marker")
	}
	env := os.Environ()
	for _, kv := range env {
		if strings.Contains(kv, c.CanaryMarker) {
			name, _, _ := strings.Cut(kv, "=")
			return outcome{Escaped, fmt.Sprintf("variable %s carries the canary marker", name)}
		}
	}
	if c.CanaryEnv != "" {
		if _, ok := os.LookupEnv(c.CanaryEnv); ok {
			return outcome{Blocked, fmt.Sprintf("%s is set but without the canary marker", c.CanaryEnv)}
		}
	}
	return outcome{Blocked, fmt.Sprintf("none of %d variables carries the canary marker", len(env))}
}

// noNewPrivs: without no_new_privs a setuid binary in the image could
// still raise privileges. prctl is asked first; /proc/self/status is the
// fallback.
func noNewPrivs() outcome {
	v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	source := "prctl"
	if err != nil {
		s, ok := statusField("NoNewPrivs")
		if !ok {
			return outcome{Inconclusive, "prctl: " + errText(err) + "; no NoNewPrivs in /proc/self/status"}
		}
		if v, err = strconv.Atoi(s); err != nil {
			return outcome{Inconclusive, "unparsable NoNewPrivs in /proc/self/status"}
		}
		source = "/proc/self/status"
	}
	if v == 0 {
		return outcome{Escaped, "no_new_privs=0 (" + source + ")"}
	}
	return outcome{Blocked, fmt.Sprintf("no_new_privs=%d (%s)", v, source)}
}

// gvisorVersion is the fixed uname version string gVisor reports.
const gvisorVersion = "#1 SMP Sun Jan 10 15:06:54 PST 2016"

// gvisor records whether the probe runs under gVisor, from three signals
// gVisor gives: a "-gvisor" kernel release (recent versions), its fixed
// uname version string, and "Starting gVisor..." in its fake kernel log.
// Informational: reachable means gVisor was detected.
func gvisor() outcome {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return outcome{Inconclusive, "uname: " + errText(err)}
	}
	release := unix.ByteSliceToString(u.Release[:])
	var signals []string
	if strings.Contains(strings.ToLower(release), "gvisor") {
		signals = append(signals, "uname release "+release)
	}
	if unix.ByteSliceToString(u.Version[:]) == gvisorVersion {
		signals = append(signals, "gVisor's fixed uname version")
	}
	buf := make([]byte, 1<<16)
	if n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf); err == nil && bytes.Contains(buf[:n], []byte("Starting gVisor")) {
		signals = append(signals, "kernel log says Starting gVisor")
	}
	if len(signals) == 0 {
		return outcome{Unreachable, "no gVisor marker (uname release " + release + ")"}
	}
	return outcome{Reachable, strings.Join(signals, "; ")}
}
