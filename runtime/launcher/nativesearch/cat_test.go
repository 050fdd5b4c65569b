package nativesearch

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
)

// catTree adds n files under f's workspace "many/" (one of them empty,
// sizes up to a few KiB, each naming itself) and returns their names,
// relative to the workspace.
func catTree(t *testing.T, f jailFixture, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("many/d%d/f%03d.txt", i%7, i)
		body := strings.Repeat(fmt.Sprintf("%s line\n", name), i%40)
		write(t, filepath.Join(f.ws, name), body)
		names = append(names, name)
	}
	return names
}

// hostCat runs the image's cat on the host in dir, as root and with no
// jail: what the sandbox's cat prints, and the controls' "nothing
// protects".
func (f jailFixture) hostCat(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(f.bin(Cat), args...)
	cmd.Args[0] = "cat"
	cmd.Dir, cmd.Env = dir, []string{}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// TestJailCatLikeCat: the jail's cat prints what the image's cat prints on
// the same files, messages and exit codes too: files, an empty one, a
// missing one, a directory, absolute names, in a subdirectory.
func TestJailCatLikeCat(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, 20)
	for _, tc := range []struct {
		name  string
		cwd   string
		files []string
	}{
		{"files", ".", names},
		{"empty", ".", []string{names[0], names[0]}},
		{"missing", ".", []string{"a.go", "no-such", "notes.md"}},
		{"a directory", ".", []string{"a.go", "sub", "notes.md"}},
		{"absolute", ".", []string{wsDest + "/a.go", wsDest + "/sub/b.go"}},
		{"in a subdirectory", "sub", []string{"b.go", "deep/c.txt"}},
		{"a name like an option", ".", []string{"-n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "a name like an option" {
				write(t, filepath.Join(f.ws, "-n"), "a file named -n\n")
			}
			res, err := f.j.Run(context.Background(), Request{Tool: Cat, Cwd: tc.cwd, Paths: tc.files})
			if err != nil {
				t.Fatal(err)
			}
			var args []string
			for _, p := range tc.files {
				args = append(args, strings.ReplaceAll(p, wsDest, f.ws))
			}
			out, errs, code := f.hostCat(t, filepath.Join(f.ws, tc.cwd), append([]string{"--"}, args...)...)
			if string(res.Stdout) != out || strings.ReplaceAll(string(res.Stderr), wsDest, f.ws) != errs || res.Exit != code {
				t.Errorf("jail: exit %d %q stderr %q\nhost cat: exit %d %q stderr %q", res.Exit, res.Stdout, res.Stderr, code, out, errs)
			}
		})
	}
}

// TestJailCatLinkAndOutside: a link the agent planted to a host file is
// not read: the server answers "fallback" for it (CatFiles), and the
// jail's cat, given it past that check, finds nothing there (its root
// holds the workspace and the image only); a name outside the workspace
// is refused by the request's check. Control: the host's cat follows the
// link to the host file.
func TestJailCatLinkAndOutside(t *testing.T) {
	f := newJail(t)
	if err := os.Symlink(filepath.Join(f.secret, "key"), filepath.Join(f.ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := f.hostCat(t, f.ws, "escape"); !strings.Contains(out, "HOSTSECRET") {
		t.Fatalf("control: the host's cat did not follow the planted link: %q", out)
	}
	if f.j.CatFiles(Request{Tool: Cat, Cwd: ".", Paths: []string{"a.go", "escape"}}) {
		t.Errorf("CatFiles passed a link")
	}
	res := f.runTool(t, Cat, ".", "--", "escape", f.secret+"/key")
	if strings.Contains(string(res.Stdout), "HOSTSECRET") || res.Exit != 1 {
		t.Errorf("the jail's cat read the host file (exit %d): %q", res.Exit, res.Stdout)
	}
	for _, p := range []string{f.secret + "/key", "/etc/passwd", "../x", "sub/../a.go", "sub/", "-"} {
		if _, err := Decode(Request{Tool: Cat, Cwd: ".", Paths: []string{p}}.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("cat %q: %v, want %s", p, err, diag.SearchRequest)
		}
	}
	for _, r := range []Request{
		{Tool: Cat, Cwd: "."},
		{Tool: Cat, Cwd: ".", Paths: []string{"a.go"}, Options: []Option{{Name: "number"}}},
		{Tool: Cat, Cwd: ".", Paths: []string{"a.go"}, Pattern: pat("x")},
		{Tool: Cat, Cwd: ".", Paths: make([]string, maxCatFiles+1)},
	} {
		if err := r.Check(wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("%+v: %v, want %s", r, err, diag.SearchRequest)
		}
	}
}

// TestCatFiles: the server reads outside only what the jail's cat reads as
// the sandbox's would: regular files beneath the workspace, no link on the
// way, readable by the agent's uid and gid by their modes, in directories
// it may search, not beneath a name the sandbox sees through a mount of
// its own. Control: plain files pass.
func TestCatFiles(t *testing.T) {
	f := newJail(t)
	catTree(t, f, 5)
	write(t, filepath.Join(f.ws, "rootonly"), "x\n")
	os.Chmod(filepath.Join(f.ws, "rootonly"), 0o600)
	write(t, filepath.Join(f.ws, "closed", "x"), "x\n")
	os.Chmod(filepath.Join(f.ws, "closed"), 0o700)
	write(t, filepath.Join(f.ws, "mine"), "x\n")
	os.Chown(filepath.Join(f.ws, "mine"), 1000, 1000)
	os.Chmod(filepath.Join(f.ws, "mine"), 0o400)
	write(t, filepath.Join(f.ws, ".git"), "gitdir: /somewhere\n")
	os.Symlink("sub", filepath.Join(f.ws, "sublink"))
	f.j.Covered = []string{".git"}
	for _, tc := range []struct {
		cwd   string
		files []string
		want  bool
	}{
		{".", []string{"a.go", "many/d0/f000.txt", wsDest + "/sub/b.go", "./notes.md", "mine"}, true},
		{"sub", []string{"b.go", "deep/c.txt"}, true},
		{".", []string{"a.go", "no-such"}, false},
		{".", []string{"sub"}, false},
		{".", []string{"sublink/b.go"}, false},
		{".", []string{"rootonly"}, false},
		{".", []string{"closed/x"}, false},
		{".", []string{".git"}, false},
		{".", []string{wsDest + "/.git"}, false},
		{".", []string{"."}, false},
	} {
		if got := f.j.CatFiles(Request{Tool: Cat, Cwd: tc.cwd, Paths: tc.files}); got != tc.want {
			t.Errorf("cat %q in %s: CatFiles %v, want %v", tc.files, tc.cwd, got, tc.want)
		}
	}
}

// runCat runs the client as cat with args in dir, stdout a pipe.
func runCat(t *testing.T, f jailFixture, addr netip.AddrPort, dir string, args ...string) (string, string, int) {
	t.Helper()
	return runClientAs(t, f, addr, "cat", dir, nil, nil, args...)
}

// TestClientSameAsCat: installed as cat, the client prints what the
// image's cat prints (bytes, messages, exit code) for what it forwards (a
// batch of plain files, more than any one answer's bound: the answer
// streams) and for what it does not (few files, an option, stdin, a
// missing file or a directory among them: the sandbox's own cat answers
// it); the server counts which. A file written just before is read whole.
func TestClientSameAsCat(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, 2*bundle.SearchCatFiles)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	var big []string
	for i := range bundle.SearchCatFiles {
		name := fmt.Sprintf("big/%02d", i)
		write(t, filepath.Join(f.ws, name), strings.Repeat(fmt.Sprintf("%s %d\n", name, i), 1+(i*4099)%40000))
		big = append(big, name)
	}
	os.Symlink(filepath.Join(f.secret, "key"), filepath.Join(f.ws, "escape"))
	many := names[:bundle.SearchCatFiles]
	with := func(extra ...string) []string { return append(append([]string{}, many...), extra...) }
	for _, tc := range []struct {
		name    string
		args    []string
		dir     string
		forward bool
	}{
		{"files", names, "", true},
		{"after --", append([]string{"--"}, many...), "", true},
		{"absolute", func() []string {
			var a []string
			for _, n := range many {
				a = append(a, filepath.Join(f.ws, n))
			}
			return a
		}(), "", true},
		{"in a subdirectory", func() []string {
			var a []string
			for _, n := range names {
				a = append(a, strings.TrimPrefix(n, "many/"))
			}
			return a
		}(), "many", true},
		{"over 16 MiB", append(append([]string{}, big...), big...), "", true},
		{"above the cwd", func() []string {
			var a []string
			for _, n := range many {
				a = append(a, "../"+n)
			}
			return a
		}(), "sub", false},
		{"few", many[:bundle.SearchCatFiles-1], "", false},
		{"an option", with("-n"), "", false},
		{"an option after --", append([]string{"--"}, with("-n")...), "", false}, // a file named -n: missing
		{"stdin", with("-"), "", false},
		{"a missing file", with("no-such"), "", false},
		{"a directory", with("sub"), "", false},
		{"a planted link", with("escape"), "", false},
	} {
		before := s.Stats()
		dir := filepath.Join(f.ws, tc.dir)
		out, errs, code := runCat(t, f, addr, dir, tc.args...)
		want, wantErr, wcode := f.hostCat(t, dir, tc.args...)
		if out != want || errs != wantErr || code != wcode {
			t.Errorf("cat %s: client exit %d, %d bytes, stderr %q; cat exit %d, %d bytes, stderr %q", tc.name, code, len(out), errs, wcode, len(want), wantErr)
		}
		// The planted link is answered by the "sandbox's" cat, here the
		// host's (it follows it: the test runs the client on the host);
		// in a sandbox that cat sees the sandbox's files only.
		got := s.Stats()
		if tc.forward {
			got = catsCounted(s, before.Cat+1)
		}
		if forwarded := got.Cat > before.Cat; forwarded != tc.forward {
			t.Errorf("cat %s: answered outside %v, want %v (stats %+v)", tc.name, forwarded, tc.forward, s.Stats())
		}
		if tc.name == "over 16 MiB" && len(out) <= DefaultLimits.Stdout {
			t.Errorf("the big cat is %d bytes, not over the bound it must stream past", len(out))
		}
	}
	// Every forwarded byte came through the spool (the client keeps its
	// side open), none through the connection.
	if st := s.Stats(); st.Spooled == 0 || st.Sent != 0 {
		t.Errorf("cat's bytes: %d through the spool, %d through the connection; want all through the spool", st.Spooled, st.Sent)
	}
	// Written a moment before, read whole.
	fresh := filepath.Join(f.ws, names[3])
	body := strings.Repeat("written just before\n", 5000)
	if err := os.WriteFile(fresh, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().Cat
	out, _, code := runCat(t, f, addr, f.ws, names...)
	want, _, _ := f.hostCat(t, f.ws, names...)
	if out != want || code != 0 || !strings.Contains(out, body) || s.Stats().Cat != before+1 {
		t.Errorf("a file written just before: exit %d, equal %v, answered %d", code, out == want, s.Stats().Cat-before)
	}
}

// TestClientCatResumes: an answer that ends before its end (F, or the
// connection closed) after some output is finished by the sandbox's own
// cat, skipping what was written: the same bytes and exit code, never a
// truncated output. A stand-in server (outside the system under test, the
// client) sends part of the true answer. Control: the first part alone
// is shorter than the whole.
func TestClientCatResumes(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, bundle.SearchCatFiles)
	want, _, _ := f.hostCat(t, f.ws, names...)
	part := want[:len(want)/3]
	if len(part) >= len(want) || len(part) == 0 {
		t.Fatalf("control: a part of %d bytes of %d", len(part), len(want))
	}
	for _, end := range []string{"F", "close"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			readWire(c)
			var h [5]byte
			h[0] = frameData
			binary.BigEndian.PutUint32(h[1:], uint32(len(part)))
			io.WriteString(c, magic+" stream\n")
			c.Write(append(h[:], part...))
			if end == "F" {
				c.Write([]byte{frameFail})
			}
		}()
		out, errs, code := runCat(t, f, ln.Addr().(*net.TCPAddr).AddrPort(), f.ws, names...)
		ln.Close()
		if out != want || code != 0 || errs != "" {
			t.Errorf("ended by %s: exit %d, %d bytes of %d, equal %v, stderr %q", end, code, len(out), len(want), out == want, errs)
		}
	}
}

// TestJailCatStreamBounds: a streamed cat past its wall time ends with the
// fail frame (the client then has the sandbox's cat finish it), never with
// an end frame after part of the output. Control: within the default
// bounds the same cat ends with its end frame and exit code.
func TestJailCatStreamBounds(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, 50)
	r := Request{Tool: Cat, Cwd: ".", Paths: names}
	var b bytes.Buffer
	if ok, _, err := f.j.stream(context.Background(), nil, r, &b, nil); !ok || err != nil || b.Len() < 10 || b.Bytes()[b.Len()-9] != frameEnd {
		t.Fatalf("control: ok %v, %v, %d bytes", ok, err, b.Len())
	}
	quick := f.j
	quick.Limits.Wall = time.Millisecond
	b.Reset()
	ok, _, err := quick.stream(context.Background(), nil, r, &b, nil)
	if ok || !errors.Is(err, ErrFallback) || b.Len() == 0 || b.Bytes()[b.Len()-1] != frameFail {
		t.Errorf("past the wall time: ok %v, %v, last byte %q", ok, err, b.Bytes()[max(b.Len()-1, 0):])
	}
}
