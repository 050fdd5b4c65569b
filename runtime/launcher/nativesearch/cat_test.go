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
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// catReadAll runs catRead on r with a spool of its own and returns the
// bytes its frames name, in order, and what it copied whole; it fails the
// test when a frame's count is not the files whose bytes came before.
func catReadAll(t *testing.T, f jailFixture, r Request, max int64, wall time.Duration) (string, catCopied) {
	t.Helper()
	sf, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	sp := newSpool(sf, max)
	var out []byte
	done, err := f.j.catRead(context.Background(), r, sp, wall, func(run catSpan, files int) error {
		b := make([]byte, run.n)
		if _, err := sf.ReadAt(b, run.off); err != nil {
			t.Fatalf("the spool at %+v: %v", run, err)
		}
		out = append(out, b...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(out)) != done.bytes {
		t.Fatalf("the frames named %d bytes, the copy counts %d", len(out), done.bytes)
	}
	return string(out), done
}

// TestCatReadLikeCat: the server's copy is the image's cat's output for
// the files it copies, and it stops at the first file the sandbox's cat
// must answer (a missing one, a directory, a link, one beneath a name the
// sandbox sees through a mount of its own): its bytes, and the files
// after it, are then the sandbox's. Absolute names, names in a
// subdirectory, an empty file, a name like an option.
func TestCatReadLikeCat(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, 20)
	write(t, filepath.Join(f.ws, "-n"), "a file named -n\n")
	write(t, filepath.Join(f.ws, ".git"), "gitdir: /somewhere\n")
	os.Symlink("sub", filepath.Join(f.ws, "sublink"))
	f.j.Covered = []string{".git"}
	for _, tc := range []struct {
		name  string
		cwd   string
		files []string
		done  int
	}{
		{"files", ".", names, 20},
		{"empty", ".", []string{names[0], names[0]}, 2},
		{"missing", ".", []string{"a.go", "no-such", "notes.md"}, 1},
		{"a directory", ".", []string{"a.go", "sub", "notes.md"}, 1},
		{"absolute", ".", []string{wsDest + "/a.go", wsDest + "/sub/b.go"}, 2},
		{"in a subdirectory", "sub", []string{"b.go", "deep/c.txt"}, 2},
		{"a name like an option", ".", []string{"-n"}, 1},
		{"a link on the way", ".", []string{"a.go", "sublink/b.go"}, 1},
		{"covered", ".", []string{"a.go", ".git"}, 1},
		{"covered, absolute", ".", []string{wsDest + "/.git", "a.go"}, 0},
		{"the top", ".", []string{"."}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, done := catReadAll(t, f, Request{Tool: Cat, Cwd: tc.cwd, Paths: tc.files}, SpoolMax, time.Minute)
			var args []string
			for _, p := range tc.files[:done.files] {
				args = append(args, strings.ReplaceAll(p, wsDest, f.ws))
			}
			want := ""
			if len(args) > 0 {
				want, _, _ = f.hostCat(t, filepath.Join(f.ws, tc.cwd), append([]string{"--"}, args...)...)
			}
			if done.files != tc.done || out != want {
				t.Errorf("copied %d files (want %d), %q; the image's cat of those: %q", done.files, tc.done, out, want)
			}
		})
	}
}

// TestCatReadAsTheAgent: the copy reads only what the agent's uid may
// read, through what it may search: a file the agent may not read, one in
// a directory it may not search, a link to a host file, a FIFO (not
// opened: no wait for a writer) all stop it there. Controls: root's cat
// (nothing protects) reads each; a file the agent owns with mode 0400 is
// copied. The server's other threads keep root's credentials (the
// agent's ended with their thread), and names outside the workspace are
// refused by the request's check.
func TestCatReadAsTheAgent(t *testing.T) {
	f := newJail(t)
	write(t, filepath.Join(f.ws, "rootonly"), "ROOTONLY\n")
	os.Chmod(filepath.Join(f.ws, "rootonly"), 0o600)
	write(t, filepath.Join(f.ws, "closed", "x"), "INCLOSED\n")
	os.Chmod(filepath.Join(f.ws, "closed"), 0o700)
	write(t, filepath.Join(f.ws, "mine"), "MINE\n")
	os.Chown(filepath.Join(f.ws, "mine"), 1000, 1000)
	os.Chmod(filepath.Join(f.ws, "mine"), 0o400)
	if err := os.Symlink(filepath.Join(f.secret, "key"), filepath.Join(f.ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(f.ws, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, secret string }{{"rootonly", "ROOTONLY"}, {"closed/x", "INCLOSED"}, {"escape", "HOSTSECRET"}} {
		if out, _, _ := f.hostCat(t, f.ws, tc.name); !strings.Contains(out, tc.secret) {
			t.Fatalf("control: root's cat of %s: %q", tc.name, out)
		}
		t0 := time.Now()
		out, done := catReadAll(t, f, Request{Tool: Cat, Cwd: ".", Paths: []string{"a.go", tc.name, "mine"}}, SpoolMax, time.Minute)
		if done.files != 1 || strings.Contains(out, tc.secret) || time.Since(t0) > 10*time.Second {
			t.Errorf("%s: copied %d files: %q", tc.name, done.files, out)
		}
	}
	done := make(chan catCopied, 1)
	go func() {
		_, d := catReadAll(t, f, Request{Tool: Cat, Cwd: ".", Paths: []string{"fifo", "a.go"}}, SpoolMax, time.Minute)
		done <- d
	}()
	select {
	case d := <-done:
		if d.files != 0 {
			t.Errorf("the FIFO: copied %d files", d.files)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the copy waits on the FIFO")
	}
	if out, d := catReadAll(t, f, Request{Tool: Cat, Cwd: ".", Paths: []string{"mine", "a.go"}}, SpoolMax, time.Minute); d.files != 2 || !strings.HasPrefix(out, "MINE\n") {
		t.Errorf("control, the agent's own file: copied %d files: %q", d.files, out)
	}
	// A jail of uid 0 (refused by Check; here given to the copy directly)
	// is no agent to become: the cat is the sandbox's.
	root := f
	root.j.UID = 0
	sf, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	if d, err := root.j.catRead(context.Background(), Request{Tool: Cat, Cwd: ".", Paths: []string{"a.go"}}, newSpool(sf, SpoolMax), time.Minute,
		func(catSpan, int) error { return nil }); !errors.Is(err, ErrFallback) || d.files != 0 {
		t.Errorf("as uid 0: copied %d files, %v; want the fallback", d.files, err)
	}
	// Every thread of the server (the test's goroutines run on them) still
	// reads as root.
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b, err := os.ReadFile(filepath.Join(f.ws, "closed", "x")); err != nil || string(b) != "INCLOSED\n" {
				t.Errorf("a thread of the server lost root's credentials: %v", err)
			}
		}()
	}
	wg.Wait()
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

// TestCatReadBounds: past the wall time, past the spool's room, or at a
// file over catFileMax (the client holds a frame whole), the copy stops
// at a file's end (the rest is the sandbox's). Control: within the
// bounds, every file is copied, one of catFileMax too.
func TestCatReadBounds(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, 50)
	r := Request{Tool: Cat, Cwd: ".", Paths: names}
	want, _, _ := f.hostCat(t, f.ws, names...)
	if out, d := catReadAll(t, f, r, SpoolMax, time.Minute); d.files != len(names) || out != want {
		t.Fatalf("control: copied %d files of %d, equal %v", d.files, len(names), out == want)
	}
	if _, d := catReadAll(t, f, r, SpoolMax, 0); d.files != 0 {
		t.Errorf("past the wall time: copied %d files", d.files)
	}
	big := filepath.Join(f.ws, "big")
	write(t, big, strings.Repeat("x", catFileMax))
	if _, d := catReadAll(t, f, Request{Tool: Cat, Cwd: ".", Paths: []string{names[1], "big", names[2]}}, SpoolMax, time.Minute); d.files != 3 {
		t.Errorf("control, a file of catFileMax: copied %d files of 3", d.files)
	}
	write(t, big, strings.Repeat("x", catFileMax+1))
	if _, d := catReadAll(t, f, Request{Tool: Cat, Cwd: ".", Paths: []string{names[1], "big", names[2]}}, SpoolMax, time.Minute); d.files != 1 {
		t.Errorf("a file over catFileMax: copied %d files, want the one before it", d.files)
	}
	room := int64(len(want) / 2)
	out, d := catReadAll(t, f, r, room, time.Minute)
	if whole, _, _ := f.hostCat(t, f.ws, names[:d.files]...); d.files == 0 || d.files >= len(names) || out != whole || int64(len(out)) > room {
		t.Errorf("past the room: copied %d files, %d bytes of %d room", d.files, len(out), room)
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
		{"an option after --", append([]string{"--"}, with("-n")...), "", true}, // a file named -n: missing, the sandbox's
		{"stdin", with("-"), "", false},
		// Answered outside up to the file the sandbox's cat must answer,
		// which answers it and the rest.
		{"a missing file", with("no-such"), "", true},
		{"a directory", with("sub", many[0]), "", true},
		{"a planted link", with("escape", many[1]), "", true},
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
	if st := s.Stats(); st.Spooled == 0 || st.CatResumed != 4 {
		t.Errorf("cat's bytes: %d through the spool, %d answers resumed by the sandbox's cat (want 4)", st.Spooled, st.CatResumed)
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

// TestClientCatResumes: an answer that names only part of the files
// (R, or the connection closed after P frames) is finished by the
// sandbox's own cat from the first file not answered: the same bytes and
// exit code, never a truncated or doubled output. A stand-in server
// (outside the system under test, the client) writes the first files'
// bytes into the spool and names them. Control: those files alone are
// shorter than the whole.
func TestClientCatResumes(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, bundle.SearchCatFiles)
	names = append(names, "no-such")
	want, wantErr, wcode := f.hostCat(t, f.ws, names...)
	k := len(names) / 3
	part, _, _ := f.hostCat(t, f.ws, names[:k]...)
	if len(part) >= len(want) || len(part) == 0 || wcode != 1 {
		t.Fatalf("control: a part of %d bytes of %d, exit %d", len(part), len(want), wcode)
	}
	f.spool = filepath.Join(t.TempDir(), "spool")
	if err := os.WriteFile(f.spool, []byte("xx"+part), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, end := range []string{"R", "close"} {
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
			io.WriteString(c, magic+" stream\n")
			// Two frames: the first file alone, then the rest of the part.
			first, _, _ := f.hostCat(t, f.ws, names[0])
			for _, fr := range [][3]int{{2, len(first), 1}, {2 + len(first), len(part) - len(first), k}} {
				h := []byte{frameSpool}
				h = binary.BigEndian.AppendUint64(h, uint64(fr[0]))
				h = binary.BigEndian.AppendUint32(h, uint32(fr[1]))
				h = binary.BigEndian.AppendUint32(h, uint32(fr[2]))
				c.Write(h)
			}
			if end == "R" {
				c.Write(binary.BigEndian.AppendUint32([]byte{frameResume}, uint32(k)))
			}
		}()
		out, errs, code := runCat(t, f, ln.Addr().(*net.TCPAddr).AddrPort(), f.ws, names...)
		ln.Close()
		if out != want || code != wcode || errs != wantErr {
			t.Errorf("ended by %s: exit %d, %d bytes of %d, equal %v, stderr %q", end, code, len(out), len(want), out == want, errs)
		}
	}
}
