package supervisor

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

// Client is a reference client of the protocol (what a daemon speaks): it
// sends requests, matches responses by id, and delivers pushed events.
type Client struct {
	c      net.Conn
	wmu    sync.Mutex
	mu     sync.Mutex
	n      int
	wait   map[string]chan Response
	Events chan Event
	done   chan struct{}
	err    error
	// refusal is a response to no request: the supervisor refusing the
	// connection itself (busy, a frame it could not read) before closing.
	refusal *Error
}

// Dial connects to the supervisor's socket.
func Dial(socket string) (*Client, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return nil, err
	}
	return newClient(c, 1<<16), nil
}

// newClient buffers up to events pushed events; a full buffer stops reading
// from the connection until the consumer catches up.
func newClient(c net.Conn, events int) *Client {
	cl := &Client{c: c, wait: map[string]chan Response{}, Events: make(chan Event, events), done: make(chan struct{})}
	go cl.read()
	return cl
}

func (c *Client) read() {
	defer close(c.done)
	defer close(c.Events)
	sc := bufio.NewScanner(c.c)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var probe struct {
			Event string `json:"event"`
		}
		line := sc.Bytes()
		if json.Unmarshal(line, &probe) != nil {
			c.err = fmt.Errorf("supervisor sent a non-JSON line")
			return
		}
		if probe.Event != "" {
			var e Event
			if json.Unmarshal(line, &e) == nil {
				c.Events <- e
			}
			continue
		}
		var r Response
		if json.Unmarshal(line, &r) != nil {
			continue
		}
		if r.ID == "" && !r.OK && r.Error != nil {
			c.refusal = r.Error
		}
		c.mu.Lock()
		ch := c.wait[r.ID]
		delete(c.wait, r.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	c.err = sc.Err()
}

// Call sends a request (V and ID are filled in) and waits for its response;
// a refusal comes back as *Error.
func (c *Client) Call(ctx context.Context, req Request, result any) error {
	c.mu.Lock()
	c.n++
	req.V, req.ID = Version, "c"+strconv.Itoa(c.n)
	ch := make(chan Response, 1)
	c.wait[req.ID] = ch
	c.mu.Unlock()
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	_, err = c.c.Write(append(data, '\n'))
	c.wmu.Unlock()
	if err != nil {
		// A refused connection is closed; say why rather than "broken pipe".
		select {
		case <-c.done:
			if c.refusal != nil {
				return c.refusal
			}
		case <-ctx.Done():
		}
		return err
	}
	select {
	case r := <-ch:
		return decodeResponse(r, result)
	case <-c.done:
		// A peer that answers and then closes (a released holder exits)
		// makes both ready at once: the answer wins.
		select {
		case r := <-ch:
			return decodeResponse(r, result)
		default:
		}
		if c.refusal != nil {
			return c.refusal
		}
		return fmt.Errorf("connection closed: %v", c.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// decodeResponse is a response's outcome: its refusal, or its result decoded
// into result.
func decodeResponse(r Response, result any) error {
	if !r.OK {
		if r.Error == nil {
			return errors.New("supervisor refused without an error")
		}
		return r.Error
	}
	if result != nil && r.Result != nil {
		b, _ := json.Marshal(r.Result)
		return json.Unmarshal(b, result)
	}
	return nil
}

// Close drops the connection (as a crashing daemon would).
func (c *Client) Close() error { return c.c.Close() }
