package launcher

import (
	"fmt"
	"io"
	"slices"

	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// cleanupStack undoes a launch's resources in the reverse of the order
// they were made, in the manner of gVisor's pkg/cleanup as runsc/container
// uses it: each step pushes the undo of what it just made, so a failure at
// any point leaves exactly the made resources to undo, and teardown order
// is the stack's order rather than an order of defers spread over one
// function.
//
// Undos return their errors, and run goes on past a failed one, as
// gVisor's Container.Destroy does: one undo that fails (a busy cgroup)
// must not leave the later ones (the network, the run dir) behind too.
// Every failure is kept, named by its step, for the caller to report.
type cleanupStack struct {
	undo   []undoStep
	failed []UndoFailure
	// fault, in tests, fails the step it names (the step does not run):
	// how a test shows that later steps still run and every failure is
	// reported, without breaking runsc or the kernel for real.
	fault func(step string) error
}

type undoStep struct {
	step string
	f    func() error
}

// UndoFailure is one teardown step that failed (Result.Teardown); the
// record keeps the same list when the launch ends with failures, so the
// type is the state root's.
type UndoFailure = statedir.UndoFailure

// push arms f, the undo of step; it runs before everything pushed earlier.
func (c *cleanupStack) push(step string, f func() error) {
	c.undo = append(c.undo, undoStep{step: step, f: f})
}

// run undoes everything still armed, last pushed first, and disarms it.
// Every undo runs, whatever failed before it; run returns every failure
// so far (noted ones too), in the order they happened.
func (c *cleanupStack) run() []UndoFailure {
	for len(c.undo) > 0 {
		u := c.undo[len(c.undo)-1]
		c.undo = c.undo[:len(c.undo)-1]
		var err error
		if c.fault != nil {
			err = c.fault(u.step)
		}
		if err == nil {
			err = u.f()
		}
		if err != nil {
			c.failed = append(c.failed, UndoFailure{Step: u.step, Error: err.Error()})
		}
	}
	return slices.Clone(c.failed)
}

// note records a failed step that is not an undo on the stack (nil:
// nothing failed): it is reported with the undos' failures.
func (c *cleanupStack) note(step string, err error) {
	if err != nil {
		c.failed = append(c.failed, UndoFailure{Step: step, Error: err.Error()})
	}
}

// failures are the undos that failed so far: the record's undo, which
// runs last, keeps the record when there are any.
func (c *cleanupStack) failures() []UndoFailure { return c.failed }

// logFailures writes one line per failure: the launcher's own diagnostics,
// never the agent's output streams.
func logFailures(w io.Writer, id string, fs []UndoFailure) {
	for _, f := range fs {
		fmt.Fprintf(w, "paseo-policy: sandbox %s: teardown: %s\n", id, f)
	}
}
