package e2e

// Pi start benchmarks (make bench-pi, scripts/bench-pi.sh). They are
// measurements, not assertions: `go test ./e2e` without -bench runs none of
// them. Like the e2e tests they need root, bin/runsc and the image.
//
// Every benchmark times one start of the real Pi (`pi --mode rpc`, the
// pi-session profile compiled for the e2e scene: fake model, the image's
// pi-mcp-adapter from settings.json, the MCP config, the integration
// extension) up to its first RPC response: get_state is written to Pi's
// stdin right after the start, and the clock stops when the response
// arrives.
//
//   - BenchmarkPiSandboxedFirstResponse: launcher.Launch → response, network
//     mode sandbox, exactly as the e2e tests launch Pi.
//   - BenchmarkPiHostFirstResponse: the same Pi as a plain host process,
//     exec → response. It runs the compiled process (argv, env with the
//     secrets filled in, cwd, uid/gid) chrooted into a private overlay over
//     the same image, with the compiled mounts rebuilt by the host kernel
//     (proc, tmpfs, devpts, sysfs, the binds of the state dirs, the agent's
//     jiti cache at /tmp/jiti, workspace, extension, mcp.json, hosts,
//     resolv.conf; not the EROFS mounts: the tree under the overlay holds
//     the same files), so Node reads the same files with no gofer in between
//     and keeps its jiti cache between starts, as a host Pi keeps /tmp/jiti. mcp.json names the fake daemon on loopback
//     instead of the sandbox gateway. No cgroup limits, no rlimits.
//   - BenchmarkPiRunscFirstResponse: investigation. The bundle the launcher
//     materialized for one Launch (copied while it ran) is run by hand with
//     `runsc run`, once per variant and round, on a fresh private overlay
//     like the launcher's, network none; each variant adds runsc flags or
//     spec changes (PI_BENCH_RUNSC_VARIANTS).
//   - BenchmarkPiRestoreFirstResponse: investigation. Pi is started by hand
//     as above, answers get_state, and is checkpointed (`runsc checkpoint`);
//     each sample is `runsc restore` of that image → response to a new
//     get_state.
//
// Knobs (environment; scripts/bench-pi.sh sets them):
//
//	PI_BENCH_WARMUP   untimed starts before the timed ones (default 1):
//	                  the page cache, and an agent dir Pi has used before
//	PI_BENCH_ENV      extra NAME=VALUE words for Pi's environment, added by
//	                  running the profile's argv under /usr/bin/env (the
//	                  compiler has no per-test env); "{agent}" is the agent
//	                  dir's path (the same inside and outside the sandbox)
//	PI_BENCH_CLEAR    paths under the scene's state root (srv/paseo/state:
//	                  pi-agent/…, pi-cache/agent-7f3c for the jiti cache)
//	                  emptied before every start (timed or not): a cold
//	                  cache. A directory keeps itself (it is a pinned bind
//	                  source) and loses its contents.
//	PI_BENCH_SEED     1: after PI_BENCH_CLEAR, copy the image's jiti seed
//	                  (/opt/pi-jiti-seed) into the agent's cache dir, as a
//	                  daemon would for a new agent
//	PI_BENCH_STRACE   host benchmark only: a file; Pi runs under
//	                  `strace -f` writing to it; PI_BENCH_STRACE_SET is
//	                  its -e trace= set (default: file syscalls, reads,
//	                  mmap, execve, write)
//	PI_BENCH_RUNSC_VARIANTS  "name=words;name=words…" for
//	                  BenchmarkPiRunscFirstResponse; words are runsc flags,
//	                  or @erofs (the rootfs from the EROFS image of the
//	                  whole tree in PI_BENCH_EROFS, via gVisor's rootfs
//	                  annotations, instead of the compiled /usr and /opt
//	                  EROFS mounts), @tree (no EROFS at all: every file
//	                  through the gofer, as before image.erofs),
//	                  @rootrw (root.readonly false), @metrics=FILE (gVisor's
//	                  final metrics written to FILE, one sample per variant)
//	PI_BENCH_ROUNDS   rounds of those variants (default 5)

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
)

func BenchmarkPiSandboxedFirstResponse(b *testing.B) {
	e := newBenchEnv(b)
	o := benchOptionsFromEnv(b)
	sc := e.benchScene(b, o)
	for range o.warmup {
		e.benchSandboxedStart(b, sc, o)
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		total += e.benchSandboxedStart(b, sc, o)
		n++
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
}

func BenchmarkPiHostFirstResponse(b *testing.B) {
	e := newBenchEnv(b)
	o := benchOptionsFromEnv(b)
	sc := e.benchScene(b, o)
	for range o.warmup {
		hostStart(b, e, sc, o, "")
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		total += hostStart(b, e, sc, o, os.Getenv("PI_BENCH_STRACE"))
		n++
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
}

func BenchmarkPiRunscFirstResponse(b *testing.B) {
	e := newBenchEnv(b)
	o := benchOptionsFromEnv(b)
	sc := e.benchScene(b, o)
	capture := e.captureRunDir(b, sc, o)
	prepareHandRuns(b, sc)
	spec := os.Getenv("PI_BENCH_RUNSC_VARIANTS")
	if spec == "" {
		spec = "default="
	}
	type variant struct{ name, words string }
	var variants []variant
	for _, v := range strings.Split(spec, ";") {
		name, words, _ := strings.Cut(v, "=")
		variants = append(variants, variant{strings.TrimSpace(name), words})
	}
	rounds := envInt(b, "PI_BENCH_ROUNDS", 5)
	for r := range rounds {
		// The order rotates between rounds, so drift in load hits every
		// variant alike.
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			if strings.Contains(v.words, "@metrics=") && r > 0 {
				continue
			}
			b.Run(v.name, func(b *testing.B) {
				var total time.Duration
				n := 0
				for b.Loop() {
					total += handStart(b, e, sc, capture, o, strings.Fields(v.words))
					n++
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
			})
		}
	}
}

func BenchmarkPiRestoreFirstResponse(b *testing.B) {
	e := newBenchEnv(b)
	o := benchOptionsFromEnv(b)
	sc := e.benchScene(b, o)
	capture := e.captureRunDir(b, sc, o)
	prepareHandRuns(b, sc)
	hr := newHandRun(b, sc, capture, nil)
	defer hr.remove()
	img := filepath.Join(b.TempDir(), "checkpoint")
	id := benchID("ckpt")
	p, cmd := hr.run(b, id, "run", "--bundle", hr.dir, id)
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	benchCall(b, c, p.Client, p.stderr)
	t0 := time.Now()
	if out, err := exec.Command(sc.Runsc, append(hr.flags(), "checkpoint", "--image-path", img, id)...).CombinedOutput(); err != nil {
		b.Fatalf("runsc checkpoint: %v: %s", err, out)
	}
	b.Logf("checkpoint of a warm Pi: %v; image %s", time.Since(t0).Round(time.Millisecond), duSize(img))
	waitExit(b, sc.Runsc, hr, id, cmd, p)
	var total time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		id := benchID("rst")
		b.StartTimer()
		start := time.Now()
		p, cmd := hr.run(b, id, "restore", "--image-path", img, "--bundle", hr.dir, id)
		benchCall(b, c, p.Client, p.stderr)
		d := time.Since(start)
		b.StopTimer()
		p.stdin.Close()
		waitExit(b, sc.Runsc, hr, id, cmd, p)
		total += d
		n++
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
}

// --- options -------------------------------------------------------------------

type benchOptions struct {
	warmup int
	env    []string // NAME=VALUE, {agent} not yet expanded
	clear  []string
	seed   bool
}

func benchOptionsFromEnv(tb testing.TB) benchOptions {
	return benchOptions{warmup: envInt(tb, "PI_BENCH_WARMUP", 1),
		env: strings.Fields(os.Getenv("PI_BENCH_ENV")), clear: strings.Fields(os.Getenv("PI_BENCH_CLEAR")),
		seed: os.Getenv("PI_BENCH_SEED") == "1"}
}

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		tb.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}

// clearCaches empties the PI_BENCH_CLEAR paths under the state root and,
// with PI_BENCH_SEED, copies the image's jiti seed into the agent's cache
// dir, as a daemon would for a new agent.
func (o benchOptions) clearCaches(tb testing.TB, sc *testbundle.Scene) {
	defer func() {
		if !o.seed {
			return
		}
		seed := filepath.Join(sc.Rootfs, "opt/pi-jiti-seed")
		ents, err := os.ReadDir(seed)
		if err != nil || len(ents) == 0 {
			tb.Fatalf("PI_BENCH_SEED: the image has no jiti seed at %s (%v): rebuild it with make image", seed, err)
		}
		cache := filepath.Join(sc.Host, "srv/paseo/state/pi-cache/agent-7f3c")
		for _, e := range ents {
			data, err := os.ReadFile(filepath.Join(seed, e.Name()))
			if err != nil {
				tb.Fatal(err)
			}
			p := filepath.Join(cache, e.Name())
			if err := os.WriteFile(p, data, 0o644); err != nil {
				tb.Fatal(err)
			}
			if err := os.Chown(p, 1000, 1000); err != nil {
				tb.Fatal(err)
			}
		}
	}()
	for _, p := range o.clear {
		p = filepath.Join(sc.Host, "srv/paseo/state", filepath.Clean("/"+p))
		ents, err := os.ReadDir(p)
		if err != nil {
			if err := os.RemoveAll(p); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

func benchAgentDir(host string) string { return filepath.Join(host, "srv/paseo/state/pi-agent") }

func benchID(prefix string) string {
	return fmt.Sprintf("pb-%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// newBenchEnv is newEnv for a benchmark; it fails (never skips) without
// root, like every test here.
func newBenchEnv(tb testing.TB) *env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("the Pi benchmarks run runsc and mount; run them as root")
	}
	return newEnv(tb)
}

// benchScene is scene(tb, "pi-session", "") with, under PI_BENCH_ENV, the
// profile's argv run under /usr/bin/env.
func (e *env) benchScene(tb testing.TB, o benchOptions) *testbundle.Scene {
	tb.Helper()
	var argv []string
	if len(o.env) > 0 {
		argv = []string{"/usr/bin/env"}
		for _, kv := range o.env {
			argv = append(argv, strings.ReplaceAll(kv, "{agent}", benchAgentDir(e.host)))
		}
		// The pi-session profile's argv (profiles/pi-session.cue).
		argv = append(argv, "pi", "--mode", "rpc", "slot:model", "slot:thinking", "slot:session", "slot:mcp-config", "slot:extension")
	}
	return e.sceneArgv(tb, "pi-session", "", argv)
}

// benchStop ends Pi's input and waits for the launch to return.
func benchStop(tb testing.TB, p *pi) {
	tb.Helper()
	p.stdin.Close()
	select {
	case <-p.done:
		if p.result.err != nil {
			tb.Fatalf("launch: %v\nstderr: %s", p.result.err, p.stderr.String())
		}
		if p.result.res.ExitCode != 0 {
			tb.Fatalf("Pi exit %d (%s); stderr: %s", p.result.res.ExitCode, p.result.res.Reason, p.stderr.String())
		}
	case <-time.After(60 * time.Second):
		tb.Fatalf("Pi did not exit after stdin closed; stderr: %s", p.stderr.String())
	}
}

// benchCall sends get_state and waits for a successful response.
func benchCall(tb testing.TB, c context.Context, client *piproto.Client, stderr fmt.Stringer) {
	tb.Helper()
	resp, _, err := client.Call(c, map[string]any{"type": "get_state"})
	if err != nil {
		tb.Fatalf("get_state: %v\nstderr: %s", err, stderr)
	}
	if !resp.OK() || !strings.Contains(string(resp.Data), "fake-1") {
		tb.Fatalf("get_state: %s\nstderr: %s", resp.Raw, stderr)
	}
}

// benchSandboxedStart times Launch → get_state response, then stops Pi.
func (e *env) benchSandboxedStart(tb testing.TB, sc *testbundle.Scene, o benchOptions) time.Duration {
	tb.Helper()
	b, _ := tb.(*testing.B)
	if b != nil {
		b.StopTimer()
		defer b.StartTimer()
	}
	o.clearCaches(tb, sc)
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if b != nil {
		b.StartTimer()
	}
	start := time.Now()
	p := e.launchID(tb, sc, "")
	benchCall(tb, c, p.Client, p.stderr)
	d := time.Since(start)
	if b != nil {
		b.StopTimer()
	}
	benchStop(tb, p)
	return d
}

// --- the same Pi on the host ------------------------------------------------------

// hostPi is the compiled Pi process, ready to run as a host process in a
// chroot that rebuilds the compiled mounts.
type hostPi struct {
	sc         *testbundle.Scene
	base, root string
	spec       rspec.Spec
	path       string // argv[0] resolved in the chroot
	env        []string
}

var secretRef = regexp.MustCompile(`@@paseo-secret:([^@]+)@@`)

func fillSecrets(tb testing.TB, s string) string {
	return secretRef.ReplaceAllStringFunc(s, func(m string) string {
		v, err := secrets("host-alice", secretRef.FindStringSubmatch(m)[1])
		if err != nil {
			tb.Fatal(err)
		}
		return string(v)
	})
}

func newHostPi(tb testing.TB, e *env, sc *testbundle.Scene) *hostPi {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(sc.Bundle, "config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	h := &hostPi{sc: sc, base: filepath.Join(tb.TempDir(), "hostroot")}
	if err := json.Unmarshal(data, &h.spec); err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(h.base, 0o755); err != nil {
		tb.Fatal(err)
	}
	// A private mount tree: nothing below base propagates to the host.
	mount(tb, h.base, h.base, "", unix.MS_BIND, "")
	mount(tb, "", h.base, "", unix.MS_PRIVATE|unix.MS_REC, "")
	tb.Cleanup(func() { detachAndRemove(tb, h.base) })

	upper, work := filepath.Join(h.base, "upper"), filepath.Join(h.base, "work")
	h.root = filepath.Join(h.base, "merged")
	for _, d := range []string{upper, work, h.root, filepath.Join(h.base, "files")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	mount(tb, "overlay", h.root, "overlay", unix.MS_NOSUID|unix.MS_NODEV,
		"lowerdir="+sc.Rootfs+",upperdir="+upper+",workdir="+work)

	for _, m := range h.spec.Mounts {
		dst := filepath.Join(h.root, m.Destination)
		flags, data := mountOptions(m.Options)
		switch m.Type {
		case "proc", "tmpfs", "sysfs", "devpts":
			mkdirAll(tb, dst)
			mount(tb, m.Type, dst, m.Type, flags, data)
			if m.Destination == "/dev" {
				// What gVisor's /dev offers the agent, from the host.
				for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
					write(tb, filepath.Join(dst, d), "")
					mount(tb, "/dev/"+d, filepath.Join(dst, d), "", unix.MS_BIND, "")
				}
			}
		case "bind":
			src := m.Source
			if !filepath.IsAbs(src) {
				// A bundle file (hosts, resolv.conf, mcp.json): what the
				// launcher materializes, with the secrets filled in; the
				// MCP route is the daemon on loopback here.
				raw, err := os.ReadFile(filepath.Join(sc.Bundle, src))
				if err != nil {
					tb.Fatal(err)
				}
				s := fillSecrets(tb, string(raw))
				s = strings.ReplaceAll(s, "http://paseo-gateway:6767/", fmt.Sprintf("http://127.0.0.1:%d/", e.daemon.port))
				src = filepath.Join(h.base, "files", filepath.Base(src))
				if err := os.WriteFile(src, []byte(s), 0o644); err != nil {
					tb.Fatal(err)
				}
			}
			fi, err := os.Stat(src)
			if err != nil {
				tb.Fatal(err)
			}
			if fi.IsDir() {
				mkdirAll(tb, dst)
			} else {
				mkdirAll(tb, filepath.Dir(dst))
				if _, err := os.Stat(dst); err != nil {
					write(tb, dst, "")
				}
			}
			mount(tb, src, dst, "", unix.MS_BIND, "")
			mount(tb, "", dst, "", unix.MS_REMOUNT|unix.MS_BIND|flags, "")
		case "erofs":
			// The overlay's lower layer is the tree the EROFS file was
			// built from: the same files, read by the host kernel.
		default:
			tb.Fatalf("host Pi: mount type %q not handled", m.Type)
		}
	}
	if h.spec.Root.Readonly {
		mount(tb, "", h.root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	}

	for _, kv := range h.spec.Process.Env {
		h.env = append(h.env, fillSecrets(tb, kv))
	}
	h.path = h.spec.Process.Args[0]
	if !strings.Contains(h.path, "/") {
		for _, kv := range h.env {
			if dirs, ok := strings.CutPrefix(kv, "PATH="); ok {
				for _, d := range filepath.SplitList(dirs) {
					if _, err := os.Stat(filepath.Join(h.root, d, h.path)); err == nil {
						h.path = filepath.Join(d, h.path)
						break
					}
				}
			}
		}
	}
	return h
}

// mountOptions maps OCI mount options to mount flags and data.
func mountOptions(opts []string) (uintptr, string) {
	var flags uintptr
	var data []string
	for _, o := range opts {
		switch o {
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "ro":
			flags |= unix.MS_RDONLY
		case "strictatime":
			flags |= unix.MS_STRICTATIME
		case "rw", "bind", "rbind":
		default:
			data = append(data, o)
		}
	}
	return flags, strings.Join(data, ",")
}

func mount(tb testing.TB, src, dst, fstype string, flags uintptr, data string) {
	tb.Helper()
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		tb.Fatalf("mount %s on %s (%s, %#x, %q): %v", src, dst, fstype, flags, data, err)
	}
}

func mkdirAll(tb testing.TB, p string) {
	tb.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		tb.Fatal(err)
	}
}

// mountsBeneath lists the mount points at or below root, outermost first.
func mountsBeneath(root string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == root || strings.HasPrefix(f[4], root+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// detachAndRemove unmounts everything at or below dir, then removes it,
// but only when nothing is mounted there any more (binds of the scene's
// host dirs and the image must never be walked by RemoveAll).
func detachAndRemove(tb testing.TB, dir string) {
	for range 3 {
		ms := mountsBeneath(dir)
		if len(ms) == 0 {
			break
		}
		for i := len(ms) - 1; i >= 0; i-- {
			_ = unix.Unmount(ms[i], unix.MNT_DETACH)
		}
	}
	if ms := mountsBeneath(dir); len(ms) > 0 {
		tb.Logf("left %s in place: still mounted: %v", dir, ms)
		return
	}
	_ = os.RemoveAll(dir)
}

// hostStart runs the host Pi once in a fresh chroot (every tmpfs new, as
// in a new sandbox): exec → get_state response, then EOF on its stdin and
// wait. With traceFile, Pi runs under strace writing there.
func hostStart(tb testing.TB, e *env, sc *testbundle.Scene, o benchOptions, traceFile string) time.Duration {
	tb.Helper()
	b, _ := tb.(*testing.B)
	if b != nil {
		b.StopTimer()
		defer b.StartTimer()
	}
	h := newHostPi(tb, e, sc)
	defer detachAndRemove(tb, h.base)
	o.clearCaches(tb, h.sc)
	u := h.spec.Process.User
	cmd := &exec.Cmd{Path: h.path, Args: h.spec.Process.Args, Env: h.env, Dir: h.spec.Process.Cwd,
		SysProcAttr: &syscall.SysProcAttr{Chroot: h.root, Setpgid: true, Pdeathsig: syscall.SIGKILL,
			Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}}}
	if traceFile != "" {
		// strace runs on the host and execs the same process in the chroot.
		set := os.Getenv("PI_BENCH_STRACE_SET")
		if set == "" {
			set = "open,openat,openat2,stat,lstat,fstat,newfstatat,statx,access,faccessat,faccessat2,readlink,readlinkat,getdents64,read,pread64,mmap,execve,write"
		}
		args := []string{"strace", "-f", "-qq", "-s", "96", "-o", traceFile, "-e", "trace=" + set,
			"--", "chroot", fmt.Sprintf("--userspec=%d:%d", u.UID, u.GID), "--groups=", h.root,
			"/usr/bin/env", "-i", "-C", h.spec.Process.Cwd}
		args = append(args, h.env...)
		args = append(args, h.path)
		args = append(args, h.spec.Process.Args[1:]...)
		cmd = exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	client := piproto.New(stdout, stdin)
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	if b != nil {
		b.StartTimer()
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("host Pi: %v", err)
	}
	benchCall(tb, c, client, stderr)
	d := time.Since(start)
	if b != nil {
		b.StopTimer()
	}

	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			tb.Fatalf("host Pi exit: %v; stderr: %s", err, stderr)
		}
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		tb.Fatalf("host Pi did not exit after stdin closed; stderr: %s", stderr)
	}
	return d
}

// --- runsc by hand ----------------------------------------------------------------------

// captureRunDir launches the scene once (untimed, and after the warm-up
// starts) and copies the run dir the launcher materialized (patched
// config.json, hosts, resolv.conf, mcp.json with secrets) while Pi runs.
func (e *env) captureRunDir(tb testing.TB, sc *testbundle.Scene, o benchOptions) string {
	tb.Helper()
	if b, ok := tb.(*testing.B); ok {
		b.StopTimer()
		defer b.StartTimer()
	}
	for range o.warmup {
		e.benchSandboxedStart(tb, sc, o)
	}
	id := benchID("capture")
	p := e.launchID(tb, sc, id)
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	benchCall(tb, c, p.Client, p.stderr)
	run := filepath.Join(sc.State, "run", id)
	dst := filepath.Join(tb.TempDir(), "capture")
	err := filepath.Walk(run, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(run, p)
		if rel == "root" {
			return filepath.SkipDir // the overlay mount
		}
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, fi.Mode().Perm())
	})
	if err != nil {
		tb.Fatal(err)
	}
	benchStop(tb, p)
	return dst
}

// handRun is one private run dir for runsc by hand: the captured files, a
// fresh overlay over the image, the spec patched for the variant.
type handRun struct {
	dir, runscPath, stateRoot string
	extra                     []string
}

func (h *handRun) flags() []string {
	return append([]string{"--root", handRunscRoot(h.stateRoot), "--network=none", "--directfs=false"}, h.extra...)
}

// handRunscRoot is the runsc state root of the hand runs, apart from the
// launcher's.
func handRunscRoot(stateRoot string) string { return filepath.Join(stateRoot, "hand-runsc") }

// prepareHandRuns makes the hand runs' runsc root, and detaches the nsfs
// mount runsc leaves in it before the scene's temp dir is removed.
func prepareHandRuns(tb testing.TB, sc *testbundle.Scene) {
	mkdirAll(tb, handRunscRoot(sc.State))
	tb.Cleanup(func() {
		ms := mountsBeneath(handRunscRoot(sc.State))
		for i := len(ms) - 1; i >= 0; i-- {
			_ = unix.Unmount(ms[i], unix.MNT_DETACH)
		}
	})
}

func newHandRun(tb testing.TB, sc *testbundle.Scene, capture string, words []string) *handRun {
	tb.Helper()
	h := &handRun{dir: filepath.Join(sc.State, "hand", benchID("run")), runscPath: sc.Runsc, stateRoot: sc.State}
	mkdirAll(tb, h.dir)
	err := filepath.Walk(capture, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(capture, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(h.dir, rel), 0o700)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(h.dir, rel), data, fi.Mode().Perm())
	})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := filepath.Join(h.dir, "config.json")
	data, err := os.ReadFile(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	var spec rspec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		tb.Fatal(err)
	}
	base := filepath.Join(h.dir, "root")
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		mkdirAll(tb, d)
	}
	mount(tb, "overlay", merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, "lowerdir="+sc.Rootfs+",upperdir="+upper+",workdir="+work)
	spec.Root.Path = merged
	for i := range spec.Linux.Namespaces {
		if spec.Linux.Namespaces[i].Type == rspec.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = "" // network none: runsc makes its own
		}
	}
	for _, w := range words {
		switch {
		case w == "@erofs":
			img := os.Getenv("PI_BENCH_EROFS")
			if img == "" {
				tb.Fatal("@erofs was asked for but PI_BENCH_EROFS (an EROFS image of the rootfs) is not set")
			}
			if spec.Annotations == nil {
				spec.Annotations = map[string]string{}
			}
			spec.Annotations["dev.gvisor.spec.rootfs.source"] = img
			spec.Annotations["dev.gvisor.spec.rootfs.type"] = "erofs"
			spec.Mounts = withoutErofs(spec.Mounts)
		case w == "@tree":
			spec.Mounts = withoutErofs(spec.Mounts)
		case w == "@rootrw":
			spec.Root.Readonly = false
		case strings.HasPrefix(w, "@metrics="):
			h.extra = append(h.extra, "--final-metrics-log="+strings.TrimPrefix(w, "@metrics="))
		case strings.HasPrefix(w, "@"):
			tb.Fatalf("unknown variant word %q", w)
		default:
			h.extra = append(h.extra, w)
		}
	}
	out, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(cfg, out, 0o600); err != nil {
		tb.Fatal(err)
	}
	return h
}

// withoutErofs drops the compiled EROFS mounts (the tree has the same files).
func withoutErofs(ms []rspec.Mount) []rspec.Mount {
	var out []rspec.Mount
	for _, m := range ms {
		if m.Type != "erofs" {
			out = append(out, m)
		}
	}
	return out
}

func (h *handRun) remove() {
	if ms := mountsBeneath(h.dir); len(ms) > 0 {
		for i := len(ms) - 1; i >= 0; i-- {
			_ = unix.Unmount(ms[i], unix.MNT_DETACH)
		}
	}
	if len(mountsBeneath(h.dir)) == 0 {
		_ = os.RemoveAll(h.dir)
	}
}

// handPi is Pi under runsc started by hand.
type handPi struct {
	*piproto.Client
	stdin  io.WriteCloser
	stderr *lockedBuffer
}

// run starts `runsc <flags> <args…>` for container id with Pi's stdio.
func (h *handRun) run(tb testing.TB, id string, args ...string) (*handPi, *exec.Cmd) {
	tb.Helper()
	cmd := exec.Command(h.runscPath, append(h.flags(), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &handPi{Client: piproto.New(stdout, stdin), stdin: stdin, stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
		_ = exec.Command(h.runscPath, append(h.flags(), "delete", "--force", id)...).Run()
	})
	return p, cmd
}

// waitExit waits for runsc to end (Pi's stdin is closed, or it was
// checkpointed), then deletes the container.
func waitExit(tb testing.TB, runsc string, h *handRun, id string, cmd *exec.Cmd, p *handPi) {
	tb.Helper()
	p.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		tb.Errorf("runsc did not exit; stderr: %s", p.stderr)
	}
	_ = exec.Command(runsc, append(h.flags(), "delete", "--force", id)...).Run()
}

// handStart prepares a run dir for the variant, then times exec of
// `runsc run` → get_state response.
func handStart(b *testing.B, e *env, sc *testbundle.Scene, capture string, o benchOptions, words []string) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	o.clearCaches(b, sc)
	h := newHandRun(b, sc, capture, words)
	defer h.remove()
	id := benchID("hand")
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b.StartTimer()
	start := time.Now()
	p, cmd := h.run(b, id, "run", "--bundle", h.dir, id)
	benchCall(b, c, p.Client, p.stderr)
	d := time.Since(start)
	b.StopTimer()
	waitExit(b, sc.Runsc, h, id, cmd, p)
	return d
}

func duSize(dir string) string {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
