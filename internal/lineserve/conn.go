package lineserve

import (
	"bufio"
	"encoding/json"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is one connection being served. Its writes (responses, and the
// events a stream pushes from its own goroutine) go out one whole line at
// a time.
type Conn struct {
	c    *net.UnixConn
	peer Peer
	wmu  sync.Mutex
	enc  *json.Encoder
	// streams counts the streams pushing to the connection (Streaming).
	streams atomic.Int32
}

// Peer is who connected.
func (c *Conn) Peer() Peer { return c.peer }

// Send writes v as one JSON line. A peer that reads nothing for 30 s
// fails the write, so a stuck client cannot hold a stream's goroutine.
func (c *Conn) Send(v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	return c.enc.Encode(v)
}

// Streaming counts a stream to the connection (an attachment's output)
// until done is called. While one runs, the idle timeout does not cut
// the connection: its client listens rather than asks.
func (c *Conn) Streaming() (done func()) {
	c.streams.Add(1)
	var once sync.Once
	return func() { once.Do(func() { c.streams.Add(-1) }) }
}

// awaitRequest waits for the first byte of the next request. Without a
// stream to the connection, idle ends the wait (and so the connection);
// with one, the client may stay silent while it listens. Zero idle waits
// for ever.
func (c *Conn) awaitRequest(br *bufio.Reader, idle time.Duration) error {
	for {
		if idle > 0 {
			_ = c.c.SetReadDeadline(time.Now().Add(idle))
		}
		_, err := br.Peek(1)
		if err == nil {
			return nil
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() && c.streams.Load() > 0 {
			continue
		}
		return err
	}
}
