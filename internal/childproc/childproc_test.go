package childproc

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var errMainThread = errors.New("on the main thread")

func sleeper() *exec.Cmd {
	cmd := exec.Command("/bin/sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// The control: a child forked from a thread that then ends (what a
// goroutine that locks its thread and returns does) gets its parent-death
// signal although the process lives on.
func TestThreadExitKillsAChildStartedOnIt(t *testing.T) {
	cmd := sleeper()
	// The runtime never ends the process's main thread (it parks it
	// instead), so the fork must happen on another one.
	for forked := false; !forked; {
		started := make(chan error)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if unix.Gettid() == unix.Getpid() {
				started <- errMainThread
				return
			}
			started <- cmd.Start()
		}()
		switch err := <-started; err {
		case nil:
			forked = true
		case errMainThread:
		default:
			t.Fatal(err)
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("child ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the child outlived the thread that forked it: Pdeathsig no longer follows threads, and this package is not needed")
	}
}

// Start keeps the child alive however many threads the runtime ends
// meanwhile (each goroutine below ends its thread, as internal/nsutil's do).
func TestStartSurvivesThreadExits(t *testing.T) {
	cmd := sleeper()
	waited, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(done)
		}()
		<-done
		runtime.Gosched()
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-waited:
		t.Fatalf("the child died while other threads ended: %v", err)
	default:
	}
	_ = cmd.Process.Kill()
	if err := <-waited; err == nil {
		t.Fatal("a killed child reported success")
	}
}
