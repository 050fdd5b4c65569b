package cli

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// systemd's socket activation as supervise reads it: fd 3 when LISTEN_PID
// is this process and LISTEN_FDS is 1, the environment cleared and fd 3
// closed once the listener holds its own copy (holders must not inherit
// it); another count is refused; without LISTEN_PID nothing is taken.
func TestActivatedSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct{ fds, pid, want string }{
		{"1", "$$", "listener " + socket + " fd3 closed env clear"},
		{"2", "$$", "error"},
		{"1", "1", "none"},
	} {
		// sh sets LISTEN_PID to its own pid and execs the test binary, as
		// systemd sets it for the process it starts.
		cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`LISTEN_PID=%s LISTEN_FDS=%s exec "$0" -test.run='^TestHelperActivatedSocket$'`, tc.pid, tc.fds), os.Args[0])
		cmd.Env = append(os.Environ(), "PASEO_CLI_ACTIVATION_HELPER=1")
		cmd.ExtraFiles = []*os.File{f}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("LISTEN_FDS=%s: %v\n%s", tc.fds, err, out)
		}
		if !strings.Contains(string(out), "activation: "+tc.want+"\n") {
			t.Errorf("LISTEN_FDS=%s LISTEN_PID=%s: %s, want %q", tc.fds, tc.pid, out, tc.want)
		}
	}
}

func TestHelperActivatedSocket(t *testing.T) {
	if os.Getenv("PASEO_CLI_ACTIVATION_HELPER") == "" {
		return
	}
	ln, err := activatedSocket()
	switch {
	case err != nil:
		fmt.Println("activation: error")
	case ln == nil:
		fmt.Println("activation: none")
	default:
		defer ln.Close()
		_, ferr := unix.FcntlInt(3, unix.F_GETFD, 0)
		state := "fd3 open"
		if ferr == unix.EBADF {
			state = "fd3 closed"
		}
		env := "env clear"
		if os.Getenv("LISTEN_FDS") != "" || os.Getenv("LISTEN_PID") != "" {
			env = "env kept"
		}
		fmt.Printf("activation: listener %s %s %s\n", ln.Addr(), state, env)
	}
}
