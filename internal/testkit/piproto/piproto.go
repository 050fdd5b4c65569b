// Package piproto speaks Pi's RPC protocol (`pi --mode rpc`): JSON lines on
// stdin and stdout, split on LF only. Commands carry an id that Pi echoes
// in its `{"type":"response"}` frame; every other frame is an event.
//
// It is test support: the product never parses Pi's frames. The supervisor
// and its bridge move bytes and replay them by sequence, and the daemon on
// the other side of the socket is the one that speaks Pi; only the tests
// (launcher transport, e2e, benchmarks) play that daemon here.
package piproto

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// Frame is one line Pi wrote, decoded for routing, with the raw line kept.
type Frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Command string          `json:"command,omitempty"`
	Success *bool           `json:"success,omitempty"`
	Error   string          `json:"error,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	Raw     []byte          `json:"-"`
}

// IsResponse reports whether the frame answers a command.
func (f Frame) IsResponse() bool { return f.Type == "response" }

// OK reports whether a response frame says success.
func (f Frame) OK() bool { return f.Success != nil && *f.Success }

// MaxLine bounds one frame; a longer line is a protocol error, not a
// reason to buffer without limit.
const MaxLine = 16 << 20

// Client drives one Pi process.
type Client struct {
	w  io.Writer
	mu sync.Mutex // serializes writes and id allocation
	n  int

	frames chan Frame
	err    error
	done   chan struct{}
}

// New starts reading frames from r (Pi's stdout) and writes commands to w
// (Pi's stdin). Frames are read continuously so Pi never blocks on a full
// pipe while the caller is busy.
func New(r io.Reader, w io.Writer) *Client {
	c := &Client{w: w, frames: make(chan Frame, 4096), done: make(chan struct{})}
	go c.read(r)
	return c
}

func (c *Client) read(r io.Reader) {
	defer close(c.done)
	defer close(c.frames)
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			var f Frame
			if jerr := json.Unmarshal(line, &f); jerr != nil {
				c.err = fmt.Errorf("piproto: not a JSON frame: %.120q", line)
				return
			}
			f.Raw = line
			c.frames <- f
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.err = err
			}
			return
		}
	}
}

// readLine reads up to LF (not CR, not U+2028: Pi splits on LF only).
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxLine {
			return nil, fmt.Errorf("piproto: frame longer than %d bytes", MaxLine)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		return line, err
	}
}

// Send writes one command and returns its id. cmd must have a "type".
func (c *Client) Send(cmd map[string]any) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	id := "req_" + strconv.Itoa(c.n)
	m := map[string]any{"id": id}
	for k, v := range cmd {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	_, err = c.w.Write(append(b, '\n'))
	return id, err
}

// Next returns the next frame, or an error when Pi's stdout ended or the
// context is done.
func (c *Client) Next(ctx context.Context) (Frame, error) {
	select {
	case f, ok := <-c.frames:
		if !ok {
			if c.err != nil {
				return Frame{}, c.err
			}
			return Frame{}, io.EOF
		}
		return f, nil
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	}
}

// Until reads frames until one satisfies match, returning it and every
// frame read before it (events of a turn, for assertions).
func (c *Client) Until(ctx context.Context, match func(Frame) bool) (Frame, []Frame, error) {
	var seen []Frame
	for {
		f, err := c.Next(ctx)
		if err != nil {
			return Frame{}, seen, err
		}
		if match(f) {
			return f, seen, nil
		}
		seen = append(seen, f)
	}
}

// Call sends a command and waits for its response, returning the events
// that arrived in between.
func (c *Client) Call(ctx context.Context, cmd map[string]any) (Frame, []Frame, error) {
	id, err := c.Send(cmd)
	if err != nil {
		return Frame{}, nil, err
	}
	return c.Until(ctx, func(f Frame) bool { return f.IsResponse() && f.ID == id })
}

// Response matches the response to id.
func Response(id string) func(Frame) bool {
	return func(f Frame) bool { return f.IsResponse() && f.ID == id }
}

// Event matches an event of type t.
func Event(t string) func(Frame) bool {
	return func(f Frame) bool { return f.Type == t }
}

// Types lists the frame types, for ordering assertions.
func Types(fs []Frame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Type
	}
	return out
}
