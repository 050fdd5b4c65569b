package launcher

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// step returns an undo that appends name to got and returns err.
func step(got *[]string, name string, err error) func() error {
	return func() error {
		*got = append(*got, name)
		return err
	}
}

func TestCleanupStackRunsInReverseOnce(t *testing.T) {
	var got []string
	var c cleanupStack
	for _, name := range []string{"record", "run dir", "network", "proxy"} {
		c.push(name, step(&got, name, nil))
	}
	if failed := c.run(); len(failed) != 0 {
		t.Errorf("failures %v, want none", failed)
	}
	c.run() // a second run has nothing left to undo
	if want := []string{"proxy", "network", "run dir", "record"}; !slices.Equal(got, want) {
		t.Errorf("undo order %v, want %v", got, want)
	}
}

// A failed undo does not stop the ones after it (gVisor's Destroy): every
// step runs, and every failure comes back, named by its step, in order.
func TestCleanupStackRunsEveryStepAndReportsEveryFailure(t *testing.T) {
	var got []string
	var c cleanupStack
	c.push("record", func() error {
		got = append(got, "record")
		if want := []UndoFailure{{Step: "network", Error: "busy"}, {Step: "run dir", Error: "mounted"}}; !slices.Equal(c.failures(), want) {
			t.Errorf("the last undo saw failures %v, want %v", c.failures(), want)
		}
		return nil
	})
	c.push("run dir", step(&got, "run dir", errors.New("mounted")))
	c.push("network", step(&got, "network", errors.New("busy")))
	c.push("proxy", step(&got, "proxy", nil))
	failed := c.run()
	if want := []string{"proxy", "network", "run dir", "record"}; !slices.Equal(got, want) {
		t.Errorf("undo order %v, want %v: a failure stopped the steps after it", got, want)
	}
	want := []UndoFailure{{Step: "network", Error: "busy"}, {Step: "run dir", Error: "mounted"}}
	if diff := cmp.Diff(want, failed); diff != "" {
		t.Errorf("failures (-want +got):\n%s", diff)
	}
	var log bytes.Buffer
	logFailures(&log, "pp-x", failed)
	if lines := strings.Split(strings.TrimSpace(log.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[0], "pp-x") || !strings.Contains(lines[1], "run dir: mounted") {
		t.Errorf("log %q, want one line per failure naming the sandbox and the step", log.String())
	}
}

// The test seam fails a step without running it, as an undo that could
// not undo leaves its resource; the other steps run.
func TestCleanupStackFault(t *testing.T) {
	var got []string
	c := cleanupStack{fault: func(step string) error {
		if step == "network" {
			return errors.New("injected")
		}
		return nil
	}}
	c.push("run dir", step(&got, "run dir", nil))
	c.push("network", step(&got, "network", nil))
	c.push("proxy", step(&got, "proxy", nil))
	c.note("not an undo", nil)
	failed := c.run()
	if want := []string{"proxy", "run dir"}; !slices.Equal(got, want) {
		t.Errorf("steps run %v, want %v", got, want)
	}
	if want := []UndoFailure{{Step: "network", Error: "injected"}}; !slices.Equal(failed, want) {
		t.Errorf("failures %v, want %v", failed, want)
	}
}

func TestCleanupStackPushDuringRun(t *testing.T) {
	// An undo that arms another (it should not, but the stack stays sound):
	// the new one runs next, before the older ones.
	var got []string
	var c cleanupStack
	c.push("first", step(&got, "first", nil))
	c.push("second", func() error {
		got = append(got, "second")
		c.push("late", step(&got, "late", nil))
		return nil
	})
	c.run()
	if want := []string{"second", "late", "first"}; !slices.Equal(got, want) {
		t.Errorf("undo order %v, want %v", got, want)
	}
}
