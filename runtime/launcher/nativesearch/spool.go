package nativesearch

import (
	"fmt"
	"os"
	"sync"
	"syscall"
)

// cat's bytes through the spool (docs/spec.md, "cat's bytes through the
// spool")
//
// A cat's answer is its stdout, megabytes for a batch of source files.
// Sent through the TCP connection, every byte crosses the sandbox's
// network stack (gVisor's netstack, which cost about 150 ms of the
// sandbox's CPU for 15 MB); read from a file through the gofer, the same
// bytes cost the sandbox a host read (about 10 ms). So the server writes
// them into the spool, a file of the launcher's run dir bound read-only
// into the sandbox (bundle.SearchSpoolFile at bundle.SearchSpoolPath), and
// sends only where they are (a P frame: offset, length and the files
// whole through it); the client reads them there.
//
// Who writes it: the server only (the sandbox's bind is read-only, the run
// dir root's and 0700). What it holds: this sandbox's own answers, bytes
// the sandbox could read itself. When bytes may be written over: only
// when no answer that wrote into the spool is still being read, which the
// server learns from each such client's close of its connection (the
// client keeps its side open until it is done; a client that never closes
// keeps the spool from being reused, and past SpoolMax the cats are then
// the sandbox's own). So a region is never written over while a client
// may still read it.

// SpoolMax is the most bytes the spool holds at once; the files of an
// answer past it are the sandbox's cat's.
const SpoolMax = 256 << 20

// spool hands out regions of the spool file.
type spool struct {
	f   *os.File
	max int64

	mu    sync.Mutex
	next  int64 // the first byte no region holds
	users int   // answers that wrote into the spool and are not yet done
}

func newSpool(f *os.File, max int64) *spool {
	if f == nil {
		return nil
	}
	return &spool{f: f, max: max}
}

// begin counts an answer that may write into the spool; done, once its
// client has closed its connection, ends it.
func (s *spool) begin() {
	s.mu.Lock()
	s.users++
	s.mu.Unlock()
}

// done ends an answer's use; the last one out empties the spool, so the
// next answers start at its beginning again.
func (s *spool) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
	if s.users == 0 && s.next > 0 {
		if s.f.Truncate(0) == nil {
			s.next = 0
		}
	}
}

// reserve hands out a region of its own of up to n bytes, and at least
// least, and returns its offset and size: 0 when there is no spool (nil)
// or no room for least. The caller writes it (through its own
// description of the file: writer) until done.
func (s *spool) reserve(n, least int64) (int64, int64) {
	if s == nil {
		return 0, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := min(n, s.max-s.next)
	if k <= 0 || k < least {
		return 0, 0
	}
	off := s.next
	s.next += k
	return off, k
}

// writer opens a description of the spool of the caller's own, for
// writing: its position is the caller's (a cat's answer seeks to each of
// its regions and writes there with sendfile).
func (s *spool) writer() (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", s.f.Fd()), os.O_WRONLY|syscall.O_CLOEXEC, 0)
}
