package supervisor

import (
	"context"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Ops of the protocol (docs/supervisor.md, "Protocol").
const (
	OpCreateSandbox = "createSandbox" // Deployment, Facts, MCPToken → Info
	OpList          = "list"          // → []Info, by sandbox id
	OpAttach        = "attach"        // Sandbox, Cursor, MCPToken → AttachResult, then Events
	OpWrite         = "write"         // Sandbox, Epoch, InputID, Data → WriteResult
	OpAck           = "ack"           // Sandbox, Cursor → AckResult
	OpCloseInput    = "closeInput"    // Sandbox, Epoch → CloseResult
	OpSignal        = "signal"        // Sandbox, Signal → SignalResult
	OpInspect       = "inspect"       // Sandbox → Info
	OpDelete        = "delete"        // Sandbox → DeleteResult
	OpHibernate     = "hibernate"     // Sandbox → Info (hibernated)
	OpWake          = "wake"          // Sandbox → Info
	OpGitImport     = "gitImport"     // Sandbox → GitImportResult
)

// op is one op of the protocol: what the server checks and does before
// the op runs, and the op itself.
type op struct {
	// sandbox: the request names a sandbox of a deployment the peer may
	// use. Any other is not-found, the same answer whether it does not
	// exist or is another deployment's: ids are not an oracle.
	sandbox bool
	// wakes: the op needs the agent's process. A hibernated sandbox is
	// woken first, and none hibernates before the op reached its holder.
	wakes bool
	// frame is the op's largest frame, when it may be longer than
	// MaxFrame.
	frame int
	run   func(s *Server, ctx context.Context, c call) (any, *Error)
}

// call is one request as an op sees it.
type call struct {
	conn *lineserve.Conn
	req  Request
	box  *box // the request's sandbox, for an op with sandbox set
}

// ops is the protocol: every op and its properties.
var ops = map[string]op{
	OpCreateSandbox: {run: (*Server).create},
	OpList:          {run: (*Server).list},
	OpAttach:        {sandbox: true, wakes: true, run: (*Server).attach},
	OpWrite:         {sandbox: true, wakes: true, frame: MaxWriteFrame, run: (*Server).write},
	OpAck:           {sandbox: true, run: (*Server).ack},
	OpCloseInput:    {sandbox: true, wakes: true, run: (*Server).closeInput},
	OpSignal:        {sandbox: true, run: (*Server).signalOp},
	OpInspect:       {sandbox: true, run: (*Server).inspectOp},
	OpDelete:        {sandbox: true, run: (*Server).deleteOp},
	OpHibernate:     {sandbox: true, run: (*Server).hibernateOp},
	// wake wakes (its property) and answers with the woken state.
	OpWake: {sandbox: true, wakes: true, run: (*Server).inspectOp},
	// gitImport reads the agent's store, a host directory: a hibernated
	// sandbox stays hibernated.
	OpGitImport: {sandbox: true, run: (*Server).gitImportOp},
}

// opFrames are the ops whose frames may be longer than MaxFrame.
func opFrames() map[string]int {
	out := map[string]int{}
	for name, o := range ops {
		if o.frame > 0 {
			out[name] = o.frame
		}
	}
	return out
}

// handle runs one request through the op table.
func (s *Server) handle(ctx context.Context, cn *lineserve.Conn, req Request) (any, *Error) {
	o, ok := ops[req.Op]
	if !ok {
		return nil, fail(rpcerr.UnknownOp, "unknown op %q", req.Op)
	}
	c := call{conn: cn, req: req}
	if o.sandbox {
		if c.box = s.lookup(cn.Peer(), req.Sandbox); c.box == nil || c.box.state() == stateDeleted {
			return nil, fail(rpcerr.NotFound, "no sandbox %q for this peer", req.Sandbox)
		}
	}
	if o.wakes {
		release, e := s.awake(ctx, c.box)
		if e != nil {
			return nil, e
		}
		defer release()
	}
	result, e := o.run(s, ctx, c)
	if e != nil {
		return nil, e // a refusal carries no result
	}
	return result, nil
}

func fail(code rpcerr.Code, format string, a ...any) *Error { return rpcerr.New(code, format, a...) }

// holderFor is the socket of the box's holder, or the state refusal that
// says what went with it.
func holderFor(b *box, gone string) (string, *Error) {
	sock := b.holder()
	if sock == "" {
		return "", fail(rpcerr.State, "sandbox %s is %s: %s", b.id, b.info(nil, nil).Status, gone)
	}
	return sock, nil
}

// list answers every sandbox of the deployments the peer may use, by id.
func (s *Server) list(_ context.Context, c call) (any, *Error) {
	p := c.conn.Peer()
	s.mu.Lock()
	var boxes []*box
	for _, b := range s.boxes {
		if s.allowed(p, b.deployment) {
			boxes = append(boxes, b)
		}
	}
	s.mu.Unlock()
	out := []Info{}
	for _, b := range boxes {
		in, err := s.inspect(b)
		if err != nil {
			continue // deleted meanwhile
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Sandbox, b.Sandbox) })
	return out, nil
}

// write, ack and closeInput are relayed to the holder, which owns the
// bridge: fencing, duplicate suppression and acknowledgment happen there.

func (s *Server) write(ctx context.Context, c call) (any, *Error) {
	sock, e := holderFor(c.box, "its stdio is gone")
	if e != nil {
		return nil, e
	}
	r, err := holder.Write(ctx, sock, c.req.Epoch, c.req.InputID, c.req.Data)
	if err != nil {
		return nil, typed(err, "%s", OpWrite)
	}
	return WriteResult{Applied: r.Applied}, nil
}

func (s *Server) ack(ctx context.Context, c call) (any, *Error) {
	sock, e := holderFor(c.box, "its stdio is gone")
	if e != nil {
		return nil, e
	}
	r, err := holder.Ack(ctx, sock, c.req.Cursor)
	if err != nil {
		return nil, typed(err, "%s", OpAck)
	}
	return AckResult{Acked: r.Acked}, nil
}

func (s *Server) closeInput(ctx context.Context, c call) (any, *Error) {
	sock, e := holderFor(c.box, "its stdio is gone")
	if e != nil {
		return nil, e
	}
	r, err := holder.CloseInput(ctx, sock, c.req.Epoch)
	if err != nil {
		return nil, typed(err, "%s", OpCloseInput)
	}
	return CloseResult{Closed: r.Closed}, nil
}

// signalOp has the sandbox's holder, which owns its process, send the
// signal (holder.Signals names the ones a client may send). Without a
// holder (orphaned: runsc still runs the sandbox, nobody holds its
// process) runsc is all there is, and the supervisor signals through it.
func (s *Server) signalOp(ctx context.Context, c call) (any, *Error) {
	name := strings.TrimPrefix(c.req.Signal, "SIG")
	sig, ok := holder.Signals[name]
	if !ok {
		return nil, fail(rpcerr.Malformed, "signal must be TERM, INT, HUP or KILL")
	}
	if sock := c.box.holder(); sock != "" {
		r, err := holder.Signal(ctx, sock, name)
		if err == nil {
			return SignalResult{Signal: r.Signal}, nil
		}
		if !holder.Dead(err) {
			return nil, typed(err, "%s", OpSignal)
		}
	}
	if err := s.inventory().Kill(c.box.id, sig); err != nil {
		return nil, fail(rpcerr.State, "%v", err)
	}
	return SignalResult{Signal: unix.SignalName(sig)}, nil
}

func (s *Server) inspectOp(_ context.Context, c call) (any, *Error) {
	in, err := s.inspect(c.box)
	if err != nil {
		return nil, fail(rpcerr.State, "%v", err)
	}
	return in, nil
}

func (s *Server) deleteOp(_ context.Context, c call) (any, *Error) {
	if err := s.delete(c.box); err != nil {
		return nil, fail(rpcerr.Internal, "%v", err)
	}
	return DeleteResult{Deleted: c.box.id}, nil
}

func (s *Server) hibernateOp(ctx context.Context, c call) (any, *Error) {
	return s.hibernate(ctx, c.box)
}
