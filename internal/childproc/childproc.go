// Package childproc starts child processes whose parent-death signal must
// mean what it says: "the launcher (or adapter) that owns me is gone".
package childproc

import (
	"os/exec"
	"runtime"
)

// Start starts cmd from an OS thread that stays locked to one goroutine,
// and so alive, until cmd has been waited for; the returned channel gets
// Wait's result.
//
// Linux sends a child its parent-death signal (SysProcAttr.Pdeathsig) when
// the thread that forked it exits, not when the process does (prctl(2)).
// The Go runtime ends an OS thread when a goroutine that locked it returns
// without unlocking, which internal/nsutil does on purpose after changing
// a thread's namespace. A goroutine of that kind scheduled onto the thread
// that forked runsc killed runsc mid-run (TestLaunchSandboxNetwork: the
// sandbox ended after a second with exit 137 and no reason, a few runs in
// ten under load). A locked thread runs no other goroutine, so nothing can
// end it before the child is reaped.
func Start(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}
