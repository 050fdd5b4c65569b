package supervisor

import (
	"fmt"
	"sync"
	"time"
)

// Limits bound what clients can take of the supervisor, a root process
// outside every sandbox's cgroup that any member of the socket group can
// reach. Zero fields take DefaultLimits. docs/supervisor.md gives each
// value's reason.
type Limits struct {
	// MaxConns bounds connections at once; MaxConnsPerUID those of one
	// peer uid, so that one daemon user cannot take every slot. Past
	// either, a connection gets one "busy" response and is closed.
	MaxConns, MaxConnsPerUID int
	// FrameTimeout is how long a request may take to arrive once its
	// first byte has: a client that sends half a frame is cut.
	FrameTimeout time.Duration
	// IdleTimeout is how long a connection may sit without a request
	// while it has no attachment streaming to it.
	IdleTimeout time.Duration
}

// DefaultLimits: a daemon keeps one control connection and one per
// attached sandbox, so 16 per uid covers a deployment's busy moments
// (several attaches at once) and 128 overall lets eight daemon users
// fill theirs. A frame over a Unix socket arrives in milliseconds; 10 s
// is slack for a loaded host. Two idle minutes is longer than any
// request gap of a connected daemon (its list/inspect polling).
var DefaultLimits = Limits{MaxConns: 128, MaxConnsPerUID: 16, FrameTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}

// Frame sizes. Every request but write is a handful of ids and, for
// createSandbox, the facts: the reference facts are about 2 KiB, and even
// a deployment with long paths (PATH_MAX is 4 KiB) and many grants stays
// far below 64 KiB. write carries agent input (Pi RPC lines, pasted files)
// and keeps the protocol's 1 MiB. A frame is read into memory whole, so
// the small limit is what bounds an idle flood: 64 KiB per connection.
const (
	MaxFrame      = 64 << 10
	MaxWriteFrame = 1 << 20
)

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxConns > 0 {
		d.MaxConns = l.MaxConns
	}
	if l.MaxConnsPerUID > 0 {
		d.MaxConnsPerUID = l.MaxConnsPerUID
	}
	if l.FrameTimeout > 0 {
		d.FrameTimeout = l.FrameTimeout
	}
	if l.IdleTimeout > 0 {
		d.IdleTimeout = l.IdleTimeout
	}
	return d
}

// gate counts connections overall and per peer uid.
type gate struct {
	mu      sync.Mutex
	lim     Limits
	total   int
	perUID  map[int]int
	refused int
}

// enter takes a slot for uid, or says why there is none.
func (g *gate) enter(uid int) (release func(), why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.total >= g.lim.MaxConns:
		why = fmt.Sprintf("the supervisor serves its cap of %d connections", g.lim.MaxConns)
	case g.perUID[uid] >= g.lim.MaxConnsPerUID:
		why = fmt.Sprintf("peer uid %d holds its cap of %d connections", uid, g.lim.MaxConnsPerUID)
	}
	if why != "" {
		g.refused++
		return nil, why
	}
	g.total++
	g.perUID[uid]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.total--
			if g.perUID[uid]--; g.perUID[uid] == 0 {
				delete(g.perUID, uid)
			}
		})
	}, ""
}

// Refused is how many connections the caps turned away.
func (s *Server) Refused() int {
	s.gate.mu.Lock()
	defer s.gate.mu.Unlock()
	return s.gate.refused
}
