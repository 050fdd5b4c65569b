package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// BenchmarkPiWakeFirstResponse (make bench-pi, section 6) times the
// product's wake: launcher.Wake of a hibernated Pi (the image's digests
// checked, the secrets materialized and compared, the binds staged by
// descriptor, the network rebuilt on the same link, runsc restore, runsc
// reporting it running) → the response to a get_state written right after
// the wake starts. Pi is launched once (network sandbox, the e2e scene, as
// BenchmarkPiSandboxedFirstResponse), answers get_state, and before every
// sample is checkpointed again (launcher.Checkpoint, untimed), so each
// wake restores a fresh image of the same warm Pi. The script compares the
// median with the host start and the sandboxed cold start.
func BenchmarkPiWakeFirstResponse(b *testing.B) {
	e := newBenchEnv(b)
	sc := e.benchScene(b)
	id := benchID("wake")
	c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := e.wakeRun(b, sc, id, false)
	benchCall(b, c, p.Client, p.stderr)
	var total, checkpoint time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		// Wake deletes the image once runsc reports the container running,
		// which may come after Pi's answer.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(statedir.HibernateDir(sc.State, id)); err != nil {
				break
			}
		}
		t0 := time.Now()
		if _, err := launcher.Checkpoint(launcher.CheckpointOptions{ID: id, StateRoot: sc.State, RunscPath: sc.Runsc}); err != nil {
			out, _ := exec.Command("ls", "-laR", statedir.HibernateDir(sc.State, id)).CombinedOutput()
			b.Fatalf("checkpoint: %v\n%s\nstderr: %s", err, out, p.stderr)
		}
		checkpoint += time.Since(t0)
		if n == 0 {
			b.Logf("checkpoint of a warm Pi: %v; image %s", time.Since(t0).Round(time.Millisecond), duSize(statedir.HibernateDir(sc.State, id)))
		}
		select {
		case <-p.done:
		case <-time.After(60 * time.Second):
			b.Fatal("the checkpointed launch did not end")
		}
		b.StartTimer()
		start := time.Now()
		p = e.wakeRun(b, sc, id, true)
		benchCall(b, c, p.Client, p.stderr)
		total += time.Since(start)
		n++
	}
	b.StopTimer()
	benchStop(b, p)
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
	b.ReportMetric(float64(checkpoint.Nanoseconds())/float64(n), "checkpoint-ns")
}

// wakeRun is launchID with a fixed id, or (wake) launcher.Wake of it.
func (e *env) wakeRun(tb testing.TB, sc *testbundle.Scene, id string, wake bool) *pi {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &pi{Client: piproto.New(outR, inW), stdin: inW, stderr: &lockedBuffer{}, done: make(chan struct{})}
	lctx, cancel := context.WithCancel(context.Background())
	run := launcher.Launch
	if wake {
		run = launcher.Wake
	}
	go func() {
		res, err := run(lctx, launcher.Options{
			BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc, ID: id,
			Secrets: secrets, Stdin: inR, Stdout: outW, Stderr: p.stderr, Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.Roots,
		})
		outW.Close()
		inR.Close()
		p.result = result{res, err}
		close(p.done)
	}()
	tb.Cleanup(func() {
		inW.Close()
		cancel()
		<-p.done
		_ = launcher.RemoveHibernation(sc.State, id)
	})
	return p
}

// benchID is a container id of its own per run, so a run killed part way
// leaves nothing a later one collides with.
func benchID(prefix string) string {
	return fmt.Sprintf("pb-%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// duSize is the total size of the regular files beneath dir, for the log.
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
