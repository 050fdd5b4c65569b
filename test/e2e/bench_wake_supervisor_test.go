package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/runtime/supervisor"
)

// BenchmarkPiWakeThroughSupervisor (make bench-pi, section 4) times a wake
// as the daemon sees it: a hibernated warm Pi, then `attach` (which wakes
// it: the supervisor resolves the secrets, the holder runs launcher.Wake)
// → `write` of a get_state → its response among the output events. Pi is
// created once through an in-process supervisor (network sandbox, the e2e
// scene, as BenchmarkPiWakeFirstResponse) and answers get_state; before
// every sample it is hibernated again (`hibernate`, untimed). The script
// compares the median with the host start, the sandboxed cold start and
// launcher.Wake alone (the supervisor's and the holder's share).
func BenchmarkPiWakeThroughSupervisor(b *testing.B) {
	e := newBenchEnv(b)
	sc := e.benchScene(b)
	socket := e.startSupervisor(b, sc)
	d := &benchDaemon{b: b}
	d.cl = dialSupervisor(b, socket)
	var in supervisor.Info
	d.call(supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts}, &in)
	d.id = in.Sandbox
	b.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = d.cl.Call(c, supervisor.Request{Op: "delete", Sandbox: d.id}, nil)
	})
	d.attach()
	d.getState()
	var total time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		var hib supervisor.Info
		d.call(supervisor.Request{Op: "hibernate", Sandbox: d.id}, &hib)
		if hib.Status != supervisor.StatusHibernated {
			b.Fatalf("hibernate answered %+v", hib)
		}
		b.StartTimer()
		start := time.Now()
		d.attach() // wakes it
		d.getState()
		total += time.Since(start)
		n++
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "first-response-ns")
}

// benchDaemon is the benchmark's daemon connection to one sandbox.
type benchDaemon struct {
	b     *testing.B
	cl    *supervisor.Client
	id    string
	epoch uint64
	tr    supervisor.Transcript
	n     int
}

func (d *benchDaemon) call(req supervisor.Request, out any) {
	d.b.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.cl.Call(c, req, out); err != nil {
		d.b.Fatalf("%s: %v", req.Op, err)
	}
}

// attach attaches from the last record seen, so nothing is replayed.
func (d *benchDaemon) attach() {
	d.b.Helper()
	var att struct{ Epoch uint64 }
	d.call(supervisor.Request{Op: "attach", Sandbox: d.id, Cursor: d.tr.Cursor}, &att)
	d.epoch = att.Epoch
}

// getState writes a get_state and reads output events until its response.
func (d *benchDaemon) getState() {
	d.b.Helper()
	d.n++
	id := fmt.Sprintf("gs-%d", d.n)
	from := d.tr.Stdout.Len()
	d.call(supervisor.Request{Op: "write", Sandbox: d.id, Epoch: d.epoch, InputID: "in-" + id,
		Data: []byte(`{"id":"` + id + `","type":"get_state"}` + "\n")}, nil)
	deadline := time.After(90 * time.Second)
	for !strings.Contains(d.tr.Stdout.String()[from:], `"id":"`+id+`"`) {
		select {
		case ev, ok := <-d.cl.Events:
			if !ok {
				d.b.Fatal("the supervisor connection ended")
			}
			if ev.Event != "output" || ev.Seq <= d.tr.Cursor {
				// A superseded attachment's "detached", or a record it
				// delivered that the new attachment replays.
				continue
			}
			if err := d.tr.Add(ev); err != nil {
				d.b.Fatal(err)
			}
		case <-deadline:
			d.b.Fatalf("no response to %s: %q", id, d.tr.Stdout.String()[from:])
		}
	}
	if out := d.tr.Stdout.String()[from:]; !strings.Contains(out, "fake-1") {
		d.b.Fatalf("get_state answered %q", out)
	}
}
