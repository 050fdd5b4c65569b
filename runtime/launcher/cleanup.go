package launcher

// cleanupStack undoes a launch's resources in the reverse of the order
// they were made, in the manner of gVisor's pkg/cleanup as runsc/container
// uses it: each step pushes the undo of what it just made, so a failure at
// any point leaves exactly the made resources to undo, and teardown order
// is the stack's order rather than an order of defers spread over one
// function. release disarms the stack and hands its undos to the caller,
// for resources that must outlive the function that made them.
type cleanupStack struct {
	undo []func()
}

// push arms f; it runs before everything pushed earlier.
func (c *cleanupStack) push(f func()) { c.undo = append(c.undo, f) }

// run undoes everything still armed, last pushed first, and disarms it.
func (c *cleanupStack) run() {
	for len(c.undo) > 0 {
		f := c.undo[len(c.undo)-1]
		c.undo = c.undo[:len(c.undo)-1]
		f()
	}
}

// release disarms the stack: run does nothing afterwards, and the caller
// now owns the returned stack.
func (c *cleanupStack) release() *cleanupStack {
	kept := &cleanupStack{undo: c.undo}
	c.undo = nil
	return kept
}
