package nativesearch

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
)

// serveJail serves f's jail on a loopback listener for peer; the jail's
// workspace is mounted at its host path, so the client runs on the host
// in the same directory the jail searches.
func serveJail(t *testing.T, f *jailFixture, peer netip.Addr) (*Server, netip.AddrPort) {
	t.Helper()
	f.j.Dest = f.ws
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := Serve(f.j, ln, peer)
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().(*net.TCPAddr).AddrPort()
}

// TestServerRefusesOtherAddresses: a request from any address but the
// sandbox's is closed unanswered. Control: the same request from the
// sandbox's address is answered.
func TestServerRefusesOtherAddresses(t *testing.T) {
	f := newJail(t)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.2"))
	req := Request{Cwd: ".", Pattern: pat("func "), Options: []Option{{Name: "count"}}}.Encode()
	ask := func(from string) string {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(req)
		c.(*net.TCPConn).CloseWrite()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if got := ask("127.0.0.2"); !strings.HasPrefix(got, magic+" ok 0 ") || !strings.Contains(got, "a.go:1") {
		t.Fatalf("control: from the sandbox's address: %q", got)
	}
	if got := ask("127.0.0.1"); got != "" {
		t.Errorf("from another address: answered %q", got)
	}
	if st := s.Stats(); st.Answered != 1 || st.Refused != 1 {
		t.Errorf("stats %+v", st)
	}
}

// runClient runs the Perl client on the host in dir with args; the rg it
// falls back to is the image's (as /usr/bin/rg is in the sandbox).
func runClient(t *testing.T, f jailFixture, addr netip.AddrPort, dir string, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "rg")
	if err := os.WriteFile(script, bundle.SearchClientFor(addr.Addr().String(), int(addr.Port()), f.ws, f.rg), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/perl", append([]string{script}, args...)...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, []string{}, stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// TestClientSameAsRg: the client's output and exit code are rg's for
// what it forwards (Pi's grep tool's argv among them) and for what it
// does not (run by the sandbox's own rg); the server counts which.
func TestClientSameAsRg(t *testing.T) {
	f := newJail(t)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	// A link given as a path: the sandbox's rg follows it wherever it
	// leads, so the sandbox's rg answers (the jail would find nothing).
	if err := os.Symlink(f.secret, filepath.Join(f.ws, "outlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(f.ws, "sublink")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args    []string
		dir     string
		forward bool
	}{
		{[]string{"-c", "func ", "."}, "", true},
		{[]string{"-c", "func "}, "", true},
		{[]string{"--no-config", "--line-number", "--color=never", "--hidden", "--glob", "*.go", "--", "func [A-C]", "."}, "", true},
		{[]string{"-n", "-i", "-w", "FUNC", "sub"}, "", true},
		{[]string{"-l", "-e", "B", "-e", "D", "--hidden"}, "", true},
		{[]string{"-C1", "-tgo", "func", "./sub/"}, "", true},
		{[]string{"--files", "--sort", "path"}, "sub", true},
		{[]string{"-c", "func", "b.go"}, "sub", true},
		{[]string{"zzz-none"}, "", true},
		{[]string{"-c", "func", "missing-file"}, "", true},
		{[]string{"--follow", "-c", "func"}, "", false},
		{[]string{"-c", "func", "../ws"}, "sub", false},
		{[]string{"--version"}, "", false},
		{[]string{"-c", "func", "outlink"}, "", false},
		{[]string{"-c", "func", "sublink/b.go"}, "", false},
		{[]string{"-c", "func"}, "sublink", true}, // the client's cwd is the physical one
		{[]string{"-z", "func"}, "", false},
	} {
		before := s.Stats().Answered
		dir := filepath.Join(f.ws, tc.dir)
		out, errs, code := runClient(t, f, addr, dir, nil, tc.args...)
		want, wcode := f.hostRg(t, dir, tc.args...)
		if code != wcode || !slices.Equal(sortedLines(out), sortedLines(want)) {
			t.Errorf("rg %q: client exit %d\n%s(stderr %s)\nrg exit %d\n%s", tc.args, code, out, errs, wcode, want)
		}
		if forwarded := s.Stats().Answered > before; forwarded != tc.forward {
			t.Errorf("rg %q: forwarded %v, want %v", tc.args, forwarded, tc.forward)
		}
	}
	// rg reads a piped stdin when it is given no path: the sandbox's rg
	// answers that.
	before := s.Stats().Answered
	out, _, code := runClient(t, f, addr, f.ws, strings.NewReader("func from stdin\n"), "func")
	if out != "func from stdin\n" || code != 0 || s.Stats().Answered != before {
		t.Errorf("stdin: exit %d %q, answered %d", code, out, s.Stats().Answered-before)
	}
}

// TestClientFallsBackWithoutServer: nothing listening, the client runs
// the sandbox's rg: the same answer.
func TestClientFallsBackWithoutServer(t *testing.T) {
	f := newJail(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	out, _, code := runClient(t, f, addr, f.ws, nil, "-c", "func", "sub")
	want, wcode := f.hostRg(t, f.ws, "-c", "func", "sub")
	if out != want || code != wcode {
		t.Errorf("client %d %q, rg %d %q", code, out, wcode, want)
	}
}
