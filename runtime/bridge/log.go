// Package bridge keeps a sandboxed process's conversation alive across
// client disconnects: it drains the process's output continuously into a
// bounded, sequenced log, replays what a reattaching client missed, and
// fences writers so only the newest attachment can send input. It moves
// bytes and records only; what the bytes mean (Pi's JSONL) is the
// daemon's business (the tests speak it through internal/testkit/piproto).
package bridge

import (
	"errors"
	"os"
	"sort"
	"sync"
	"time"
)

// Record is one chunk of output, numbered from 1 in the order it was read.
// Stream is "stdout", "stderr" or "exit" (Data then holds the exit status
// as decimal text; it is always the last record). Data handed to
// Session.Stream's fn is valid only during the call; Log.Read returns
// copies.
type Record struct {
	Seq    uint64    `json:"seq"`
	Stream string    `json:"stream"`
	Data   []byte    `json:"data"`
	Time   time.Time `json:"time"`
}

// Limits bound the log. Output beyond MemBytes goes to a spill file; when
// the spill file would pass SpillBytes too, Append blocks until a client
// acknowledges records, so the process's writes block and nothing is lost
// (the documented back-pressure policy; the process is never killed for
// having an absent client).
type Limits struct {
	MemBytes   int64
	SpillBytes int64
	// SpillDir holds the spill file (root-only; it is created 0600 and
	// unlinked at once, so only this process can read it).
	SpillDir string
}

// ErrBehind is returned when a client asks for records it already
// acknowledged: they are gone, and the client's cursor went backwards.
var ErrBehind = errors.New("bridge: cursor is behind the acknowledged position")

// ErrClosed is returned by Append after Close.
var ErrClosed = errors.New("bridge: log closed")

// Log is the sequenced output of one process.
type Log struct {
	lim Limits

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on a change, if watched
	watched  bool
	mem      []memRecord // records after the spilled ones
	memBytes int64
	spill    *os.File
	spilled  []spillRef // records in the spill file, oldest first
	spillEnd int64
	scratch  []byte // one spill frame
	spare    []byte // a reader's spill buffer, for the next replay
	next     uint64 // seq of the next record
	acked    uint64 // every record <= acked may be dropped
	closed   bool
	paused   bool

	// Chunks (chunk.go): memory stays at about MemBytes, plus the chunk
	// each pump has open and those reader batches pin.
	chunkSize  int
	minTail    int // a pump takes a new chunk when less than this is left
	free       []*chunk
	maxFree    int
	freeUsed   bool // a chunk came off the free list this idle period
	idle       *time.Timer
	idleAfter  time.Duration
	released   bool
	chunks     int // chunks allocated and not yet left to the GC
	peakChunks int // the most chunks at once, for the memory-bound test
}

// memRecord is a record in memory; c is the chunk holding its Data, or nil
// when Data is a buffer of its own (Append's copy).
type memRecord struct {
	Record
	c *chunk
}

// NewLog returns an empty log.
func NewLog(lim Limits) *Log {
	if lim.MemBytes <= 0 {
		lim.MemBytes = 4 << 20
	}
	if lim.SpillBytes <= 0 {
		lim.SpillBytes = 64 << 20
	}
	cs := chunkSize(lim.MemBytes)
	return &Log{
		lim: lim, next: 1, changed: make(chan struct{}),
		chunkSize: cs, minTail: min(cs, maxRead) / 8,
		maxFree: int(lim.MemBytes/int64(cs)) + 2, idleAfter: idleRelease,
	}
}

// notify closes changed if anyone took it since the last change, so a
// stream of appends that nobody waits for costs no channel each.
func (l *Log) notify() {
	if l.watched {
		close(l.changed)
		l.changed = make(chan struct{})
		l.watched = false
	}
}

// changedCh returns the channel the next change closes. Called with mu
// held.
func (l *Log) changedCh() chan struct{} {
	l.watched = true
	return l.changed
}

// Append adds a copy of data as a record and returns its seq. It blocks
// while the log is full (memory and spill) until Ack frees room or the log
// closes.
func (l *Log) Append(stream string, data []byte) (uint64, error) {
	rec := Record{Stream: stream, Data: append([]byte(nil), data...), Time: time.Now().UTC()}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.add(memRecord{Record: rec})
}

// commit makes the next n bytes of w's chunk (filled since space) a
// record, without copying them. It blocks like Append.
func (l *Log) commit(w *writer, stream string, n int) (uint64, error) {
	c := w.c
	rec := Record{Stream: stream, Data: c.buf[c.used : c.used+n : c.used+n], Time: time.Now().UTC()}
	l.mu.Lock()
	defer l.mu.Unlock()
	seq, err := l.add(memRecord{Record: rec, c: c})
	if err == nil {
		c.used += n
		c.refs++
	}
	return seq, err
}

// add waits for room, then numbers and keeps m. Called with mu held.
func (l *Log) add(m memRecord) (uint64, error) {
	size := int64(len(m.Data)) + 64
	for {
		if l.closed {
			return 0, ErrClosed
		}
		if l.memBytes+size <= l.lim.MemBytes || len(l.mem) == 0 {
			break
		}
		ok, err := l.spillOldest()
		if err != nil {
			return 0, err
		}
		if ok {
			continue
		}
		// Full: wait for an acknowledgement.
		l.paused = true
		ch := l.changedCh()
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
	l.paused = false
	m.Seq = l.next
	l.next++
	l.mem = append(l.mem, m)
	l.memBytes += size
	l.notify()
	return m.Seq, nil
}

// dropOldest forgets the oldest in-memory record (spilled or
// acknowledged). Called with mu held.
func (l *Log) dropOldest() {
	m := l.mem[0]
	l.mem[0] = memRecord{}
	l.mem = l.mem[1:]
	l.memBytes -= int64(len(m.Data)) + 64
	if m.c != nil {
		l.unref(m.c)
	}
}

// Read returns up to max records with seq > after, in order, and a channel
// that is closed when the log changes (for waiting when none are ready).
// done is true when the log is closed and everything after `after` has
// been returned. The records' Data are copies the caller may keep.
func (l *Log) Read(after uint64, max int) (recs []Record, changed <-chan struct{}, done bool, err error) {
	var b batch
	changed, done, err = l.read(&b, after, max, true)
	for _, r := range b.recs {
		r.Data = append([]byte(nil), r.Data...)
		recs = append(recs, r)
	}
	l.unpin(&b)
	if err != nil {
		return nil, nil, false, err
	}
	return recs, changed, done, nil
}

// read replaces b's records with up to max records with seq > after,
// without copying: Data stays valid until the next read into b or unpin
// (b pins the chunks and holds the spill buffer it points into).
// It may return fewer than max when a batch would pin more than maxPins
// chunks. changed is nil when there are records and !watch: a reader busy
// with records does not make every append allocate a channel.
func (l *Log) read(b *batch, after uint64, max int, watch bool) (changed <-chan struct{}, done bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unpinLocked(b)
	if after < l.acked {
		return nil, false, ErrBehind
	}
	if err := l.readSpilled(b, after, max); err != nil {
		return nil, false, err
	}
	last := after
	if n := len(b.recs); n > 0 {
		last = b.recs[n-1].Seq
	}
	// mem holds consecutive seqs.
	i := 0
	if len(l.mem) > 0 && last >= l.mem[0].Seq {
		i = int(last - l.mem[0].Seq + 1)
	}
	for ; i < len(l.mem) && len(b.recs) < max; i++ {
		m := &l.mem[i]
		if m.Seq != last+1 { // the records before it are still in the spill file
			break
		}
		if m.c != nil && !l.pin(b, m.c) {
			break
		}
		b.recs = append(b.recs, m.Record)
		last = m.Seq
	}
	done = l.closed && last+1 >= l.next
	if len(b.recs) == 0 && !done || watch {
		changed = l.changedCh()
	}
	return changed, done, nil
}

// Ack drops every record <= seq: the client has them.
func (l *Log) Ack(seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if seq >= l.next {
		seq = l.next - 1
	}
	if seq <= l.acked {
		return
	}
	l.acked = seq
	i := sort.Search(len(l.spilled), func(k int) bool { return l.spilled[k].seq > seq })
	l.spilled = l.spilled[i:]
	if len(l.spilled) == 0 && l.spill != nil {
		// Everything spilled is acknowledged: start the file over.
		_ = l.spill.Truncate(0)
		l.spillEnd = 0
	}
	for len(l.mem) > 0 && l.mem[0].Seq <= seq {
		l.dropOldest()
	}
	l.notify()
}

// Close ends the log: no more appends; readers drain what is left.
func (l *Log) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	l.notify()
}

// Release frees the spill file and the free chunks; call after Close when
// no reader remains. Chunks still holding records are left to the GC once
// they are acknowledged or the log is dropped.
func (l *Log) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spill != nil {
		l.spill.Close()
		l.spill = nil
	}
	l.released = true
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	l.dropFree()
	l.scratch = nil
}

// State is a snapshot for inspect.
type State struct {
	Next       uint64 `json:"next"`
	Acked      uint64 `json:"acked"`
	MemBytes   int64  `json:"memBytes"`
	SpillBytes int64  `json:"spillBytes"`
	// Paused is true while the process's output waits for an
	// acknowledgement because memory and spill are full.
	Paused bool `json:"paused"`
	Closed bool `json:"closed"`
}

// State reports the log's position and use.
func (l *Log) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return State{Next: l.next, Acked: l.acked, MemBytes: l.memBytes, SpillBytes: l.spillEnd, Paused: l.paused, Closed: l.closed}
}
