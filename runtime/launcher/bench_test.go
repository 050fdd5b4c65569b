package launcher

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// Launch benchmarks (make bench-launch, scripts/bench-launch.sh). They are
// measurements, not assertions: `go test` without -bench runs none of them.
// Like the launcher tests they need root, bin/runsc and /bin/busybox.
//
// Both first-byte benchmarks run the same compiled bundle, whose agent is
// `echo ready`, and time from the start of the call to the first byte the
// agent writes to stdout:
//   - BenchmarkLaunchFirstByte: Launch(...) → first byte. This includes
//     everything the launcher does before runsc starts (bundle read,
//     preflight, the runsc id check, the launch record, private run dir,
//     secret injection, bind staging, spec patch).
//   - BenchmarkBareRunscFirstByte: exec of `runsc run` on an already
//     materialized run dir → first byte. Same binary, flags, state root,
//     environment, stdio plumbing and run dir contents as the launcher's
//     (binds staged, untimed), so the ratio includes what staging costs.
// The compile, the run dir materialization of the bare case and every
// teardown after the first byte are outside the timed span.

const benchScript = "echo ready"

// firstByte is a stdout that records when the first byte arrived.
type firstByte struct {
	mu  sync.Mutex
	at  time.Time
	out bytes.Buffer
}

func (f *firstByte) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at.IsZero() && len(p) > 0 {
		f.at = time.Now()
	}
	return f.out.Write(p)
}

func (f *firstByte) since(start time.Time) (time.Duration, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at.IsZero() {
		return 0, f.out.String()
	}
	return f.at.Sub(start), f.out.String()
}

func BenchmarkLaunchFirstByte(b *testing.B) {
	s := benchBundle(b, benchScript)
	// One untimed launch first: a supervisor's state root persists, so the
	// runsc digest cache in it is warm for every launch but the first.
	if _, err := Launch(context.Background(), Options{BundleDir: s.Bundle, StateRoot: s.State, RunscPath: s.Runsc,
		Secrets: staticSecret("v"), Stdin: strings.NewReader("")}); err != nil {
		b.Fatalf("warm-up launch: %v", err)
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		var out firstByte
		var errb bytes.Buffer
		start := time.Now()
		res, err := Launch(context.Background(), Options{
			BundleDir: s.Bundle, StateRoot: s.State, RunscPath: s.Runsc, ID: newID(),
			Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		})
		if err != nil {
			b.Fatalf("launch: %v\nstderr: %s", err, errb.String())
		}
		d, got := out.since(start)
		if res.ExitCode != 0 || got != "ready\n" || d == 0 {
			b.Fatalf("exit %d, output %q (want \"ready\\n\"), stderr: %s", res.ExitCode, got, errb.String())
		}
		total += d
		n++
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-byte-ns")
}

func BenchmarkBareRunscFirstByte(b *testing.B) {
	s := benchBundle(b, benchScript)
	plan, err := launchplan.Load(s.Bundle)
	if err != nil {
		b.Fatal(err)
	}
	rs := &runsc.Runner{Path: s.Runsc, Root: statedir.RunscRoot(s.State), Network: "none"}
	if err := os.MkdirAll(rs.Root, 0o700); err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		id := newID()
		run, err := newRunDir(s.State, id)
		if err != nil {
			b.Fatal(err)
		}
		spec, err := run.materialize(plan)
		if err != nil {
			b.Fatal(err)
		}
		// The run dir as the launcher hands it to runsc: binds staged.
		staged, err := run.stageBinds(plan)
		if err != nil {
			b.Fatal(err)
		}
		if err := run.writeSpec(spec, runtimeState{cgroupsPath: statedir.CgroupsPath(id), binds: staged}); err != nil {
			b.Fatal(err)
		}
		var out firstByte
		var errb bytes.Buffer
		// What rs.command builds, spelled out: the bare runsc invocation.
		cmd := exec.Command(s.Runsc, "--root", rs.Root, "--network=none", "--directfs=false", "run", "--bundle", run.dir, id)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(""), &out, &errb
		b.StartTimer()

		start := time.Now()
		err = cmd.Run()

		b.StopTimer()
		rs.Delete(id)
		run.remove()
		d, got := out.since(start)
		if err != nil || got != "ready\n" || d == 0 {
			b.Fatalf("runsc run: %v, output %q (want \"ready\\n\"), stderr: %s", err, got, errb.String())
		}
		total += d
		n++
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-byte-ns")
}

// BenchmarkLaunchSteps times, separately, the steps Launch takes before it
// starts runsc in network mode none, in Launch's order: where the
// launcher's share of the first-byte time goes.
func BenchmarkLaunchSteps(b *testing.B) {
	s := benchBundle(b, benchScript)
	rs := &runsc.Runner{Path: s.Runsc, Root: statedir.RunscRoot(s.State), Network: "none"}
	if err := os.MkdirAll(rs.Root, 0o700); err != nil {
		b.Fatal(err)
	}
	// Warm the runsc digest cache, as every launch after a state root's
	// first finds it.
	if r := preflight.Run(preflightOptions(Options{RunscPath: s.Runsc, BundleDir: s.Bundle, StateRoot: s.State})); !r.OK() {
		b.Fatal(r.Err())
	}
	var pre, read, idCheck, record, rundir, binds time.Duration
	n := 0
	for b.Loop() {
		id := newID()
		// Launch's order: read the bundle once into a plan, then preflight it.
		t0 := time.Now()
		plan, err := launchplan.Load(s.Bundle)
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		m := plan.Manifest
		po := preflightOptions(Options{RunscPath: s.Runsc, BundleDir: s.Bundle, StateRoot: s.State})
		po.Plan = plan
		report := preflight.Run(po)
		t2 := time.Now()
		if !report.OK() {
			b.Fatal(report.Err())
		}
		known, err := rs.Knows(id)
		t3 := time.Now()
		if err != nil || known {
			b.Fatalf("runsc id check: known %v, %v", known, err)
		}
		err = statedir.WriteRecord(s.State, statedir.Record{ID: id, Bundle: s.Bundle, Profile: m.Profile, Agent: m.Agent, Deployment: m.Deployment,
			Network: "none", Started: time.Now().UTC(), LauncherPID: os.Getpid(), LauncherStart: statedir.ProcessStart(os.Getpid())})
		t4 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		run, err := newRunDir(s.State, id)
		var spec *rspec.Spec
		if err == nil {
			spec, err = run.materialize(plan)
		}
		t5 := time.Now()
		var staged []stagedBind
		if err == nil {
			staged, err = run.stageBinds(plan)
		}
		t6 := time.Now()
		if err == nil {
			err = run.writeSpec(spec, runtimeState{cgroupsPath: statedir.CgroupsPath(id), binds: staged})
		}
		t7 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		run.remove()
		statedir.RemoveRecord(s.State, id)
		b.StartTimer()
		read, pre, idCheck = read+t1.Sub(t0), pre+t2.Sub(t1), idCheck+t3.Sub(t2)
		record, rundir, binds = record+t4.Sub(t3), rundir+t5.Sub(t4)+t7.Sub(t6), binds+t6.Sub(t5)
		n++
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(per(pre), "preflight-ns")
	b.ReportMetric(per(read), "bundle-read-ns")
	b.ReportMetric(per(idCheck), "id-check-ns")
	b.ReportMetric(per(record), "record-ns")
	b.ReportMetric(per(rundir), "rundir-ns")
	b.ReportMetric(per(binds), "binds-ns")
}

// benchBundle compiles the reference facts with an agent that runs script
// in busybox (network mode none), as the launcher tests do.
func benchBundle(b *testing.B, script string) *testbundle.Scene {
	b.Helper()
	return testbundle.New(b, testbundle.Options{Argv: testbundle.Script(script)})
}
