package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests are the control run: this test process is an unsandboxed host
// process, so every probe pointed at something the test planted must
// report the escape. A probe that cannot fail here proves nothing inside a
// sandbox. All traffic goes to servers the tests start on loopback.

// TestMain lets fork-bomb re-execute the test binary as a sleeping child.
func TestMain(m *testing.M) {
	MaybeChild(os.Args)
	os.Exit(m.Run())
}

const canaryEnvName = "PASEO_PROBE_TEST_CANARY"

// scenario is a planted control environment.
type scenario struct {
	cfg    Config
	marker string
	stderr *countWriter
}

// countWriter counts bytes; Stderr is written by several probes.
type countWriter struct {
	mu sync.Mutex
	n  int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += int64(len(p))
	return len(p), nil
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeFile(t *testing.T, p, content string) string {
	t.Helper()
	mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// plantControl builds the host side the acceptance harness will build:
// canaries, an outside dir, a socket, TCP and UDP servers, a host process
// carrying the marker in its env, and the marker in this process's env.
func plantControl(t *testing.T) scenario {
	marker := "PASEO-CANARY-" + randomHex(t, 12)
	base := t.TempDir()
	ws := mkdir(t, filepath.Join(base, "workspace"))
	outside := mkdir(t, filepath.Join(base, "outside")) // adjacent to ws
	writeFile(t, filepath.Join(outside, "planted"), "not a secret\n")
	canaries := []string{
		writeFile(t, filepath.Join(base, "home", ".ssh", "id_ed25519"), "-----BEGIN OPENSSH PRIVATE KEY-----\n"+marker+"\n-----END OPENSSH PRIVATE KEY-----\n"),
		writeFile(t, filepath.Join(base, "daemon-home", "state.json"), `{"token":"`+marker+`"}`+"\n"),
	}
	t.Setenv(canaryEnvName, marker)
	stderr := &countWriter{}
	return scenario{marker: marker, stderr: stderr, cfg: Config{
		Workspace:    ws,
		Outside:      outside,
		Canaries:     canaries,
		CanaryMarker: marker,
		CanaryEnv:    canaryEnvName,
		Sockets:      []string{serveUnix(t)},
		Allowed:      serveTCP(t, "allowed\n"),
		Decoy:        serveTCP(t, "decoy banner\n"),
		HostAddrs:    []string{serveTCP(t, "")},
		DNS:          serveDNS(t, true),
		HostPID:      startHostProcess(t, marker),
		// /dev/null opens for anyone: proof that device-nodes reports an
		// open, whatever this process's privileges.
		Devices:  append(slices.Clone(DefaultDevices), os.DevNull),
		ForkBomb: 8,
		MemHog:   16 << 20,
		Flood:    256 << 10,
		Sleep:    10 * time.Millisecond,
		Timeout:  2 * time.Second,
		Stderr:   stderr,
	}}
}

// serveUnix listens on a Unix socket in a short temp dir (sun_path is
// limited to 108 bytes, which t.TempDir can exceed).
func serveUnix(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go acceptLoop(ln, "")
	return p
}

// serveTCP listens on loopback, writes banner to each connection and reads
// the probe's line.
func serveTCP(t *testing.T, banner string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go acceptLoop(ln, banner)
	return ln.Addr().String()
}

func acceptLoop(ln net.Listener, banner string) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			conn.Write([]byte(banner))
			conn.Read(make([]byte, 64))
		}()
	}
}

// serveDNS is a fake resolver on loopback UDP: it answers every query with
// NXDOMAIN when reply is set, and stays silent otherwise.
func serveDNS(t *testing.T, reply bool) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if !reply || n < 12 {
				continue
			}
			resp := slices.Clone(buf[:n])
			binary.BigEndian.PutUint16(resp[2:], 0x8183) // QR, RD, RA, NXDOMAIN
			pc.WriteTo(resp, addr)
		}
	}()
	return pc.LocalAddr().String()
}

// startHostProcess starts a sleeping child with the marker in its
// environment: the stand-in for a host process (the launcher).
func startHostProcess(t *testing.T, marker string) int {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, ChildFlag, "5m")
	cmd.Env = []string{canaryEnvName + "=" + marker}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

func byName(results []Result) map[string]Result {
	m := make(map[string]Result, len(results))
	for _, r := range results {
		m[r.Name] = r
	}
	return m
}

func expect(t *testing.T, got map[string]Result, name, verdict string) {
	t.Helper()
	r, ok := got[name]
	switch {
	case !ok:
		t.Errorf("%s: no result", name)
	case r.Verdict != verdict:
		t.Errorf("%s: verdict %q, want %q (evidence: %s)", name, r.Verdict, verdict, r.Evidence)
	}
}

// hostEscapes are the probes that must escape in the control run whoever
// runs it: they only touch what the test planted or started.
var hostEscapes = []string{
	"write-outside-absolute", "write-dotdot", "write-symlink", "read-outside",
	"read-cwd-dotdot", "read-canary-0", "read-canary-1",
	"device-nodes", "ptrace-host-pid", "env-canary",
	"unix-socket-0", "decoy-tcp", "host-tcp-0", "dns-unallowed",
	"fork-bomb", "mem-hog", "output-flood", "sleep-past-wall",
}

func TestControlRunEscapes(t *testing.T) {
	s := plantControl(t)
	results := Run(context.Background(), s.cfg)
	for _, r := range results {
		t.Logf("%-22s %-12s %s", r.Name, r.Verdict, r.Evidence) // shown with -v
	}
	got := byName(results)
	for _, name := range hostEscapes {
		expect(t, got, name, Escaped)
	}
	expect(t, got, "workspace-writable", Reachable)
	expect(t, got, "allowed-reachable", Reachable)
	if s.stderr.n < s.cfg.Flood {
		t.Errorf("output-flood wrote %d bytes to Stderr, want at least %d", s.stderr.n, s.cfg.Flood)
	}
	entries, err := os.ReadDir(s.cfg.Workspace)
	if err != nil || len(entries) != 0 {
		t.Errorf("probes left %d entries in the workspace (%v)", len(entries), err)
	}
}

// TestControlRunIdentity checks the probes whose host verdict depends on
// who runs the test against facts read here by other means (capget, the
// status file, access(2)), so the assertion holds as root and non-root.
func TestControlRunIdentity(t *testing.T) {
	s := plantControl(t)
	got := byName(Run(context.Background(), s.cfg))
	caps := testCaps(t)
	has := func(c int) bool { return caps&(1<<c) != 0 }
	euid := os.Geteuid()
	want := map[string]bool{
		"uid-nonroot":  euid == 0,
		"setuid":       euid == 0,
		"capabilities": caps != 0,
		"chown":        has(unix.CAP_CHOWN),
		"mount":        has(unix.CAP_SYS_ADMIN),
		"raw-socket":   has(unix.CAP_NET_RAW),
		"mknod":        has(unix.CAP_MKNOD),
		"write-rootfs": unix.Access("/etc", unix.W_OK) == nil,
		"no-new-privs": statusValue(t, "NoNewPrivs") == "0",
	}
	t.Logf("euid=%d CapEff=%016x", euid, caps)
	for name, escapes := range want {
		expect(t, got, name, map[bool]string{true: Escaped, false: Blocked}[escapes])
	}
	expect(t, got, "gvisor", Unreachable) // the test runs on the host
	checkProc1Root(t, got["read-proc1-root"])
}

// checkProc1Root: /proc/1/root needs ptrace read access to pid 1, which
// the host may deny even to root (an LSM, or pid 1 holding capabilities
// this process lacks). readlink of /proc/1/ns/mnt goes through the same
// access check, so it tells which verdict is right. Either way the same
// read through this process's own /proc/<pid>/root must escape: that
// shows the probe's mechanics can report an escape on this host.
func checkProc1Root(t *testing.T, r Result) {
	t.Helper()
	myNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	pid1NS, err := os.Readlink("/proc/1/ns/mnt")
	switch {
	case errors.Is(err, os.ErrPermission):
		if r.Verdict != Blocked {
			t.Errorf("read-proc1-root: verdict %q although pid 1 is not accessible, want blocked (%s)", r.Verdict, r.Evidence)
		}
		t.Logf("read-proc1-root: this host denies access to pid 1: %s", r.Evidence)
	case err != nil:
		t.Fatal(err)
	case myNS == pid1NS:
		if r.Verdict != Escaped {
			t.Errorf("read-proc1-root: verdict %q with pid 1 in this mount namespace, want escaped (%s)", r.Verdict, r.Evidence)
		}
	default:
		// pid 1 has another mount namespace: whether its tree holds the
		// test's temp dir is not knowable here; only a definite answer
		// is required.
		if r.Verdict == Inconclusive {
			t.Errorf("read-proc1-root: inconclusive (%s)", r.Evidence)
		}
		t.Logf("read-proc1-root: pid 1 in another mount namespace: %s (%s)", r.Verdict, r.Evidence)
	}
}

func TestProcRootOwnPIDEscapes(t *testing.T) {
	s := plantControl(t)
	if o := readProcRoot(os.Getpid(), s.cfg); o.verdict != Escaped {
		t.Errorf("read through /proc/self's root: %v", o)
	}
}

// testCaps reads the effective capability set with capget(2), not the
// status file the probe reads.
func testCaps(t *testing.T) uint64 {
	t.Helper()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32
}

func statusValue(t *testing.T, field string) string {
	t.Helper()
	v, ok := statusField(field)
	if !ok {
		t.Fatalf("no %s in /proc/self/status", field)
	}
	return v
}

// TestEvidenceNeverHoldsMarker runs every probe twice against the control
// scenario, where most of them read the marker: once raw (the probes
// themselves must not put it in evidence) and once through Run and the
// JSON report (what the harness sees).
func TestEvidenceNeverHoldsMarker(t *testing.T) {
	s := plantControl(t)
	c := s.cfg.withDefaults()
	for _, sp := range plan(c) {
		ctx, cancel := context.WithTimeout(context.Background(), sp.timeout)
		o := sp.run(ctx)
		cancel()
		if strings.Contains(o.evidence, s.marker) {
			t.Errorf("%s: raw evidence holds the marker", sp.name)
		}
	}
	out, err := json.Marshal(NewReport(Run(context.Background(), s.cfg)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), s.marker) {
		t.Errorf("report holds the marker: %s", out)
	}
	if got := redact("a "+s.marker+" b", s.marker); strings.Contains(got, s.marker) {
		t.Errorf("redact left the marker: %q", got)
	}
}

// TestSandboxLikeRunBlocks is the opposite control: everything the probes
// aim at is absent, closed or silent, as inside a sandbox, and every
// escape probe must then say blocked (not escaped, not inconclusive).
func TestSandboxLikeRunBlocks(t *testing.T) {
	marker := "PASEO-CANARY-" + randomHex(t, 12)
	base := t.TempDir()
	ws := mkdir(t, filepath.Join(base, "workspace"))
	c := Config{
		Workspace: ws,
		Outside:   filepath.Join(base, "outside"), // never created
		Canaries: []string{
			filepath.Join(base, "absent", "id_ed25519"),
			writeFile(t, filepath.Join(base, "decoy-file"), "no marker here\n"),
		},
		CanaryMarker: marker,
		CanaryEnv:    canaryEnvName, // not set in this test's environment
		Sockets:      []string{filepath.Join(base, "absent.sock")},
		Allowed:      closedPort(t),
		Decoy:        closedPort(t),
		HostAddrs:    []string{closedPort(t)},
		DNS:          serveDNS(t, false),
		HostPID:      1<<31 - 1, // above any pid_max
		Devices:      []string{filepath.Join(base, "absent-dev")},
		Timeout:      300 * time.Millisecond,
	}
	t.Setenv(canaryEnvName, "") // restored after the test
	os.Unsetenv(canaryEnvName)
	got := byName(Run(context.Background(), c))
	for _, name := range []string{
		"write-outside-absolute", "write-dotdot", "write-symlink", "read-outside",
		"read-proc1-root", "read-cwd-dotdot", "read-canary-0", "read-canary-1",
		"device-nodes", "ptrace-host-pid", "env-canary",
		"unix-socket-0", "decoy-tcp", "host-tcp-0", "dns-unallowed",
	} {
		expect(t, got, name, Blocked)
	}
	expect(t, got, "allowed-reachable", Unreachable)
	for _, r := range got {
		if strings.HasPrefix(r.Name, "fork-bomb") || r.Name == "mem-hog" || r.Name == "output-flood" || r.Name == "sleep-past-wall" {
			t.Errorf("resource probe %s ran although disabled", r.Name)
		}
	}
}

// closedPort returns a loopback address with nothing listening.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestResourceProbesBlocked drives the failure paths of the resource
// probes that can be provoked without limiting the test process itself.
func TestResourceProbesBlocked(t *testing.T) {
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if o := forkBomb(expired, 4); o.verdict != Inconclusive {
		t.Errorf("fork-bomb past its deadline: %v", o)
	}
	if o := outputFlood(context.Background(), 1<<20, failingWriter{}); o.verdict != Blocked || !strings.Contains(o.evidence, "EPIPE") {
		t.Errorf("output-flood into a closed pipe: %v", o)
	}
	if o := sleepPastWall(expired, time.Hour, &countWriter{}); o.verdict != Inconclusive {
		t.Errorf("sleep-past-wall past its deadline: %v", o)
	}
	if o := memHog(expired, 1<<30, &countWriter{}); o.verdict != Inconclusive {
		t.Errorf("mem-hog past its deadline: %v", o)
	}
}

// failingWriter fails like a pipe whose reader went away.
type failingWriter struct{}

func (failingWriter) Write(p []byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: "/dev/stderr", Err: syscall.EPIPE}
}

func TestNotConfigured(t *testing.T) {
	results := Run(context.Background(), Config{Timeout: time.Second})
	got := byName(results)
	for _, name := range []string{"write-outside-absolute", "read-proc1-root", "workspace-writable", "ptrace-host-pid", "env-canary", "decoy-tcp", "dns-unallowed", "allowed-reachable"} {
		expect(t, got, name, Inconclusive)
		if !strings.Contains(got[name].Evidence, "not configured") {
			t.Errorf("%s: evidence %q", name, got[name].Evidence)
		}
	}
	for _, r := range results {
		if strings.HasPrefix(r.Name, "read-canary-") || strings.HasPrefix(r.Name, "unix-socket-") || strings.HasPrefix(r.Name, "host-tcp-") {
			t.Errorf("%s planned without inputs", r.Name)
		}
	}
}

func TestOnly(t *testing.T) {
	c := Config{Canaries: []string{"/nonexistent/a", "/nonexistent/b"}, Only: []string{"uid-nonroot", "read-canary-*"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range Run(context.Background(), c) {
		names = append(names, r.Name)
	}
	if want := []string{"read-canary-0", "read-canary-1", "uid-nonroot"}; !slices.Equal(names, want) {
		t.Errorf("ran %v, want %v (plan order)", names, want)
	}
	for _, only := range [][]string{{"no-such-probe"}, {"fork-bomb"}, {"read-canary-2"}} {
		c.Only = only
		if err := c.Validate(); err == nil {
			t.Errorf("Validate accepted -only %v", only)
		}
	}
	c = Config{ForkBomb: 4, Only: []string{"fork-bomb"}}
	if err := c.Validate(); err != nil {
		t.Errorf("fork-bomb enabled: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{Workspace: "relative/ws"},
		{Decoy: "10.0.0.1"},
		{HostAddrs: []string{":80"}},
		{DNS: "resolver.test:53"},
		{MemHog: -1},
		{Timeout: -time.Second},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", c)
		}
	}
}

// TestRunnerContainsHangsAndPanics: a probe stuck in a syscall or one that
// panics costs its own result, never the report.
func TestRunnerContainsHangsAndPanics(t *testing.T) {
	stuck := make(chan struct{})
	defer close(stuck)
	r := runOne(context.Background(), spec{name: "hang", kind: KindEscape, timeout: 50 * time.Millisecond,
		run: func(context.Context) outcome { <-stuck; return outcome{Escaped, ""} }})
	if r.Verdict != Inconclusive || !strings.Contains(r.Evidence, "no answer") {
		t.Errorf("hanging probe: %+v", r)
	}
	r = runOne(context.Background(), spec{name: "panic", kind: KindEscape, timeout: time.Second,
		run: func(context.Context) outcome { panic("boom") }})
	if r.Verdict != Inconclusive || !strings.Contains(r.Evidence, "panicked") {
		t.Errorf("panicking probe: %+v", r)
	}
}

func TestDNSQuery(t *testing.T) {
	got := dnsQuery(0xbeef, "probe.test")
	want := []byte{0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
		5, 'p', 'r', 'o', 'b', 'e', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1}
	if !slices.Equal(got, want) {
		t.Errorf("dnsQuery = % x\nwant       % x", got, want)
	}
}

func TestReportCounts(t *testing.T) {
	r := NewReport([]Result{
		{Verdict: Escaped}, {Verdict: Blocked}, {Verdict: Blocked},
		{Verdict: Inconclusive}, {Kind: KindReachability, Verdict: Reachable},
		{Kind: KindReachability, Verdict: Inconclusive},
	})
	if r.Escaped != 1 || r.Blocked != 2 || r.Inconclusive != 2 {
		t.Errorf("counts %+v", r)
	}
	out, _ := json.Marshal(NewReport(nil))
	if string(out) != `{"probes":[],"escaped":0,"blocked":0,"inconclusive":0}` {
		t.Errorf("empty report %s", out)
	}
}

func TestErrText(t *testing.T) {
	for err, want := range map[error]string{
		&os.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}: "ENOENT",
		context.DeadlineExceeded:                                   "timeout",
		errors.New("other"):                                        "other",
	} {
		if got := errText(err); got != want {
			t.Errorf("errText(%v) = %q, want %q", err, got, want)
		}
	}
}
