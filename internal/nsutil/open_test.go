package nsutil

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/skip"
)

func init() {
	// Keep the main goroutine on the main thread until TestMain has moved
	// that thread into a namespace of its own.
	runtime.LockOSThread()
}

// wedged says whether TestMain left the main thread in a new network
// namespace, as a goroutine that entered one and ended locked to it does
// (Go wedges the main thread instead of ending it).
var wedged error

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		wedged = unix.Unshare(unix.CLONE_NEWNET)
	} else {
		wedged = fmt.Errorf("not root")
	}
	// The main thread stays locked to this goroutine: no test runs on it.
	os.Exit(m.Run())
}

// The launcher's own namespace is the one its goroutines run in, not the
// main thread's: with the main thread elsewhere, Open("") still names the
// process's namespace. Control: /proc/self/ns/net names the main
// thread's, which is not it.
func TestOpenOwnNamespaceIsNotTheMainThreads(t *testing.T) {
	skip.UnlessRoot(t, "it moves the main thread into a network namespace of its own")
	if wedged != nil {
		t.Fatalf("moving the main thread: %v", wedged)
	}
	runtime.LockOSThread()
	own, err := os.Readlink("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	mainNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if mainNS == own {
		t.Fatalf("control: the main thread is in %s, the goroutines' namespace too: nothing to tell apart", own)
	}
	fd, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	got, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	if got != own {
		t.Fatalf("Open(\"\") is %s, the main thread's (%s); want the process's %s", got, mainNS, own)
	}
}
