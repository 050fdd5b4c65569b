// Package linerpc is the client side of the two JSON-lines protocols this
// tool serves: the supervisor's (what a daemon speaks) and a holder's
// (what the supervisor speaks). Both frame one JSON object a line; a
// request carries an id its response echoes, and a line with an "event"
// field is pushed, not answered. What a response means (its ok, error and
// result) is each protocol's own; this package only carries lines.
package linerpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// MaxLine bounds one line a peer sends (an attach's replayed output
// record is the largest).
const MaxLine = 64 << 20

// Conn is one client connection. Events carries the pushed events,
// decoded as E; it is closed when the connection ends.
type Conn[E any] struct {
	c      net.Conn
	peer   string // "supervisor", "holder": for messages
	prefix string // of request ids
	Events chan E

	wmu  sync.Mutex // one request line at a time
	mu   sync.Mutex
	n    int
	wait map[string]chan json.RawMessage

	done    chan struct{} // closed when the reader ends; then err and refusal are set
	err     error
	refusal json.RawMessage
}

// New starts reading c. events bounds the events buffered; a full buffer
// stops reading from the connection until the consumer catches up.
func New[E any](c net.Conn, events int, peer, idPrefix string) *Conn[E] {
	cn := &Conn[E]{c: c, peer: peer, prefix: idPrefix, Events: make(chan E, events),
		wait: map[string]chan json.RawMessage{}, done: make(chan struct{})}
	go cn.read()
	return cn
}

// Refused is the peer refusing the connection itself (busy, a frame it
// could not read) in a response to no request, before closing. Line is
// that response, for the protocol to decode.
type Refused struct{ Line json.RawMessage }

func (r *Refused) Error() string { return "refused the connection: " + string(r.Line) }

// Refusal is err as the protocol's own error when it is a *Refused whose
// line carries one (a busy answer, a frame the peer could not read), so a
// caller matches the same typed error, with all its fields, whether its
// request or its connection was refused; any other err is returned as is.
func Refusal[Err error](err error, peer string) error {
	var r *Refused
	if !errors.As(err, &r) {
		return err
	}
	if e := Decode[Err](r.Line, peer, nil); e != nil {
		var typed Err
		if errors.As(e, &typed) {
			return typed
		}
	}
	return err
}

func (c *Conn[E]) read() {
	defer close(c.done)
	defer close(c.Events)
	sc := bufio.NewScanner(c.c)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	for sc.Scan() {
		var head struct {
			Event string `json:"event"`
			ID    string `json:"id"`
		}
		line := sc.Bytes()
		if json.Unmarshal(line, &head) != nil {
			c.err = fmt.Errorf("%s sent a non-JSON line", c.peer)
			return
		}
		if head.Event != "" {
			var e E
			if json.Unmarshal(line, &e) == nil {
				c.Events <- e
			}
			continue
		}
		c.mu.Lock()
		ch := c.wait[head.ID]
		delete(c.wait, head.ID)
		if ch == nil && head.ID == "" {
			c.refusal = append(json.RawMessage(nil), line...)
		}
		c.mu.Unlock()
		if ch != nil {
			ch <- append(json.RawMessage(nil), line...)
		}
	}
	c.err = sc.Err()
}

// Call sends the request frame(id) makes for a fresh id and returns the
// line that answers it. A connection the peer refused and closed gives a
// *Refused; one that ended otherwise says so.
func (c *Conn[E]) Call(ctx context.Context, frame func(id string) any) (json.RawMessage, error) {
	c.mu.Lock()
	c.n++
	id := c.prefix + strconv.Itoa(c.n)
	ch := make(chan json.RawMessage, 1)
	c.wait[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.wait, id)
		c.mu.Unlock()
	}()
	data, err := json.Marshal(frame(id))
	if err != nil {
		return nil, err
	}
	c.wmu.Lock()
	_, err = c.c.Write(append(data, '\n'))
	c.wmu.Unlock()
	if err != nil {
		// A refused connection is closed; say why rather than "broken pipe".
		select {
		case <-c.done:
			if c.refusal != nil {
				return nil, &Refused{Line: c.refusal}
			}
		case <-ctx.Done():
		}
		return nil, err
	}
	select {
	case line := <-ch:
		return line, nil
	case <-c.done:
		// A peer that answers and then closes (a released holder exits)
		// makes both ready at once: the answer wins.
		select {
		case line := <-ch:
			return line, nil
		default:
		}
		if c.refusal != nil {
			return nil, &Refused{Line: c.refusal}
		}
		return nil, fmt.Errorf("connection closed: %v", c.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close drops the connection (and with it an attach's stream).
func (c *Conn[E]) Close() error { return c.c.Close() }

// Decode is a response's outcome for protocols whose responses are
// {ok, error, result}: the refusal (refusal's error, or a generic one when
// the peer gave none), or result decoded into out.
func Decode[Err error](line json.RawMessage, peer string, out any) error {
	var r struct {
		OK     bool            `json:"ok"`
		Error  json.RawMessage `json:"error"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Errorf("%s sent a malformed response: %v", peer, err)
	}
	if !r.OK {
		if len(r.Error) == 0 || string(r.Error) == "null" {
			return fmt.Errorf("%s refused without an error", peer)
		}
		var e Err
		if err := json.Unmarshal(r.Error, &e); err != nil {
			return fmt.Errorf("%s sent a malformed error: %v", peer, err)
		}
		return e
	}
	if out != nil && len(r.Result) > 0 && string(r.Result) != "null" {
		return json.Unmarshal(r.Result, out)
	}
	return nil
}
