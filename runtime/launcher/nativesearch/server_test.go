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
	f.spool = filepath.Join(t.TempDir(), "spool")
	spool, err := os.OpenFile(f.spool, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	s := Serve(f.j, ln, peer, spool)
	t.Cleanup(func() { s.Close(); spool.Close() })
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

// runClient runs the Perl client as rg on the host in dir with args; the
// rg it falls back to is the image's (as /usr/bin/rg is in the sandbox).
func runClient(t *testing.T, f jailFixture, addr netip.AddrPort, dir string, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	return runClientAs(t, f, addr, "rg", dir, stdin, nil, args...)
}

// runClientAs runs the client installed as name (one of bundle.SearchClientNames), with an
// empty HOME and env added.
func runClientAs(t *testing.T, f jailFixture, addr netip.AddrPort, name, dir string, stdin io.Reader, env []string, args ...string) (string, string, int) {
	t.Helper()
	tmp := t.TempDir()
	script := filepath.Join(tmp, name)
	real := map[string]string{"rg": f.rg, "fd": f.bin(Fd), "find": f.bin(Find), "cat": f.bin(Cat)}
	if err := os.WriteFile(script, bundle.SearchClientFor(addr.Addr().String(), int(addr.Port()), f.ws, real, f.spool), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/perl", append([]string{script}, args...)...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, append([]string{"HOME=" + tmp}, env...), stdin
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

// TestClientSameAsFdAndFind: installed as fd and as find, the client's
// output and exit code are the image's fd's and find's, for what it
// forwards (Pi's find tool's argv among them) and for what it does not
// (run by the sandbox's own binary); the server counts which.
func TestClientSameAsFdAndFind(t *testing.T) {
	f := newJail(t)
	listingTree(t, f)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	if err := os.Symlink(f.secret, filepath.Join(f.ws, "outlink")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tool    Tool
		args    []string
		dir     string
		env     []string
		forward bool
	}{
		{Fd, []string{"-e", "go"}, "", nil, true},
		{Fd, []string{}, "", nil, true},
		{Fd, []string{"-HI", "-tf"}, "", nil, true},
		{Fd, []string{"--color=never", "--hidden", "--glob", "--max-results", "1001", "--", "*.go", f.ws}, "", nil, true},
		{Fd, []string{"--color=never", "--hidden", "--glob", "--max-results", "1001", "--full-path", "--ignore-case", "--", f.ws + "/sub/**/*.GO", f.ws}, "", nil, true},
		{Fd, []string{"--color", "never", "-d2", "b", "sub"}, "", nil, true},
		{Fd, []string{"-E", "*.go", "-td"}, "sub", nil, true},
		{Fd, []string{"-0", "go$"}, "", nil, true},
		{Fd, []string{"x", "no-such-dir"}, "", nil, true},
		{Fd, []string{"--version"}, "", nil, false},
		{Fd, []string{"-L", "key"}, "", nil, false},
		{Fd, []string{"-x", "echo", ";", "a.go"}, "", nil, false},
		{Fd, []string{"-l", "a.go"}, "", nil, false},
		{Fd, []string{"key", "outlink"}, "", nil, false},
		{Fd, []string{"b", "../sub"}, "sub", nil, false},
		{Find, []string{".", "-name", "*.go"}, "", nil, true},
		{Find, []string{}, "", nil, true},
		{Find, []string{"-P", ".", "-path", "./.git", "-prune", "-o", "-type", "f", "-print"}, "", nil, true},
		{Find, []string{"sub", "empty", "(", "-size", "+1k", "-o", "-empty", ")"}, "", nil, true},
		{Find, []string{f.ws + "/sub", "-iname", "*.GO", "-print0"}, "sub", []string{"LANG=C.UTF-8"}, true},
		{Find, []string{".", "-name", "-delete"}, "", nil, true}, // a name, not the action
		{Find, []string{"no-such"}, "", nil, true},
		{Find, []string{".", "-name", "a.go", "-exec", "echo", "{}", ";"}, "", nil, false},
		{Find, []string{"-L", ".", "-name", "a.go"}, "", nil, false},
		{Find, []string{".", "-name", "a.go", "-printf", "%p\\n"}, "", nil, false},
		{Find, []string{"outlink/"}, "", nil, false},
		{Find, []string{".", "-name", "*.go"}, "", []string{"LANG=de_DE.UTF-8"}, false},
		{Find, []string{".", "-name", "*.go"}, "", []string{"LC_COLLATE=C.UTF-8"}, false},
	} {
		before := s.Stats().Answered
		dir := filepath.Join(f.ws, tc.dir)
		out, errs, code := runClientAs(t, f, addr, string(tc.tool), dir, nil, tc.env, tc.args...)
		want, wcode := f.hostTool(t, tc.tool, dir, tc.args...)
		if code != wcode || !slices.Equal(sortedLines(out), sortedLines(want)) {
			t.Errorf("%s %q: client exit %d\n%s(stderr %s)\n%s exit %d\n%s", tc.tool, tc.args, code, out, errs, tc.tool, wcode, want)
		}
		if forwarded := s.Stats().Answered > before; forwarded != tc.forward {
			t.Errorf("%s %q: forwarded %v, want %v", tc.tool, tc.args, forwarded, tc.forward)
		}
	}
	// A global ignore file of the user's (the jail has no HOME): the
	// sandbox's fd answers.
	home := t.TempDir()
	write(t, filepath.Join(home, ".config", "fd", "ignore"), "*.go\n")
	before := s.Stats().Answered
	out, _, _ := runClientAs(t, f, addr, "fd", f.ws, nil, []string{"XDG_CONFIG_HOME=" + filepath.Join(home, ".config")})
	if s.Stats().Answered != before || strings.Contains(out, ".go") {
		t.Errorf("fd with a global ignore file: answered %d, output %q", s.Stats().Answered-before, out)
	}
}
