package holder

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/lineio"
	"paseo.dev/paseo-policy/runtime/bridge"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// serve answers one connection. Only root may talk to a holder: the socket
// is 0600 in a 0700 directory, and the peer is checked anyway.
func (h *holder) serve(c *net.UnixConn) {
	defer c.Close()
	if uid, err := peerUID(c); err != nil || uid != 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends a stream this connection started
	cn := &conn{c: c, enc: json.NewEncoder(c)}
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		line, err := readLine(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = cn.send(Response{V: Version, Error: rpcerr.New(rpcerr.Malformed, "%v", err)})
			}
			return
		}
		var req Request
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.V != Version || req.ID == "" {
			_ = cn.send(Response{V: Version, ID: req.ID, Error: rpcerr.New(rpcerr.Malformed, "want one JSON request with v %d, an id and known fields only", Version)})
			continue
		}
		result, e := h.handle(ctx, cn, req)
		if err := cn.send(Response{V: Version, ID: req.ID, OK: e == nil, Result: result, Error: e}); err != nil {
			return
		}
		if req.Op == OpRelease && e == nil {
			h.end() // only now: the response has been sent
			return
		}
	}
}

// readLine reads one request line of at most MaxFrame bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	return lineio.Read(br, func(line []byte) error {
		if len(line) > MaxFrame {
			return fmt.Errorf("request longer than %d bytes", MaxFrame)
		}
		return nil
	})
}

// conn serializes a connection's responses and events.
type conn struct {
	c   *net.UnixConn
	wmu sync.Mutex
	enc *json.Encoder
}

func (c *conn) send(v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	return c.enc.Encode(v)
}

func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

func fail(code rpcerr.Code, format string, a ...any) *Error { return rpcerr.New(code, format, a...) }

func (h *holder) handle(ctx context.Context, cn *conn, req Request) (any, *Error) {
	switch req.Op {
	case OpAttach:
		if st := h.sess.State(); req.Cursor < st.Acked {
			return nil, fail(rpcerr.OutOfOrder, "cursor %d is behind the acknowledged %d", req.Cursor, st.Acked)
		}
		h.mu.Lock()
		if h.detach != nil {
			h.detach()
		}
		actx, stop := context.WithCancel(ctx)
		h.detach = stop
		epoch := h.sess.Attach()
		h.mu.Unlock()
		go func() {
			err := h.sess.Stream(actx, req.Cursor, func(r bridge.Record) error {
				return cn.send(Event{V: Version, Event: EventOutput, Sandbox: h.spec.ID, Seq: r.Seq, Stream: r.Stream, Data: r.Data})
			})
			reason := "sandbox ended"
			if errors.Is(err, context.Canceled) {
				reason = "superseded or connection closed"
			} else if err != nil {
				reason = err.Error()
			}
			_ = cn.send(Event{V: Version, Event: EventDetached, Sandbox: h.spec.ID, Reason: reason})
		}()
		return AttachResult{Epoch: epoch, Cursor: req.Cursor}, nil
	case OpHibernate:
		return h.hibernate()
	case OpWake:
		return h.wake(req.Secrets)
	case OpWrite:
		h.touched()
		applied, err := h.sess.Write(req.Epoch, req.InputID, req.Data)
		switch {
		case errors.Is(err, bridge.ErrFenced):
			return nil, fail(rpcerr.Fenced, "epoch %d is not the current attachment", req.Epoch)
		case errors.Is(err, bridge.ErrInputClosed):
			return nil, fail(rpcerr.State, "input closed")
		case err != nil:
			return nil, fail(rpcerr.State, "write: %v", err)
		}
		return WriteResult{Applied: applied}, nil
	case OpAck:
		h.sess.Ack(req.Cursor)
		return AckResult{Acked: req.Cursor}, nil
	case OpCloseInput:
		if err := h.sess.CloseInput(req.Epoch); err != nil {
			return nil, fail(rpcerr.Fenced, "%v", err)
		}
		return CloseResult{Closed: true}, nil
	case OpInspect:
		return h.state(), nil
	case OpMCPToken:
		if err := h.token.Set([]byte(req.MCPToken)); err != nil {
			return nil, fail(rpcerr.Malformed, "%v", err) // names no value
		}
		return map[string]bool{"mcpToken": true}, nil
	case OpStop:
		go h.proc.Stop() // the launcher stops runsc and tears everything down
		select {
		case <-h.done:
		case <-time.After(StopTimeout):
			return nil, fail(rpcerr.Internal, "sandbox %s did not stop", h.spec.ID)
		}
		h.mu.Lock()
		if h.detach != nil {
			h.detach()
		}
		h.mu.Unlock()
		return h.state(), nil
	case OpRelease:
		select {
		case <-h.done:
		default:
			return nil, fail(rpcerr.State, "sandbox %s still runs: stop it first", h.spec.ID)
		}
		h.sess.Release()
		return map[string]string{"released": h.spec.ID}, nil
	}
	return nil, fail(rpcerr.UnknownOp, "unknown holder op %q", req.Op)
}

func (h *holder) state() State {
	s := h.spec
	st := State{Sandbox: s.ID, Deployment: s.Deployment, Agent: s.Agent, Profile: s.Profile}
	select {
	case <-h.done:
		st.Exited = true
		code := h.exit.Code
		st.ExitCode, st.Reason, st.Limit = &code, h.exit.Reason, h.exit.Limit
		st.Packets, st.Routes = h.exit.Packets, h.exit.Routes
		if h.exit.Err != nil {
			st.Reason = h.exit.Err.Error()
		}
	default:
	}
	bs := h.sess.State()
	st.Epoch, st.NextSeq, st.Acked, st.Paused = h.sess.Epoch(), bs.Next, bs.Acked, bs.Paused
	st.Hibernated, st.IdleMillis = h.hibernated(), h.idle(bs.Next).Milliseconds()
	return st
}
