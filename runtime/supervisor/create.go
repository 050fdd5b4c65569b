package supervisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// create compiles the facts for the deployment and starts the sandbox.
// The facts must name the same deployment the request does, and the peer
// must be bound to it: a peer cannot borrow another deployment's roots by
// naming its id in facts.
func (s *Server) create(ctx context.Context, c call) (any, *Error) {
	p, req := c.conn.Peer(), c.req
	if !s.allowed(p, req.Deployment) {
		return nil, fail(rpcerr.Forbidden, "peer uid %d gid %d is not bound to deployment %q", p.UID, p.GID, req.Deployment)
	}
	if req.MCPToken != "" && !routeproxy.ValidToken([]byte(req.MCPToken)) {
		return nil, fail(rpcerr.Malformed, "%v", routeproxy.ErrBadToken) // names no value
	}
	var head struct {
		Deployment struct {
			ID string `json:"id"`
		} `json:"deployment"`
	}
	if err := json.Unmarshal(req.Facts, &head); err != nil {
		return nil, fail(rpcerr.Malformed, "facts must be a JSON object")
	}
	if head.Deployment.ID != req.Deployment {
		return nil, fail(rpcerr.Forbidden, "facts name deployment %q, the request %q", head.Deployment.ID, req.Deployment)
	}
	res, diags := compiler.Compile(compiler.Inputs{
		Facts:    schema.Input{Name: "facts.json", Data: req.Facts},
		Registry: s.cfg.Registry,
	}, compiler.Options{})
	if len(diags) > 0 {
		return nil, refused(diags)
	}
	if e := s.reserve(req.Deployment); e != nil {
		return nil, e
	}
	defer s.unreserve(req.Deployment)
	id := newID()
	dir := filepath.Join(s.cfg.StateRoot, "bundles", id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fail(rpcerr.Internal, "bundle dir: %v", err)
	}
	if err := res.Files.Write(dir); err != nil {
		return nil, fail(rpcerr.Internal, "bundle: %v", err)
	}
	// The branch's value before the agent runs (gitimport.go).
	if err := s.recordGit(ctx, id, p, res, req.Facts); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fail(rpcerr.Internal, "the sandbox's Git record: %v", err)
	}
	b, e := s.start(id, dir, res, req.Deployment, res.Manifest.Agent, res.Manifest.Profile, req.MCPToken, req.DeleteOnExit)
	if e != nil {
		_ = os.RemoveAll(dir)
		_ = os.Remove(s.gitRecordPath(id))
		return nil, e
	}
	b.use(ctx, c.conn)
	in, _ := s.inspect(b)
	return in, nil
}

// refused is the compiler's refusal as data: every diagnostic, sorted, with
// its PP-* code and fact path (callers match those, never the message,
// which only counts them and names the first for a log line).
func refused(diags diag.List) *Error {
	diags = diags.Sorted()
	e := fail(rpcerr.Refused, "the compiler refused the facts (%d diagnostics; the first: %s)", len(diags), diags[0])
	e.Diagnostics = diags
	return e
}

// reserve takes a place under the deployment's maxSandboxes for a
// creation; unreserve gives it back once the box exists or the creation
// failed. A sandbox counts from createSandbox until delete, or until its
// holder is gone and runsc no longer runs it: an ended sandbox's holder
// still keeps its output.
func (s *Server) reserve(deployment string) *Error {
	max := s.reg.Deployments[deployment].MaxSandboxes
	if max <= 0 {
		max = DefaultMaxSandboxes // a registry built in Go, not through the schema
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.pending[deployment]
	for _, b := range s.boxes {
		if b.deployment == deployment && b.state().counts() {
			n++
		}
	}
	if n >= max {
		return fail(rpcerr.Quota, "deployment %q has %d sandboxes, its registry cap (maxSandboxes %d); delete one first", deployment, n, max)
	}
	s.pending[deployment]++
	return nil
}

func (s *Server) unreserve(deployment string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[deployment]--; s.pending[deployment] <= 0 {
		delete(s.pending, deployment)
	}
}

// DefaultMaxSandboxes is the schema's default for maxSandboxes.
const DefaultMaxSandboxes = 32

// start launches the bundle in a new holder, which keeps its stdio on a
// bridge, and waits until runsc runs it (or the launch failed). res is the
// compile whose files were written to bundleDir: the supervisor plans from
// its typed plan, and the launcher alone reads the directory (once, into
// its launch plan).
func (s *Server) start(id, bundleDir string, res *compiler.Result, deployment, agent, profile string, mcpToken string, deleteOnExit bool) (*box, *Error) {
	spec := holder.Spec{ID: id, BundleDir: bundleDir, StateRoot: s.cfg.StateRoot, RunscPath: s.cfg.RunscPath,
		Uplink: s.cfg.Uplink, Bridge: s.cfg.Bridge, Deployment: deployment, Agent: agent, Profile: profile,
		Linger: s.cfg.HolderLinger, MCPToken: mcpToken, DeleteOnExit: deleteOnExit}
	if spec.Linger <= 0 {
		spec.Linger = 24 * time.Hour
	}
	if e := s.prepare(&spec, res); e != nil {
		return nil, e
	}
	b, err := newBox(id, deployment, agent, profile, holderSocket(s.cfg.StateRoot, id), stateCreating)
	if err != nil {
		return nil, fail(rpcerr.Internal, "%v", err)
	}
	b.deleteOnExit = deleteOnExit
	if e := s.spawn(spec); e != nil {
		_ = b.move(stateDeleted) // never listed: the creation fails whole
		return nil, e
	}
	if err := b.move(stateRunning); err != nil {
		return nil, fail(rpcerr.Internal, "%v", err)
	}
	s.mu.Lock()
	s.boxes[id] = b
	s.mu.Unlock()
	return b, nil
}
