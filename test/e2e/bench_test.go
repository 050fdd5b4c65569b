package e2e

// Pi start benchmarks (make bench-pi, scripts/bench-pi.sh). They are
// measurements, not assertions: `go test ./test/e2e` without -bench runs none of
// them. Like the e2e tests they need root, bin/runsc and the image.
//
// Each benchmark times one start of the real Pi (`pi --mode rpc`, the
// pi-session profile compiled for the e2e scene: fake model, the image's
// pi-mcp-adapter from settings.json, the MCP config, the integration
// extension) up to its first RPC response: get_state is written to Pi's
// stdin right after the start, and the clock stops when the response
// arrives.
//
//   - BenchmarkPiSandboxedFirstResponse: launcher.Launch → response, network
//     mode sandbox, exactly as the e2e tests launch Pi.
//   - BenchmarkPiHostFirstResponse (bench_host_test.go): the same Pi (the
//     image's bundle) as a plain host process, exec → response: gVisor's
//     own share.
//   - BenchmarkPiStockHostFirstResponse: the same host process running
//     Pi's unbundled entry (dist/cli.js, as npm installs it on a user's
//     host): the baseline of the target.
//
// Knobs (environment; scripts/bench-pi.sh sets them):
//
//	PI_BENCH_WARMUP   untimed starts before the timed ones (default 1):
//	                  the page cache, and an agent dir Pi has used before
//	PI_BENCH_IMAGE    a directory laid out as .image/ (image.json, rootfs,
//	                  erofs/): the image to run instead, one of the
//	                  script's variants for an A/B
//	PI_BENCH_STRACE   host benchmark only: a file; Pi runs under
//	                  `strace -f` writing to it; PI_BENCH_STRACE_SET is
//	                  its -e trace= set (default: file syscalls, reads,
//	                  mmap, execve, write)
//
// The investigations that once lived here (runsc run by hand on a captured
// run dir with flag and rootfs variants, checkpoint/restore) answered their
// questions (docs/benchmarks.md, Log) and went; git history has them.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

func BenchmarkPiSandboxedFirstResponse(b *testing.B) {
	e := newBenchEnv(b)
	o := benchOptionsFromEnv(b)
	sc := e.benchScene(b)
	for range o.warmup {
		e.benchSandboxedStart(b, sc, o)
	}
	var total, cpu time.Duration
	n := 0
	for b.Loop() {
		d, c := e.benchSandboxedStart(b, sc, o)
		total, cpu = total+d, cpu+c
		n++
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns")
}

func BenchmarkPiHostFirstResponse(b *testing.B) { benchHost(b, false) }

func BenchmarkPiStockHostFirstResponse(b *testing.B) { benchHost(b, true) }

func benchHost(b *testing.B, stock bool) {
	e := newBenchEnv(b)
	o := benchOptionsFromEnv(b)
	o.stock = stock
	sc := e.benchScene(b)
	for range o.warmup {
		hostStart(b, e, sc, o, "")
	}
	var total, cpu time.Duration
	n := 0
	for b.Loop() {
		d, c := hostStart(b, e, sc, o, os.Getenv("PI_BENCH_STRACE"))
		total, cpu = total+d, cpu+c
		n++
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns")
}

// --- options -------------------------------------------------------------------

type benchOptions struct {
	warmup int
	stock  bool // host only: Pi's unbundled entry instead of the bundle
}

func benchOptionsFromEnv(tb testing.TB) benchOptions {
	return benchOptions{warmup: envInt(tb, "PI_BENCH_WARMUP", 1)}
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

// newBenchEnv is newEnv for a benchmark; it fails (never skips) without
// root, like every test here.
func newBenchEnv(tb testing.TB) *env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("the Pi benchmarks run runsc and mount; run them as root")
	}
	return newEnv(tb)
}

// benchScene is the e2e scene of the pi-session profile.
func (e *env) benchScene(tb testing.TB) *testbundle.Scene {
	tb.Helper()
	return e.scene(tb, "pi-session", "")
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
// It also returns the CPU time the sandbox's cgroup (runsc's Sentry, gofer
// and stubs: everything gVisor runs for it) had used by the response: a
// figure that other work on the machine moves far less than the wall time.
func (e *env) benchSandboxedStart(tb testing.TB, sc *testbundle.Scene, o benchOptions) (time.Duration, time.Duration) {
	tb.Helper()
	b, _ := tb.(*testing.B)
	if b != nil {
		b.StopTimer()
		defer b.StartTimer()
	}
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if b != nil {
		b.StartTimer()
	}
	id := fmt.Sprintf("pp-bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	start := time.Now()
	p := e.launchID(tb, sc, id)
	benchCall(tb, c, p.Client, p.stderr)
	d := time.Since(start)
	if b != nil {
		b.StopTimer()
	}
	cpu := sandboxCPU(tb, id)
	benchStop(tb, p)
	return d, cpu
}

// sandboxCPU is the CPU time of the sandbox's cgroup (statedir.CgroupsPath)
// so far: cpuacct.usage on cgroup v1, cpu.stat's usage_usec on v2.
func sandboxCPU(tb testing.TB, id string) time.Duration {
	tb.Helper()
	rel := statedir.CgroupsPath(id)
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", rel, "cpuacct.usage")); err == nil {
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			tb.Fatalf("cpuacct.usage of %s: %v", id, err)
		}
		return time.Duration(ns)
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", rel, "cpu.stat"))
	if err != nil {
		tb.Fatalf("the CPU time of sandbox %s: no cgroup v1 cpuacct.usage or v2 cpu.stat: %v", id, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("cpu.stat of %s: %v", id, err)
			}
			return time.Duration(us) * time.Microsecond
		}
	}
	tb.Fatalf("cpu.stat of %s has no usage_usec", id)
	return 0
}
