// Package bridge keeps a sandboxed process's conversation alive across
// client disconnects: it drains the process's output continuously into a
// bounded, sequenced log, replays what a reattaching client missed, and
// fences writers so only the newest attachment can send input. It moves
// bytes and records only; what the bytes mean (Pi's JSONL) is an
// adapter's business (package piproto).
package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Record is one chunk of output, numbered from 1 in the order it was read.
// Stream is "stdout", "stderr" or "exit" (Data then holds the exit status
// as decimal text; it is always the last record).
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
	changed  chan struct{} // closed and replaced on every change
	mem      []Record      // records after the spilled ones
	memBytes int64
	spill    *os.File
	spilled  []spillRef // records in the spill file, oldest first
	spillEnd int64
	next     uint64 // seq of the next record
	acked    uint64 // every record <= acked may be dropped
	closed   bool
	paused   bool
}

type spillRef struct {
	seq uint64
	off int64
	n   int64
}

// NewLog returns an empty log.
func NewLog(lim Limits) *Log {
	if lim.MemBytes <= 0 {
		lim.MemBytes = 4 << 20
	}
	if lim.SpillBytes <= 0 {
		lim.SpillBytes = 64 << 20
	}
	return &Log{lim: lim, next: 1, changed: make(chan struct{})}
}

func (l *Log) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Append adds a record and returns its seq. It blocks while the log is
// full (memory and spill) until Ack frees room or the log closes.
func (l *Log) Append(stream string, data []byte) (uint64, error) {
	rec := Record{Stream: stream, Data: append([]byte(nil), data...), Time: time.Now().UTC()}
	size := int64(len(data)) + 64
	l.mu.Lock()
	defer l.mu.Unlock()
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
		ch := l.changed
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
	l.paused = false
	rec.Seq = l.next
	l.next++
	l.mem = append(l.mem, rec)
	l.memBytes += size
	l.notify()
	return rec.Seq, nil
}

// spillOldest moves the oldest in-memory record to the spill file; false
// means the spill file is full.
func (l *Log) spillOldest() (bool, error) {
	r := l.mem[0]
	frame := encode(r)
	if l.spillEnd+int64(len(frame)) > l.lim.SpillBytes {
		return false, nil
	}
	if l.spill == nil {
		f, err := os.CreateTemp(l.lim.SpillDir, ".bridge-spill-*")
		if err != nil {
			return false, fmt.Errorf("bridge: spill file: %w", err)
		}
		_ = os.Chmod(f.Name(), 0o600)
		_ = os.Remove(f.Name()) // only this process holds it now
		l.spill = f
	}
	if _, err := l.spill.WriteAt(frame, l.spillEnd); err != nil {
		return false, fmt.Errorf("bridge: spill: %w", err)
	}
	l.spilled = append(l.spilled, spillRef{seq: r.Seq, off: l.spillEnd, n: int64(len(frame))})
	l.spillEnd += int64(len(frame))
	l.mem = l.mem[1:]
	l.memBytes -= int64(len(r.Data)) + 64
	return true, nil
}

func encode(r Record) []byte {
	b := make([]byte, 0, 8+8+1+len(r.Stream)+4+len(r.Data))
	b = binary.BigEndian.AppendUint64(b, r.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Time.UnixNano()))
	b = append(b, byte(len(r.Stream)))
	b = append(b, r.Stream...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Data)))
	return append(b, r.Data...)
}

func (l *Log) readSpilled(ref spillRef) (Record, error) {
	buf := make([]byte, ref.n)
	if _, err := l.spill.ReadAt(buf, ref.off); err != nil && !errors.Is(err, io.EOF) {
		return Record{}, err
	}
	var r Record
	r.Seq = binary.BigEndian.Uint64(buf)
	r.Time = time.Unix(0, int64(binary.BigEndian.Uint64(buf[8:]))).UTC()
	sl := int(buf[16])
	r.Stream = string(buf[17 : 17+sl])
	dl := binary.BigEndian.Uint32(buf[17+sl:])
	r.Data = buf[21+sl : 21+sl+int(dl)]
	return r, nil
}

// Read returns up to max records with seq > after, in order, and a channel
// that is closed when the log changes (for waiting when none are ready).
// done is true when the log is closed and everything after `after` has
// been returned.
func (l *Log) Read(after uint64, max int) (recs []Record, changed <-chan struct{}, done bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if after < l.acked {
		return nil, nil, false, ErrBehind
	}
	for _, ref := range l.spilled {
		if len(recs) == max {
			break
		}
		if ref.seq <= after {
			continue
		}
		r, err := l.readSpilled(ref)
		if err != nil {
			return nil, nil, false, err
		}
		recs = append(recs, r)
	}
	for _, r := range l.mem {
		if len(recs) == max {
			break
		}
		if r.Seq > after {
			recs = append(recs, r)
		}
	}
	last := after
	if len(recs) > 0 {
		last = recs[len(recs)-1].Seq
	}
	return recs, l.changed, l.closed && last+1 >= l.next, nil
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
	i := 0
	for i < len(l.spilled) && l.spilled[i].seq <= seq {
		i++
	}
	l.spilled = l.spilled[i:]
	if len(l.spilled) == 0 && l.spill != nil {
		// Everything spilled is acknowledged: start the file over.
		_ = l.spill.Truncate(0)
		l.spillEnd = 0
	}
	j := 0
	for j < len(l.mem) && l.mem[j].Seq <= seq {
		l.memBytes -= int64(len(l.mem[j].Data)) + 64
		j++
	}
	l.mem = l.mem[j:]
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

// Release frees the spill file; call after Close when no reader remains.
func (l *Log) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spill != nil {
		l.spill.Close()
		l.spill = nil
	}
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
