package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"
)

// These tests exist to catch a reuse bug: a reader that sees a chunk after
// it was recycled and refilled. Each byte of the output is a function of
// its offset, so any recycled memory a reader sees shows up as a mismatch
// (and, under -race, as a race with the pump's read into the chunk).

func pattern(off int) byte { return byte(uint32(off) * 2654435761 >> 24) }

func fill(b []byte, off int) {
	for i := range b {
		b[i] = pattern(off + i)
	}
}

// mismatch returns the first offset in b that is not pattern(off...), or -1.
func mismatch(b []byte, off int) int {
	for i, c := range b {
		if c != pattern(off+i) {
			return off + i
		}
	}
	return -1
}

// producePattern writes total bytes of the pattern into w in writes of
// varying sizes, then closes w.
func producePattern(t *testing.T, w *os.File, total int) {
	t.Helper()
	go func() {
		defer w.Close()
		buf := make([]byte, 48<<10)
		for off, k := 0, 0; off < total; k++ {
			n := min(total-off, 1+(k*7919)%len(buf))
			fill(buf[:n], off)
			if _, err := w.Write(buf[:n]); err != nil {
				return
			}
			off += n
		}
	}()
}

func startPattern(t *testing.T, lim Limits, total int) *Session {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s := Start(nopWriteCloser{}, map[string]io.Reader{"stdout": r}, lim)
	producePattern(t, w, total)
	go s.Exited(0)
	return s
}

// A record's Data stays intact for the whole of fn, even when fn
// acknowledges it and the pump keeps filling (and recycling) chunks
// meanwhile, and when fn is slow enough that the record is spilled.
func TestStreamDataStableAcrossAcksAndSpills(t *testing.T) {
	const total = 8 << 20
	// 64 KiB of memory: 16 KiB chunks, recycled and spilled all the time.
	s := startPattern(t, Limits{MemBytes: 64 << 10, SpillBytes: 64 << 20, SpillDir: t.TempDir()}, total)
	defer s.Release()
	off := 0
	var cursor uint64
	var spilled int64
	err := s.Stream(context.Background(), 0, func(r Record) error {
		if r.Seq != cursor+1 {
			return fmt.Errorf("record %d after %d", r.Seq, cursor)
		}
		cursor = r.Seq
		if r.Stream == "exit" {
			return nil
		}
		if bad := mismatch(r.Data, off); bad >= 0 {
			return fmt.Errorf("record %d: wrong byte at offset %d on arrival", r.Seq, bad)
		}
		switch r.Seq % 3 {
		case 0: // acknowledged while fn holds it
			s.Ack(r.Seq)
			runtime.Gosched()
		case 1: // held while the pump spills it
			if r.Seq%32 == 1 {
				time.Sleep(2 * time.Millisecond)
				spilled = max(spilled, s.State().SpillBytes)
			}
		}
		if bad := mismatch(r.Data, off); bad >= 0 {
			return fmt.Errorf("record %d: byte at offset %d changed while fn held it", r.Seq, bad)
		}
		off += len(r.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if off != total {
		t.Fatalf("got %d of %d bytes", off, total)
	}
	if spilled == 0 {
		t.Error("nothing was spilled while fn held it: the test proves less than it says")
	}
}

// Readers that fall behind the live output and catch up again, over and
// over, alternate between spilled and in-memory records; none sees
// another's spill buffer or a recycled chunk.
func TestConcurrentReadersFallingBehind(t *testing.T) {
	const total = 6 << 20
	s := startPattern(t, Limits{MemBytes: 64 << 10, SpillBytes: 64 << 20, SpillDir: t.TempDir()}, total)
	defer s.Release()
	errs := make(chan error, 3)
	for k := 0; k < 3; k++ {
		go func() {
			off := 0
			errs <- s.Stream(context.Background(), 0, func(r Record) error {
				if r.Stream == "exit" {
					if off != total {
						return fmt.Errorf("reader %d: exit after %d of %d bytes", k, off, total)
					}
					return nil
				}
				if bad := mismatch(r.Data, off); bad >= 0 {
					return fmt.Errorf("reader %d, record %d: wrong byte at offset %d", k, r.Seq, bad)
				}
				if r.Seq%(50+uint64(k)*17) == 0 {
					time.Sleep(time.Millisecond) // fall behind: the pump spills ahead
				}
				if bad := mismatch(r.Data, off); bad >= 0 {
					return fmt.Errorf("reader %d, record %d: byte at offset %d changed while fn held it", k, r.Seq, bad)
				}
				off += len(r.Data)
				return nil
			})
		}()
	}
	for k := 0; k < 3; k++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// Records returned by Read are the caller's: acknowledging them and
// writing enough to recycle every chunk leaves them unchanged.
func TestReadCopiesSurviveRecycling(t *testing.T) {
	l := NewLog(Limits{MemBytes: 64 << 10, SpillBytes: 1 << 20, SpillDir: t.TempDir()})
	defer l.Release()
	var w writer
	off := 0
	write := func(n int) {
		for n > 0 {
			buf := l.space(&w)
			k := min(n, len(buf), 3000)
			fill(buf[:k], off)
			if _, err := l.commit(&w, "stdout", k); err != nil {
				t.Fatal(err)
			}
			off += k
			n -= k
		}
	}
	write(48 << 10)
	held, _, _, err := l.Read(0, 1000)
	if err != nil || len(held) == 0 {
		t.Fatalf("read %d records: %v", len(held), err)
	}
	heldTo := held[len(held)-1].Seq
	for round := 0; round < 20; round++ {
		l.Ack(l.State().Next - 1)
		write(48 << 10) // reuses the chunks the held records were read from
	}
	l.closeWriter(&w)
	if n, _ := l.chunkCount(); n > l.maxFree+2 {
		t.Errorf("%d chunks allocated for a 64 KiB log: not recycled", n)
	}
	at := 0
	for _, r := range held {
		if bad := mismatch(r.Data, at); bad >= 0 {
			t.Fatalf("record %d (of 1..%d) changed at offset %d", r.Seq, heldTo, bad)
		}
		at += len(r.Data)
	}
}

// Replay from the spill file reads batches; a backlog larger than one
// batch, with a record larger than one read, comes back whole and in
// order from any cursor.
func TestSpillReplayFromAnyCursor(t *testing.T) {
	l := NewLog(Limits{MemBytes: 8 << 10, SpillBytes: 64 << 20, SpillDir: t.TempDir()})
	defer l.Release()
	var sizes []int
	off := 0
	for i := 0; i < 3000; i++ {
		n := 1 + (i*104729)%2000
		if i == 1234 {
			n = maxSpillRead + maxSpillRead/2
		}
		b := make([]byte, n)
		fill(b, off)
		if _, err := l.Append("stdout", b); err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, n)
		off += n
	}
	l.Close()
	if st := l.State(); st.SpillBytes < 4<<20 || st.MemBytes == 0 {
		t.Fatalf("backlog should be mostly spilled, the rest in memory: %+v", st)
	}
	s := &Session{log: l}
	// Concurrent replays, twice over: each has a spill buffer of its own
	// (one may be the log's spare, which a finished replay left).
	cursors := []uint64{0, 1, 255, 256, 1233, 1234, 1235, 2990, 2999, 3000}
	errs := make(chan error, len(cursors))
	for round := 0; round < 2; round++ {
		for _, cursor := range cursors {
			go func() { errs <- replayFrom(s, cursor, sizes) }()
		}
		for range cursors {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

func replayFrom(s *Session, cursor uint64, sizes []int) error {
	at := 0
	for _, n := range sizes[:cursor] {
		at += n
	}
	next := cursor + 1
	err := s.Stream(context.Background(), cursor, func(r Record) error {
		if r.Seq != next || len(r.Data) != sizes[r.Seq-1] {
			return fmt.Errorf("record %d (%d bytes), want %d", r.Seq, len(r.Data), next)
		}
		if bad := mismatch(r.Data, at); bad >= 0 {
			return fmt.Errorf("record %d: wrong byte at %d", r.Seq, bad)
		}
		at += len(r.Data)
		next++
		return nil
	})
	if err != nil || next != uint64(len(sizes))+1 {
		return fmt.Errorf("from %d: stopped before %d: %v", cursor, next, err)
	}
	return nil
}

// Chunks in use stay near MemBytes plus the pump's open chunk and a
// reader's pins, however much passes through; acknowledged, their memory
// goes back to the free list, which an idle period and Release empty.
func TestChunkMemoryBoundedAndReturned(t *testing.T) {
	const total = 32 << 20
	lim := Limits{MemBytes: 256 << 10, SpillBytes: 64 << 20, SpillDir: t.TempDir()}
	s := startPattern(t, lim, total)
	defer s.Release()
	l := s.log
	l.mu.Lock()
	l.idleAfter = 50 * time.Millisecond
	l.mu.Unlock()
	off := 0
	err := s.Stream(context.Background(), 0, func(r Record) error {
		if r.Stream == "stdout" {
			off += len(r.Data)
		}
		if r.Seq%8 == 0 {
			s.Ack(r.Seq)
		}
		return nil
	})
	if err != nil || off != total {
		t.Fatalf("streamed %d of %d bytes: %v", off, total, err)
	}
	s.Ack(s.State().Next - 1)
	l.mu.Lock()
	// Full chunks hold MemBytes; add a partly acknowledged one, the
	// pump's open one, the waste at chunk ends and a reader's pins.
	bound := int(lim.MemBytes)/(l.chunkSize-l.minTail) + 3 + maxPins
	peak, inUse := l.peakChunks, l.chunks-len(l.free)
	l.mu.Unlock()
	if peak > bound {
		t.Errorf("%d chunks of %d KiB at the peak, want at most %d", peak, l.chunkSize>>10, bound)
	}
	if inUse != 0 {
		t.Errorf("%d chunks still in use with everything acknowledged and the pump gone", inUse)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if n, _ := l.chunkCount(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			n, _ := l.chunkCount()
			t.Fatalf("%d free chunks kept after an idle period", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReleaseDropsFreeChunks(t *testing.T) {
	s := startPattern(t, Limits{MemBytes: 256 << 10, SpillDir: t.TempDir()}, 4<<20)
	var cursor uint64
	if err := s.Stream(context.Background(), 0, func(r Record) error {
		cursor = r.Seq
		s.Ack(cursor)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.log.chunkCount(); n == 0 {
		t.Fatal("no free chunks before Release: nothing to test")
	}
	s.Release()
	if n, _ := s.log.chunkCount(); n != 0 {
		t.Fatalf("%d chunks kept after Release", n)
	}
}

// chunkCount reports the chunks allocated and not left to the GC, and how
// many of them are free.
func (l *Log) chunkCount() (all, free int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chunks, len(l.free)
}

// A deterministic mix of writes, copies, acknowledgements, spills and
// readers that hold their batches across all of them: every record a
// batch holds keeps its bytes until the reader moves on, and at the end
// every chunk is free again (no reference leaked or dropped twice).
func TestHeldBatchesAgainstAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := NewLog(Limits{MemBytes: 48 << 10, SpillBytes: 256 << 20, SpillDir: t.TempDir()})
	defer l.Release()
	type span struct{ off, n int }
	var recs []span // recs[seq-1]
	var w writer
	off := 0
	type reader struct {
		b      batch
		cursor uint64
	}
	readers := make([]reader, 3)
	check := func(k int) {
		t.Helper()
		for _, r := range readers[k].b.recs {
			want := recs[r.Seq-1]
			if len(r.Data) != want.n {
				t.Fatalf("reader %d, record %d: %d bytes, want %d", k, r.Seq, len(r.Data), want.n)
			}
			if bad := mismatch(r.Data, want.off); bad >= 0 {
				t.Fatalf("reader %d, record %d: wrong byte at offset %d", k, r.Seq, bad)
			}
		}
	}
	for step := 0; step < 20000; step++ {
		switch op := rng.IntN(100); {
		case op < 40: // the pump reads straight into its chunk
			buf := l.space(&w)
			n := 1 + rng.IntN(len(buf))
			fill(buf[:n], off)
			if _, err := l.commit(&w, "stdout", n); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, span{off, n})
			off += n
		case op < 45: // a copied record
			b := make([]byte, 1+rng.IntN(300))
			fill(b, off)
			if _, err := l.Append("stderr", b); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, span{off, len(b)})
			off += len(b)
		case op < 55:
			l.Ack(uint64(rng.IntN(len(recs) + 1)))
		case op < 95: // a reader checks what it holds, then moves on
			k := rng.IntN(len(readers))
			rd := &readers[k]
			check(k)
			if n := len(rd.b.recs); n > 0 {
				rd.cursor = rd.b.recs[n-1].Seq
			}
			_, _, err := l.read(&rd.b, rd.cursor, 1+rng.IntN(300), false)
			if errors.Is(err, ErrBehind) {
				rd.cursor = l.State().Acked
				_, _, err = l.read(&rd.b, rd.cursor, 1+rng.IntN(300), false)
			}
			if err != nil {
				t.Fatal(err)
			}
			check(k)
		default: // a reader stops
			k := rng.IntN(len(readers))
			check(k)
			l.unpin(&readers[k].b)
		}
	}
	for k := range readers {
		check(k)
		l.unpin(&readers[k].b)
	}
	l.closeWriter(&w)
	l.Ack(uint64(len(recs)))
	if all, free := l.chunkCount(); all != free {
		t.Fatalf("%d chunks, %d free: a reference leaked", all, free)
	}
	if st := l.State(); st.Next != uint64(len(recs))+1 {
		t.Fatalf("%d records in the log, %d written", st.Next-1, len(recs))
	}
}
