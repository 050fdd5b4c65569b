package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"
)

// maxSpillRead bounds one replay read from the spill file.
const maxSpillRead = 1 << 20

type spillRef struct {
	seq uint64
	off int64
	n   int64
}

// spillOldest moves the oldest in-memory record to the spill file; false
// means the spill file is full. Called with mu held.
func (l *Log) spillOldest() (bool, error) {
	r := l.mem[0].Record
	l.scratch = appendFrame(l.scratch[:0], r)
	if l.spillEnd+int64(len(l.scratch)) > l.lim.SpillBytes {
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
	if _, err := l.spill.WriteAt(l.scratch, l.spillEnd); err != nil {
		return false, fmt.Errorf("bridge: spill: %w", err)
	}
	l.spilled = append(l.spilled, spillRef{seq: r.Seq, off: l.spillEnd, n: int64(len(l.scratch))})
	l.spillEnd += int64(len(l.scratch))
	l.dropOldest()
	return true, nil
}

// A frame is seq, time (Unix ns), stream name length and name, data length
// and data.
func appendFrame(b []byte, r Record) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Time.UnixNano()))
	b = append(b, byte(len(r.Stream)))
	b = append(b, r.Stream...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Data)))
	return append(b, r.Data...)
}

var errFrame = errors.New("bridge: corrupt spill frame")

// decodeFrame returns the record in b; its Data aliases b.
func decodeFrame(b []byte) (Record, error) {
	if len(b) < 21 {
		return Record{}, errFrame
	}
	var r Record
	r.Seq = binary.BigEndian.Uint64(b)
	r.Time = time.Unix(0, int64(binary.BigEndian.Uint64(b[8:]))).UTC()
	sl := int(b[16])
	if len(b) < 21+sl {
		return Record{}, errFrame
	}
	r.Stream = streamName(b[17 : 17+sl])
	dl := int(binary.BigEndian.Uint32(b[17+sl:]))
	if len(b) != 21+sl+dl {
		return Record{}, errFrame
	}
	r.Data = b[21+sl : len(b) : len(b)]
	return r, nil
}

// streamName avoids a string allocation per record for the usual names.
func streamName(b []byte) string {
	switch string(b) {
	case "stdout":
		return "stdout"
	case "stderr":
		return "stderr"
	case "exit":
		return "exit"
	}
	return string(b)
}

// readSpilled appends to b up to limit spilled records with seq > after.
// They are contiguous in the file, so it finds the first by binary search
// and reads them all (up to maxSpillRead bytes) with one pread into b's
// buffer, which their Data aliases. A reader following live output keeps
// no buffer. Called with mu held.
func (l *Log) readSpilled(b *batch, after uint64, limit int) error {
	i := sort.Search(len(l.spilled), func(k int) bool { return l.spilled[k].seq > after })
	if i == len(l.spilled) || limit <= 0 {
		l.putSpare(b)
		return nil
	}
	start := l.spilled[i].off
	j := i + 1
	for j < len(l.spilled) && j-i < limit && l.spilled[j].off+l.spilled[j].n-start <= maxSpillRead {
		j++
	}
	last := l.spilled[j-1]
	size := int(last.off + last.n - start)
	if cap(b.spillBuf) < size && cap(l.spare) >= size {
		b.spillBuf, l.spare = l.spare, nil
	}
	if cap(b.spillBuf) < size {
		b.spillBuf = make([]byte, size, max(size, maxSpillRead))
	}
	buf := b.spillBuf[:size]
	if n, err := l.spill.ReadAt(buf, start); n != len(buf) {
		return fmt.Errorf("bridge: spill read: %w", err)
	}
	for _, ref := range l.spilled[i:j] {
		r, err := decodeFrame(buf[ref.off-start : ref.off-start+ref.n])
		if err == nil && r.Seq != ref.seq {
			err = errFrame
		}
		if err != nil {
			return err
		}
		b.recs = append(b.recs, r)
	}
	return nil
}
