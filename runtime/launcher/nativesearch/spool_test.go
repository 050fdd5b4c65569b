package nativesearch

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
)

// TestSpoolNotWrittenOverWhileHeld: a region stays as written while any
// answer that wrote into the spool is not done; the last one done empties
// it and the next region starts at its beginning; at its bound reserve
// gives what it has room for, past it nothing (the rest of that cat is
// then the sandbox's). Control: with every answer done, the spool is
// emptied.
func TestSpoolNotWrittenOverWhileHeld(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := newSpool(f, 10)
	put := func(b string) (int64, int64) {
		off, k := s.reserve(int64(len(b)), 1)
		if k > 0 {
			w, err := s.writer()
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if _, err := w.WriteAt([]byte(b[:k]), off); err != nil {
				t.Fatal(err)
			}
		}
		return off, k
	}
	s.begin()
	s.begin()
	a, ka := put("aaaa")
	b, kb := put("bbbb")
	if ka != 4 || kb != 4 || a != 0 || b != 4 {
		t.Fatalf("regions at %d (%d bytes), %d (%d)", a, ka, b, kb)
	}
	if c, k := put("ccc"); k != 2 || c != 8 {
		t.Errorf("at the bound: %d bytes at %d, want the 2 it has room for at 8", k, c)
	}
	if _, k := put("d"); k != 0 {
		t.Error("a region past the bound was handed out")
	}
	s.done()
	got := make([]byte, 10)
	if _, err := f.ReadAt(got, 0); err != nil || string(got) != "aaaabbbbcc" {
		t.Errorf("one answer still held: the spool reads %q, %v", got, err)
	}
	if _, k := put("e"); k != 0 {
		t.Error("while held and full, a region was handed out")
	}
	s.done()
	if st, err := f.Stat(); err != nil || st.Size() != 0 {
		t.Fatalf("control: every answer done, the spool is %d bytes (%v), not emptied", st.Size(), err)
	}
	s.begin()
	if c, k := put("dd"); k != 2 || c != 0 {
		t.Errorf("after it was emptied, %d bytes at %d, not 2 at 0", k, c)
	}
	if _, k := s.reserve(9, 9); k != 0 {
		t.Error("a region smaller than the least asked for was handed out")
	}
	if c, k := s.reserve(8, 8); k != 8 || c != 2 {
		t.Errorf("control, the least it has room for: %d bytes at %d, not 8 at 2", k, c)
	}
	var none *spool
	if _, k := none.reserve(1, 1); k != 0 {
		t.Error("no spool gave a region")
	}
}

// TestServerSpoolsUntilClosed: a cat whose client keeps its side open is
// answered in P frames whose spool bytes are the image's cat's output,
// each frame counting the files written whole through it; the spool keeps
// them after the end frame until the client closes, and is emptied then.
// Control: a client that half-closes (it could not hold the spool's
// regions) is answered "fallback", and the spool gets nothing.
func TestServerSpoolsUntilClosed(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, bundle.SearchCatFiles)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	want, _, _ := f.hostCat(t, f.ws, names...)
	req := Request{Tool: Cat, Cwd: ".", Paths: names}.Encode()
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(60 * time.Second))
		return c
	}
	c := dial()
	c.Write(req)
	c.(*net.TCPConn).CloseWrite()
	if b, _ := io.ReadAll(c); string(b) != magic+" fallback\n" {
		t.Fatalf("control, half-closed: %q, want fallback", b)
	}
	c.Close()

	c = dial()
	defer c.Close()
	c.Write(append(append([]byte{}, req...), 0))
	line := make([]byte, len(magic+" stream\n"))
	if _, err := io.ReadFull(c, line); err != nil || string(line) != magic+" stream\n" {
		t.Fatalf("answer %q, %v", line, err)
	}
	spool, err := os.Open(f.spool)
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Close()
	var out []byte
	files := 0
	for end := false; !end; {
		var k [1]byte
		if _, err := io.ReadFull(c, k[:]); err != nil {
			t.Fatalf("frames ended without E: %v", err)
		}
		switch k[0] {
		case frameSpool:
			var h [16]byte
			io.ReadFull(c, h[:])
			b := make([]byte, binary.BigEndian.Uint32(h[8:12]))
			if _, err := spool.ReadAt(b, int64(binary.BigEndian.Uint64(h[:8]))); err != nil {
				t.Fatalf("the spool at a P frame's region: %v", err)
			}
			out = append(out, b...)
			n := int(binary.BigEndian.Uint32(h[12:]))
			if whole, _, _ := f.hostCat(t, f.ws, names[:n]...); n <= files || whole != string(out) {
				t.Fatalf("a P frame counts %d files (after %d), whose bytes are not the output so far", n, files)
			}
			files = n
		case frameEnd:
			end = true
		default:
			t.Fatalf("frame %q", k)
		}
	}
	if st := catsCounted(s, 1); string(out) != want || files != len(names) || st.Spooled != uint64(len(want)) || st.Fallback != 1 {
		t.Fatalf("kept open: equal %v, %d files counted, %+v", string(out) == want, files, st)
	}
	time.Sleep(200 * time.Millisecond)
	if st, err := os.Stat(f.spool); err != nil || st.Size() < int64(len(want)) {
		t.Errorf("after the end frame, the client not closed: the spool is %d bytes (%v), want %d", st.Size(), err, len(want))
	}
	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := os.Stat(f.spool)
		if err == nil && st.Size() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client closed: the spool is still %d bytes (%v)", st.Size(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClientCatPastTheSpool: an answer larger than the spool's room is
// answered outside up to the first file it has no room for, and the
// sandbox's cat gives the rest: the client prints the image's cat's bytes.
func TestClientCatPastTheSpool(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, bundle.SearchCatFiles)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	want, _, _ := f.hostCat(t, f.ws, names...)
	s.spool.max = int64(len(want) / 3)
	out, errs, code := runCat(t, f, addr, f.ws, names...)
	st := catsCounted(s, 1)
	if out != want || code != 0 || errs != "" || st.Cat != 1 || st.CatResumed != 1 || st.Spooled == 0 || st.Spooled > uint64(len(want)/3) {
		t.Errorf("exit %d, equal %v, stderr %q, %+v (want a part through the spool, the rest resumed)", code, out == want, errs, st)
	}
}

// TestClientCatSpoolGone: a spool the client cannot read (here: removed)
// has the sandbox's cat answer, with the same bytes: never a truncated
// output. Control: with the spool there, the same cat is answered
// outside.
func TestClientCatSpoolGone(t *testing.T) {
	f := newJail(t)
	names := catTree(t, f, bundle.SearchCatFiles)
	s, addr := serveJail(t, &f, netip.MustParseAddr("127.0.0.1"))
	want, _, _ := f.hostCat(t, f.ws, names...)
	if out, _, code := runCat(t, f, addr, f.ws, names...); out != want || code != 0 || s.Stats().Spooled == 0 {
		t.Fatalf("control: exit %d, equal %v, %+v", code, out == want, s.Stats())
	}
	if err := os.Rename(f.spool, f.spool+".gone"); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCat(t, f, addr, f.ws, names...)
	if out != want || code != 0 || errs != "" {
		t.Errorf("spool gone: exit %d, %d bytes of %d, equal %v, stderr %q", code, len(out), len(want), out == want, errs)
	}
}

// catsCounted is s's counters once it has counted n cats (it counts after
// sending the end frame, which a client may read first), or after 5 s.
func catsCounted(s *Server, n uint64) Stats {
	st := s.Stats()
	for deadline := time.Now().Add(5 * time.Second); st.Cat < n && time.Now().Before(deadline); st = s.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	return st
}
