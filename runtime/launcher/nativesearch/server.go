package nativesearch

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"paseo.dev/paseo-policy/runtime/launcher/peerserve"
)

// The protocol (TCP on the sandbox network's gateway): one request per
// connection, the client's wire form (Request.Encode) then a half-close;
// the answer is a line
//
//	paseo-search 1 ok EXIT STDOUT-BYTES STDERR-BYTES\n
//
// followed by the tool's stdout and stderr, or the line "paseo-search 1
// fallback\n" (a request off the list, a limit, the jail failed, too many
// at once): the client then runs the sandbox's own binary. A connection from
// any address but the sandbox's, or one that sends nothing within the
// deadline, is closed unanswered (the client falls back too).
const (
	readDeadline = 5 * time.Second
	maxConns     = 8
	maxRunning   = 2
	queueWait    = 10 * time.Second
)

// Server answers one sandbox's searches.
type Server struct {
	j    Jail
	ps   *peerserve.Server
	run  chan struct{}
	ctx  context.Context
	stop context.CancelFunc

	mu    sync.Mutex
	stats Stats
	// warm holds, per tool, a jail made before its request (prepared):
	// the sandbox's first search runs in a new jail, and each search
	// makes the next jail of every tool that has none waiting, in the
	// background (a sandbox that searched once searches again, and an
	// agent goes from rg to find and fd). Every jail serves one request.
	warm   map[Tool]*prepared
	closed bool
	making sync.WaitGroup

	// spool carries cat's bytes (spool.go); nil: every cat is the
	// sandbox's.
	spool *spool
}

// Stats count a server's connections.
type Stats struct {
	Answered, Fallback, Refused uint64
	// Warm counts the answers from a jail made before its request.
	Warm uint64
	// Cat counts the cats answered (some of their files at least), among
	// Answered; CatResumed those whose rest was the sandbox's cat's.
	Cat, CatResumed uint64
	// Spooled counts the bytes of cat's output sent through the spool.
	Spooled uint64
}

// Serve answers requests on ln (the launcher's is on the gateway, which
// nftables opens to this sandbox's address only) until Close; a
// connection from any address but peer is closed unanswered (peerserve).
// spool, when not nil, is the run dir's copy of the spool, opened for
// reading and writing (spool.go): the server writes cat's bytes there
// for the clients that keep their connection open, and empties it.
func Serve(j Jail, ln net.Listener, peer netip.Addr, spool *os.File) *Server {
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{j: j, run: make(chan struct{}, maxRunning), ctx: ctx, stop: stop, warm: map[Tool]*prepared{}, spool: newSpool(spool, SpoolMax)}
	s.ps = peerserve.Serve(ln, peer, maxConns, s.answer)
	return s
}

// Stats are the counters so far: Refused counts the connections closed
// unanswered, by admission or for a request not read.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Refused = s.ps.Refused()
	return st
}

// Close kills the searches running and the jails waiting, stops
// listening and waits for the connections being answered.
func (s *Server) Close() error {
	s.stop()
	err := s.ps.Close()
	s.mu.Lock()
	s.closed = true
	warm := s.warm
	s.warm = map[Tool]*prepared{}
	s.mu.Unlock()
	for _, p := range warm {
		p.discard()
	}
	s.making.Wait()
	return err
}

// take removes the warm jail for t, if any and still waiting.
func (s *Server) take(t Tool) *prepared {
	s.mu.Lock()
	p := s.warm[t]
	delete(s.warm, t)
	s.mu.Unlock()
	if p != nil && !p.alive() {
		p.discard()
		return nil
	}
	return p
}

// refill makes the next jail for t in the background, unless one waits
// or the server is closing.
func (s *Server) refill(t Tool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.warm[t] != nil {
		return
	}
	s.making.Add(1)
	go func() {
		defer s.making.Done()
		p, err := s.j.prepare(t)
		if err != nil {
			return
		}
		s.mu.Lock()
		keep := !s.closed && s.warm[t] == nil
		if keep {
			s.warm[t] = p
		}
		s.mu.Unlock()
		if !keep {
			p.discard()
		}
	}()
}

// slot waits, up to queueWait, for one of the maxRunning places; the
// caller gives it back (<-s.run).
func (s *Server) slot() error {
	t := time.NewTimer(queueWait)
	defer t.Stop()
	select {
	case s.run <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: %d searches running", ErrFallback, maxRunning)
	case <-s.ctx.Done():
		return ErrFallback
	}
}

// The frames of a cat's answer (catread.go), after the line
// "paseo-search 1 stream\n": 'P', an offset (8 bytes, big-endian), a
// length and a count of files (4 bytes each): that many bytes of the
// answer are in the spool at that offset, and with them the first FILES
// files are written whole; then 'E' (every file was answered) or 'R' and
// a file's index (4 bytes): the files from that one on are the sandbox's
// own cat's. An answer that ends before either (the server closed) is
// the sandbox's cat's from the last P frame's count.
const (
	frameSpool  = 'P'
	frameEnd    = 'E'
	frameResume = 'R'
)

// streamAnswer answers a cat: "fallback" when the client did not keep
// its side open or the server has no spool (the bytes travel only through
// the spool) or no place is free; else the line "paseo-search 1 stream"
// and the frames (above) of the files copied (Jail.catRead). The answer
// is done when its client closes: its regions of the spool may then be
// written over.
func (s *Server) streamAnswer(c net.Conn, r Request, open bool) {
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(readDeadline + s.j.Limits.Wall))
	if !open || s.spool == nil || s.slot() != nil {
		s.count(func(st *Stats) { st.Fallback++ })
		io.WriteString(c, magic+" fallback\n")
		return
	}
	sp := s.spool
	sp.begin()
	defer sp.done()
	done, err := catCopied{}, error(nil)
	if _, err = io.WriteString(c, magic+" stream\n"); err == nil {
		done, err = s.j.catRead(s.ctx, r, sp, s.j.Limits.Wall, func(run catSpan, files int) error {
			var h [17]byte
			h[0] = frameSpool
			binary.BigEndian.PutUint64(h[1:9], uint64(run.off))
			binary.BigEndian.PutUint32(h[9:13], uint32(run.n))
			binary.BigEndian.PutUint32(h[13:17], uint32(files))
			_, err := c.Write(h[:])
			return err
		})
	}
	if err == nil {
		end := []byte{frameEnd}
		if done.files < len(r.Paths) {
			end = binary.BigEndian.AppendUint32([]byte{frameResume}, uint32(done.files))
		}
		_, err = c.Write(end)
	}
	<-s.run
	s.count(func(st *Stats) {
		st.Spooled += uint64(done.bytes)
		if err != nil || done.files == 0 {
			st.Fallback++
			return
		}
		st.Answered++
		st.Cat++
		if done.files < len(r.Paths) {
			st.CatResumed++
		}
	})
	if err != nil {
		return
	}
	// The client reads the spool until it closes: wait for that (or the
	// server's end), however long, before the regions may be written
	// over.
	c.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(s.ctx, func() { c.SetReadDeadline(time.Unix(1, 0)) })
	io.Copy(io.Discard, io.LimitReader(c, 1))
	stop()
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *Server) answer(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(readDeadline))
	b, open, err := readWire(c)
	if err != nil {
		s.ps.Refuse(c)
		return
	}
	r, err := Decode(b, s.j.Dest)
	if err == nil && r.tool() == Cat {
		s.streamAnswer(c, r, open)
		return
	}
	res, used, err := s.search(r, err)
	// The next jails are made once the answer is sent and the connection
	// closed (the client reads to its end): not beside the answer's copy
	// and the client's print for the CPU.
	defer func() {
		c.Close()
		if used != "" {
			for _, t := range []Tool{Rg, Fd, Find} {
				s.refill(t)
			}
		}
	}()
	c.SetWriteDeadline(time.Now().Add(readDeadline + s.j.Limits.Wall))
	if err != nil {
		s.count(func(st *Stats) { st.Fallback++ })
		io.WriteString(c, magic+" fallback\n")
		return
	}
	s.count(func(st *Stats) { st.Answered++ })
	var h bytes.Buffer
	fmt.Fprintf(&h, "%s ok %d %d %d\n", magic, res.Exit, len(res.Stdout), len(res.Stderr))
	c.Write(append(append(h.Bytes(), res.Stdout...), res.Stderr...))
}

// search answers r (decoded with err); used is the tool a jail ran for
// ("" when none ran): the server then makes the next jails.
func (s *Server) search(r Request, err error) (res Result, used Tool, _ error) {
	if err != nil {
		return Result{}, "", err
	}
	if !s.j.PlainPaths(r) {
		return Result{}, "", fmt.Errorf("%w: a path or the cwd is a link (the sandbox's tool follows it)", ErrFallback)
	}
	if err := s.slot(); err != nil {
		return Result{}, "", err
	}
	defer func() { <-s.run }()
	used = r.tool()
	p := s.take(used)
	res, err = s.j.runIn(s.ctx, p, r)
	if err == nil && p != nil {
		s.count(func(st *Stats) { st.Warm++ })
	}
	return res, used, err
}
