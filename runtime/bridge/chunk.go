package bridge

import "time"

// Output data lives in chunks: fixed-size buffers that the log recycles,
// so passing output through costs one copy (the kernel's, into the
// pump's chunk) into memory that is already mapped and warm, instead of a
// new heap buffer per record that the GC must free and the scavenger
// return (docs/benchmarks.md, "Bridge").
//
// A chunk is recycled only when nothing refers to it any more. refs counts,
// under Log.mu: the records in memory whose Data is in the chunk, the
// writer that has it open, and each reader batch that pinned it.
type chunk struct {
	buf  []byte
	used int // bytes handed out; only the writer that has it open touches it
	refs int // under Log.mu
}

const (
	maxChunk = 64 << 10
	minChunk = 4 << 10
	// maxRead caps a pump read, so a record is at most 32 KiB, as it
	// always was.
	maxRead = 32 << 10
	// maxPins bounds the chunks one reader batch holds: memory beyond
	// MemBytes that a slow reader can keep alive.
	maxPins = 4
	// idleRelease is how long free chunks wait for a writer before they
	// are left to the GC.
	idleRelease = 5 * time.Second
)

// chunkSize scales chunks down for small logs, so a log holds a few of
// them rather than a fraction of one.
func chunkSize(memBytes int64) int {
	cs := maxChunk
	for cs > minChunk && int64(cs)*4 > memBytes {
		cs /= 2
	}
	return cs
}

// writer is one pump's open chunk. The bytes after c.used belong to the
// pump alone: it reads into them without the lock, and commit turns the
// filled part into a record.
type writer struct {
	c *chunk
}

// space returns the free tail of w's chunk (at most maxRead bytes), first
// taking a new chunk when little is left.
func (l *Log) space(w *writer) []byte {
	if w.c == nil || len(w.c.buf)-w.c.used < l.minTail {
		l.mu.Lock()
		if w.c != nil {
			l.unref(w.c)
		}
		w.c = l.takeChunk()
		l.mu.Unlock()
	}
	return w.c.buf[w.c.used:min(len(w.c.buf), w.c.used+maxRead)]
}

// closeWriter gives up w's chunk; it is recycled once its records are gone.
func (l *Log) closeWriter(w *writer) {
	if w.c == nil {
		return
	}
	l.mu.Lock()
	l.unref(w.c)
	l.mu.Unlock()
	w.c = nil
}

// takeChunk returns a chunk with one reference (its writer's). Called with
// mu held.
func (l *Log) takeChunk() *chunk {
	if n := len(l.free); n > 0 {
		c := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		l.freeUsed = true
		c.refs = 1
		return c
	}
	l.chunks++
	l.peakChunks = max(l.peakChunks, l.chunks)
	return &chunk{buf: make([]byte, l.chunkSize), refs: 1}
}

// unref drops one reference; the last one puts the chunk on the free list,
// or leaves it to the GC when the list is full or the log released. Called
// with mu held.
func (l *Log) unref(c *chunk) {
	c.refs--
	if c.refs > 0 {
		return
	}
	if c.refs < 0 {
		panic("bridge: chunk released twice")
	}
	if l.released || len(l.free) >= l.maxFree {
		l.chunks--
		return
	}
	c.used = 0
	l.free = append(l.free, c)
	l.armIdle()
}

func (l *Log) armIdle() {
	if l.idle == nil {
		l.idle = time.AfterFunc(l.idleAfter, l.dropIdle)
	}
}

// dropIdle leaves the free chunks and the spare spill buffer to the GC
// when no writer took a chunk for a whole idle period.
func (l *Log) dropIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.idle == nil { // Release came first
		return
	}
	if l.freeUsed {
		l.freeUsed = false
		l.idle.Reset(l.idleAfter)
		return
	}
	l.dropFree()
	l.idle = nil
}

// dropFree leaves the free chunks and the spare spill buffer to the GC.
// Called with mu held.
func (l *Log) dropFree() {
	l.chunks -= len(l.free)
	clear(l.free)
	l.free = nil
	l.spare = nil
}

// batch is what a reader holds between two reads: records, and what
// their Data points into: pinned chunks, and the buffer of the last read
// from the spill file. Both stay valid until the next read into the batch
// or unpin.
type batch struct {
	recs     []Record
	pins     []*chunk
	spillBuf []byte
}

// pin takes a reference on c for b; false when b already holds maxPins
// other chunks. Called with mu held.
func (l *Log) pin(b *batch, c *chunk) bool {
	for _, p := range b.pins {
		if p == c {
			return true
		}
	}
	if len(b.pins) == maxPins {
		return false
	}
	c.refs++
	b.pins = append(b.pins, c)
	return true
}

// unpin releases b's chunks and spill buffer and empties it.
func (l *Log) unpin(b *batch) {
	if len(b.pins) > 0 || b.spillBuf != nil {
		l.mu.Lock()
		l.unpinLocked(b)
		l.putSpare(b)
		l.mu.Unlock()
	}
	clear(b.recs)
	b.recs = b.recs[:0]
}

// putSpare keeps b's spill buffer for the next replay: a reattaching
// client's replay then allocates nothing. Called with mu held.
func (l *Log) putSpare(b *batch) {
	if b.spillBuf != nil && !l.released && cap(b.spillBuf) > cap(l.spare) {
		l.spare = b.spillBuf
		l.armIdle()
	}
	b.spillBuf = nil
}

func (l *Log) unpinLocked(b *batch) {
	for _, c := range b.pins {
		l.unref(c)
	}
	clear(b.pins)
	b.pins = b.pins[:0]
	clear(b.recs)
	b.recs = b.recs[:0]
}
