package supervisor

import (
	"context"
	"net"

	"paseo.dev/paseo-policy/internal/linerpc"
)

// Client is a reference client of the protocol (what a daemon speaks): it
// sends requests, matches responses by id, and delivers pushed events.
type Client struct {
	conn   *linerpc.Conn[Event]
	Events <-chan Event
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
	conn := linerpc.New[Event](c, events, "supervisor", "c")
	return &Client{conn: conn, Events: conn.Events}
}

// Call sends a request (V and ID are filled in) and waits for its response;
// a refusal, of the request or of the connection, comes back as *Error
// (rpcerr.Error: its Code, and for rpcerr.Refused every diagnostic in
// Diagnostics).
func (c *Client) Call(ctx context.Context, req Request, result any) error {
	line, err := c.conn.Call(ctx, func(id string) any {
		req.V, req.ID = Version, id
		return req
	})
	if err != nil {
		return linerpc.Refusal[*Error](err, "supervisor")
	}
	return linerpc.Decode[*Error](line, "supervisor", result)
}

// Close drops the connection (as a crashing daemon would).
func (c *Client) Close() error { return c.conn.Close() }
