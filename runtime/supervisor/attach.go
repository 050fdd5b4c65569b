package supervisor

import (
	"context"

	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// attach makes this connection the sandbox's attachment: the holder gives
// it a new epoch (fencing the earlier one), replays every record after
// the cursor and then streams live output, which this supervisor relays.
// An earlier attachment is told it was superseded. A request that brings
// the daemon's MCP token hands it to the holder first.
func (s *Server) attach(ctx context.Context, c call) (any, *Error) {
	b, cursor := c.box, c.req.Cursor
	if c.req.MCPToken != "" {
		if e := s.handToken(ctx, b, c.req.MCPToken); e != nil {
			return nil, e
		}
	}
	sock, e := holderFor(b, "its output cannot be recovered")
	if e != nil {
		return nil, e
	}
	hc, err := holder.Dial(sock, 256)
	if err != nil {
		if holder.Dead(err) {
			_ = s.lose(b) // the answer is state either way
		}
		return nil, fail(rpcerr.State, "sandbox %s: the holder does not answer: %v", b.id, err)
	}
	b.mu.Lock()
	if b.detach != nil {
		b.detach()
	}
	actx, stop := context.WithCancel(ctx)
	b.detach = stop
	b.mu.Unlock()
	att, err := hc.Attach(actx, cursor)
	if err != nil {
		hc.Close()
		stop()
		return nil, typed(err, "attach")
	}
	if err := b.attached(); err != nil {
		// A delete raced the attach: the holder is being stopped.
		hc.Close()
		stop()
		return nil, fail(rpcerr.State, "%v", err)
	}
	b.use(ctx, c.conn)
	streamed := c.conn.Streaming()
	go func() {
		defer streamed()
		defer stop()
		go func() { <-actx.Done(); hc.Close() }()
		reason := "the sandbox's holder is gone"
		for e := range hc.Events {
			if e.Event == holder.EventDetached {
				reason = e.Reason
				break
			}
			if c.conn.Send(Event{V: Version, Event: e.Event, Sandbox: e.Sandbox, Seq: e.Seq, Stream: e.Stream, Data: e.Data, Reason: e.Reason}) != nil {
				break
			}
		}
		if actx.Err() != nil {
			reason = "superseded or connection closed"
		}
		_ = c.conn.Send(Event{V: Version, Event: holder.EventDetached, Sandbox: b.id, Reason: reason})
	}()
	return AttachResult{Epoch: att.Epoch, Cursor: cursor}, nil
}

// handToken gives the sandbox's holder the daemon's current MCP bearer; its
// route proxy uses it for every request from then on. A daemon restart
// rotates the token, and the reattaching daemon brings the new one here.
func (s *Server) handToken(ctx context.Context, b *box, token string) *Error {
	if !routeproxy.ValidToken([]byte(token)) {
		return fail(rpcerr.Malformed, "%v", routeproxy.ErrBadToken)
	}
	sock, e := holderFor(b, "its route proxy is gone")
	if e != nil {
		return e
	}
	if err := holder.SetMCPToken(ctx, sock, token); err != nil {
		return typed(err, "handing the MCP token to the holder")
	}
	return nil
}
