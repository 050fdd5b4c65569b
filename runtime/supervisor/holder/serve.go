package holder

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/runtime/bridge"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// serve answers one connection. Only root may talk to a holder: the socket
// is 0600 in a 0700 directory, and the peer is checked anyway (anyone
// else is closed on without an answer).
func (h *holder) serve(c *net.UnixConn) {
	p := lineserve.Protocol[Request, *Error]{
		Version:    Version,
		MaxFrame:   MaxFrame,
		ReadBuffer: 64 << 10,
		Admit: func(p lineserve.Peer) (func(), *Error) {
			if p.UID != 0 {
				return nil, nil
			}
			return func() {}, nil
		},
		Malformed: func(m string) *Error { return fail(rpcerr.Malformed, "%s", m) },
		Handle:    h.handle,
		Answered: func(req Request) bool {
			if req.Op != OpRelease {
				return false
			}
			h.end() // only now: the response has been sent
			return true
		},
	}
	p.Serve(context.Background(), c)
}

func fail(code rpcerr.Code, format string, a ...any) *Error { return rpcerr.New(code, format, a...) }

func (h *holder) handle(ctx context.Context, cn *lineserve.Conn, req Request) (any, *Error) {
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
				return cn.Send(Event{V: Version, Event: EventOutput, Sandbox: h.spec.ID, Seq: r.Seq, Stream: r.Stream, Data: r.Data})
			})
			reason := "sandbox ended"
			if errors.Is(err, context.Canceled) {
				reason = "superseded or connection closed"
			} else if err != nil {
				reason = err.Error()
			}
			_ = cn.Send(Event{V: Version, Event: EventDetached, Sandbox: h.spec.ID, Reason: reason})
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
		return TokenResult{MCPToken: true}, nil
	case OpSignal:
		// The holder owns the process: the signal goes through it
		// (execution.Process.Signal, which waits for runsc to know the
		// container), not around it from the supervisor.
		sig, ok := Signals[strings.TrimPrefix(req.Signal, "SIG")]
		if !ok {
			return nil, fail(rpcerr.Malformed, "signal must be TERM, INT, HUP or KILL")
		}
		if err := h.proc.Signal(sig); err != nil {
			return nil, fail(rpcerr.State, "%v", err)
		}
		return SignalResult{Signal: unix.SignalName(sig)}, nil
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
		return ReleaseResult{Released: h.spec.ID}, nil
	}
	return nil, fail(rpcerr.UnknownOp, "unknown holder op %q", req.Op)
}

func (h *holder) state() State {
	s := h.spec
	st := State{Sandbox: s.ID, Deployment: s.Deployment, Agent: s.Agent, Profile: s.Profile, DeleteOnExit: s.DeleteOnExit}
	select {
	case <-h.done:
		st.Exited = true
		code := h.exit.Code
		st.ExitCode, st.Reason, st.Limit = &code, h.exit.Reason, h.exit.Limit
		st.Packets, st.Routes, st.Search = h.exit.Packets, h.exit.Routes, h.exit.Search
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
