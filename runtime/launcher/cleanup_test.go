package launcher

import (
	"slices"
	"testing"
)

func TestCleanupStackRunsInReverseOnce(t *testing.T) {
	var got []string
	var c cleanupStack
	for _, name := range []string{"record", "run dir", "network", "proxy"} {
		c.push(func() { got = append(got, name) })
	}
	c.run()
	c.run() // a second run has nothing left to undo
	if want := []string{"proxy", "network", "run dir", "record"}; !slices.Equal(got, want) {
		t.Errorf("undo order %v, want %v", got, want)
	}
}

func TestCleanupStackPushDuringRun(t *testing.T) {
	// An undo that arms another (it should not, but the stack stays sound):
	// the new one runs next, before the older ones.
	var got []string
	var c cleanupStack
	c.push(func() { got = append(got, "first") })
	c.push(func() {
		got = append(got, "second")
		c.push(func() { got = append(got, "late") })
	})
	c.run()
	if want := []string{"second", "late", "first"}; !slices.Equal(got, want) {
		t.Errorf("undo order %v, want %v", got, want)
	}
}

func TestCleanupStackRelease(t *testing.T) {
	var got []string
	var c cleanupStack
	c.push(func() { got = append(got, "a") })
	c.push(func() { got = append(got, "b") })
	kept := c.release()
	c.run()
	if len(got) != 0 {
		t.Fatalf("a released stack undid %v", got)
	}
	c.push(func() { got = append(got, "after release") })
	c.run()
	kept.run()
	if want := []string{"after release", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("undo order %v, want %v", got, want)
	}
}
