package probe

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Resource probes. Each is an escape when it completes: the sandbox is
// expected to make it fail (an errno) or to kill the whole sandbox, in
// which case no report is printed and the harness judges the kill. They
// write progress to stderr first, so a kill shows how far they got.

// ChildFlag is the hidden first argument that turns the binary into a
// fork-bomb child: it sleeps and exits. It is read before flag parsing and
// kept out of the usage text.
const ChildFlag = "-child-sleep"

// childLife bounds a fork-bomb child's sleep, so a child the parent failed
// to reap (and whose death signal was lost) still goes away on its own.
const childLife = 10 * time.Minute

// MaybeChild runs the fork-bomb child mode when args (os.Args) ask for it
// and then exits; otherwise it returns. Both the command and the tests call
// it first thing, because fork-bomb re-executes whichever binary it is in.
func MaybeChild(args []string) {
	if len(args) < 2 || args[1] != ChildFlag {
		return
	}
	d := childLife
	if len(args) > 2 {
		if v, err := time.ParseDuration(args[2]); err == nil {
			d = v
		}
	}
	time.Sleep(d)
	os.Exit(0)
}

// mib formats a byte count for evidence.
func mib(n int64) string {
	if n >= 1<<20 {
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// forkBomb re-executes the binary as sleeping children until n are alive
// or spawning fails. Escaped means n children ran: no process limit. The
// children are always killed and reaped before returning. syscall.ForkExec
// rather than os/exec: os/exec holds a pidfd per child, so a nofile limit
// would end the loop and be mistaken for a process limit.
func forkBomb(ctx context.Context, n int) outcome {
	exe, err := os.Executable()
	if err != nil {
		return outcome{Inconclusive, "cannot find own executable: " + errText(err)}
	}
	// Pdeathsig fires when the creating thread exits; pinning the spawn
	// loop to one thread that outlives it keeps the children tied to a
	// live parent thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := &syscall.ProcAttr{
		Env: []string{"GOMAXPROCS=1"}, // fewer threads per child
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	if null, err := os.Open(os.DevNull); err == nil {
		defer null.Close()
		attr.Files = []uintptr{null.Fd(), null.Fd(), null.Fd()}
	}
	argv := []string{exe, ChildFlag, childLife.String()}
	var pids []int
	defer func() { reapAll(pids) }()
	for len(pids) < n {
		if ctx.Err() != nil {
			return outcome{Inconclusive, fmt.Sprintf("started %d of %d children before the deadline without hitting a limit", len(pids), n)}
		}
		pid, err := syscall.ForkExec(exe, argv, attr)
		if err != nil {
			return outcome{Blocked, fmt.Sprintf("spawning child %d of %d failed: %s", len(pids)+1, n, errText(err))}
		}
		pids = append(pids, pid)
	}
	// Under a task limit that counts threads, a child may be created and
	// then die when its runtime cannot start threads; give that a moment.
	time.Sleep(200 * time.Millisecond)
	if died := reapExited(pids); died > 0 {
		return outcome{Blocked, fmt.Sprintf("started %d children but %d died at once (thread limit)", n, died)}
	}
	return outcome{Escaped, fmt.Sprintf("started and held %d of %d children", n, n)}
}

// reapExited reaps the children that already exited, zeroing their pids,
// and returns how many there were.
func reapExited(pids []int) int {
	died := 0
	for i, pid := range pids {
		var ws unix.WaitStatus
		if wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && wpid == pid {
			pids[i] = 0
			died++
		}
	}
	return died
}

// reapAll kills every remaining child, then waits for each: kill first so
// they die in parallel.
func reapAll(pids []int) {
	for _, pid := range pids {
		if pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
	for _, pid := range pids {
		if pid > 0 {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, 0, nil)
		}
	}
}

// memChunk is the allocation step: big enough to be quick, small enough
// that progress lines show where a memory limit struck.
const memChunk = 64 << 20

// memHog maps anonymous memory in chunks and touches every page, so the
// memory is really committed. mmap rather than make: a Go allocation
// failure kills the process without an errno to report. Everything is
// unmapped before returning.
func memHog(ctx context.Context, size int64, w io.Writer) outcome {
	page := os.Getpagesize()
	var maps [][]byte
	defer func() {
		for _, m := range maps {
			unix.Munmap(m)
		}
	}()
	fmt.Fprintf(w, "paseo-probe: mem-hog: allocating %s\n", mib(size))
	var done int64
	for done < size {
		if ctx.Err() != nil {
			return outcome{Inconclusive, fmt.Sprintf("touched %s of %s before the deadline", mib(done), mib(size))}
		}
		n := min(memChunk, size-done)
		m, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return outcome{Blocked, fmt.Sprintf("mmap failed after %s: %s", mib(done), errText(err))}
		}
		maps = append(maps, m)
		for i := 0; i < len(m); i += page {
			m[i] = 1
		}
		done += n
		fmt.Fprintf(w, "paseo-probe: mem-hog: touched %s of %s\n", mib(done), mib(size))
	}
	return outcome{Escaped, "allocated and touched " + mib(size)}
}

// outputFlood writes size bytes to w (stderr; stdout carries the report).
// SIGPIPE is caught for the duration: otherwise a launcher that closes the
// pipe at its output limit would kill the probe silently instead of
// letting it report EPIPE.
func outputFlood(ctx context.Context, size int64, w io.Writer) outcome {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGPIPE)
	defer signal.Stop(sig)
	buf := bytes.Repeat([]byte("paseo-probe output flood: this line repeats until the limit\n"), 1024)
	var written int64
	for written < size {
		if ctx.Err() != nil {
			return outcome{Inconclusive, fmt.Sprintf("wrote %d of %d bytes before the deadline", written, size)}
		}
		k, err := w.Write(buf[:min(int64(len(buf)), size-written)])
		written += int64(k)
		if err != nil {
			return outcome{Blocked, fmt.Sprintf("write failed after %d bytes: %s", written, errText(err))}
		}
	}
	return outcome{Escaped, fmt.Sprintf("wrote %d bytes to stderr", written)}
}

// sleepPastWall sleeps d, meant to be longer than the sandbox's wall-time
// limit; returning at all is the escape.
func sleepPastWall(ctx context.Context, d time.Duration, w io.Writer) outcome {
	fmt.Fprintf(w, "paseo-probe: sleep-past-wall: sleeping %s\n", d)
	select {
	case <-time.After(d):
		return outcome{Escaped, fmt.Sprintf("slept %s and was still running", d)}
	case <-ctx.Done():
		return outcome{Inconclusive, "deadline before the sleep ended"}
	}
}
