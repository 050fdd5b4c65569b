package launcher

import (
	"io"
	"sync"
)

// limitWriter passes output through and calls onLimit once when the total
// across it and shared passes limit; output past the limit is dropped.
// stdout and stderr have one limitWriter each, written by exec's two
// copiers at once, so the shared total is counted under the total's lock.
type limitWriter struct {
	w       io.Writer
	limit   int64
	shared  *limitWriter
	onLimit func()

	mu    sync.Mutex // of the total: guards n and fired
	n     int64
	fired bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	total := l
	if l.shared != nil {
		total = l.shared
	}
	total.mu.Lock()
	if total.limit > 0 && total.n+int64(len(p)) > total.limit {
		fire := !total.fired
		total.fired = true
		total.mu.Unlock()
		if fire && l.onLimit != nil {
			l.onLimit()
		}
		return len(p), nil
	}
	total.n += int64(len(p))
	total.mu.Unlock()
	_, err := l.w.Write(p)
	return len(p), err
}
