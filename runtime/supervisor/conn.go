package supervisor

import (
	"slices"

	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// The connection loop: lineserve's, with the supervisor's frame sizes,
// timeouts and connection caps, and every request's peer checked against
// the registry (here and in the ops: a peer sees only the sandboxes of
// deployments it is bound to).

// protocol is how the supervisor serves a connection.
func (s *Server) protocol() *lineserve.Protocol[Request, *Error] {
	return &lineserve.Protocol[Request, *Error]{
		Version:      Version,
		MaxFrame:     MaxFrame,
		Frames:       opFrames(),
		FrameTimeout: s.cfg.Limits.FrameTimeout,
		IdleTimeout:  s.cfg.Limits.IdleTimeout,
		ReadBuffer:   16 << 10,
		Admit:        s.admit,
		Malformed:    func(m string) *Error { return fail(rpcerr.Malformed, "%s", m) },
		Handle:       s.handle,
	}
}

// admit takes a connection slot for the peer's uid, or refuses it busy.
func (s *Server) admit(p lineserve.Peer) (release func(), refusal *Error) {
	release, why := s.gate.enter(p.UID)
	if release == nil {
		return nil, fail(rpcerr.Busy, "%s", why)
	}
	return release, nil
}

// allowed reports whether p may use deployment: its uid or its primary gid
// must be bound to the id in the registry. An id without peers is usable by
// no one through the socket.
func (s *Server) allowed(p lineserve.Peer, deployment string) bool {
	d, ok := s.reg.Deployments[deployment]
	if !ok || d.Peers == nil {
		return false
	}
	return slices.Contains(d.Peers.UIDs, p.UID) || slices.Contains(d.Peers.GIDs, p.GID)
}

// lookup is the box id names, if p may use its deployment.
func (s *Server) lookup(p lineserve.Peer, id string) *box {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil || !s.allowed(p, b.deployment) {
		return nil
	}
	return b
}
