// Package lineserve is the server side of the JSON-lines protocols this
// tool serves, the supervisor's (what a daemon speaks) and a holder's
// (what the supervisor speaks), as internal/linerpc is their client side:
// the socket and its accept loop, the peer's credentials, and one
// connection's loop (bounded frames with a bound per op, strict
// decoding, one response per request, responses and pushed events
// written one line at a time). What an op does, who may ask, and the
// error type are each protocol's own: this package imports neither.
package lineserve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Head is what the loop reads of every request.
type Head struct {
	V      int
	ID, Op string
}

// Request is a protocol's request: a struct decoded strictly (unknown
// fields refused) from one line, which gives the loop its head.
type Request interface{ Head() Head }

// Response answers one request by its id, in both protocols: ok with a
// result, or an error. A refusal of the connection or of a frame too
// broken to have an id has the id "".
type Response[E any] struct {
	V      int    `json:"v"`
	ID     string `json:"id"`
	OK     bool   `json:"ok"`
	Result any    `json:"result,omitempty"`
	Error  E      `json:"error,omitempty"`
}

// Protocol is what the loop needs of one protocol: R its request type, E
// its error (a pointer type: the zero E is no error).
type Protocol[R Request, E comparable] struct {
	Version int
	// MaxFrame bounds every request line; an op of Frames may grow to its
	// own bound (its op read from the first MaxFrame bytes).
	MaxFrame int
	Frames   map[string]int
	// FrameTimeout bounds a request's arrival once its first byte has;
	// IdleTimeout the wait for the next request while nothing streams to
	// the connection. Zero: no bound.
	FrameTimeout, IdleTimeout time.Duration
	// ReadBuffer is the size of a connection's read buffer.
	ReadBuffer int
	// Admit, when set, decides whether a peer is served: a nil release
	// turns the connection away, with refusal as its one response unless
	// that is the zero E. release is called when the connection ends.
	Admit func(Peer) (release func(), refusal E)
	// Malformed is the protocol's refusal of a frame it cannot read.
	Malformed func(message string) E
	// Handle answers one request. ctx ends with the connection, and with
	// it any stream Handle started.
	Handle func(ctx context.Context, c *Conn, req R) (result any, e E)
	// Answered, when set, runs once a request's success was sent; true
	// ends the connection.
	Answered func(req R) (end bool)
}

// Serve answers uc's requests, each with its response, until the peer
// hangs up, a frame cannot be read, a send fails or Answered ends it. A
// peer whose credentials cannot be read is not served.
func (p *Protocol[R, E]) Serve(ctx context.Context, uc *net.UnixConn) {
	defer uc.Close()
	peer, err := PeerOf(uc)
	if err != nil {
		return
	}
	cn := &Conn{c: uc, peer: peer, enc: json.NewEncoder(uc)}
	var none E
	if p.Admit != nil {
		release, refusal := p.Admit(peer)
		if release == nil {
			if refusal != none {
				_ = uc.SetWriteDeadline(time.Now().Add(time.Second))
				_ = cn.enc.Encode(Response[E]{V: p.Version, Error: refusal})
			}
			return
		}
		defer release()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	br := bufio.NewReaderSize(uc, p.ReadBuffer)
	for {
		if err := cn.awaitRequest(br, p.IdleTimeout); err != nil {
			return
		}
		line, err := p.read(uc, br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = cn.Send(Response[E]{V: p.Version, Error: p.Malformed(err.Error())})
			}
			return
		}
		var req R
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		err = dec.Decode(&req)
		h := req.Head()
		if err != nil || h.V != p.Version || h.ID == "" {
			_ = cn.Send(Response[E]{V: p.Version, ID: h.ID, Error: p.Malformed(fmt.Sprintf("want one JSON request with v %d, an id and known fields only", p.Version))})
			continue
		}
		if len(line) > p.limit(h.Op) {
			_ = cn.Send(Response[E]{V: p.Version, ID: h.ID, Error: p.Malformed(p.tooLong(h.Op))})
			return
		}
		result, e := p.Handle(cctx, cn, req)
		if err := cn.Send(Response[E]{V: p.Version, ID: h.ID, OK: e == none, Result: result, Error: e}); err != nil {
			return
		}
		if e == none && p.Answered != nil && p.Answered(req) {
			return
		}
	}
}

// read reads one frame within FrameTimeout.
func (p *Protocol[R, E]) read(uc *net.UnixConn, br *bufio.Reader) ([]byte, error) {
	if p.FrameTimeout > 0 {
		_ = uc.SetReadDeadline(time.Now().Add(p.FrameTimeout))
	}
	line, err := p.readFrame(br)
	_ = uc.SetReadDeadline(time.Time{})
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		err = fmt.Errorf("request did not arrive whole within %s", p.FrameTimeout)
	}
	return line, err
}
