// Command bindracer is the daemon user's side of the bind-source race in
// the acceptance proof (outside_binds_test.go). Started as the daemon's
// uid with its workspace root open on descriptor 3, it swaps the workspace
// (name -a) with a symlink to a host directory outside every root (name
// -b, created here) by renameat2(RENAME_EXCHANGE), either in a loop until
// stdin ends (-mode free) or once per "arm" line on stdin, as soon as a new
// mount appears beneath -watch (ending in -suffix) in its own
// /proc/self/mountinfo (-mode timed: it answers "armed" once it has counted
// the mounts already there, then "fired"; "restore" swaps back). It always
// leaves the workspace in place.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const dirFD = 3

func main() {
	mode := flag.String("mode", "free", "free | timed")
	a := flag.String("a", "", "the workspace's name in the root")
	b := flag.String("b", "", "the symlink's name in the root")
	target := flag.String("target", "", "where the symlink points")
	watch := flag.String("watch", "", "timed: fire when a mount appears beneath this path")
	suffix := flag.String("suffix", "", "timed: count only mount points ending in this")
	flag.Parse()
	if err := unix.Symlinkat(*target, dirFD, *b); err != nil && err != unix.EEXIST {
		fail("symlink: %v", err)
	}
	swapped := false
	exchange := func() {
		if err := unix.Renameat2(dirFD, *a, dirFD, *b, unix.RENAME_EXCHANGE); err != nil {
			fail("renameat2: %v", err)
		}
		swapped = !swapped
	}
	defer func() {
		if swapped {
			exchange()
		}
	}()
	switch *mode {
	case "free":
		done := make(chan struct{})
		go func() {
			_, _ = bufio.NewReader(os.Stdin).ReadString(0)
			close(done)
		}()
		n := 0
		for {
			select {
			case <-done:
				if swapped {
					exchange()
				}
				fmt.Printf("exchanges %d\n", n)
				return
			default:
				exchange()
				n++
			}
		}
	case "timed":
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			switch in.Text() {
			case "arm":
				before := mountsBeneath(*watch, *suffix)
				// The caller launches only once the baseline is taken: a
				// mount that came before it would never be seen as new.
				fmt.Println("armed")
				deadline := time.Now().Add(20 * time.Second)
				for mountsBeneath(*watch, *suffix) <= before && time.Now().Before(deadline) {
				}
				if time.Now().After(deadline) {
					fmt.Println("timeout") // the launch mounted nothing
					continue
				}
				exchange()
				fmt.Println("fired")
			case "restore":
				if swapped {
					exchange()
				}
				fmt.Println("restored")
			}
		}
		if swapped {
			exchange()
		}
	default:
		fail("unknown mode %q", *mode)
	}
}

// mountsBeneath counts mount points beneath dir that end in suffix.
func mountsBeneath(dir, suffix string) int {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		fail("mountinfo: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") && strings.HasSuffix(f[4], suffix) {
			n++
		}
	}
	return n
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bindracer: "+format+"\n", args...)
	os.Exit(1)
}
