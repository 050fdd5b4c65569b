package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/lineio"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/bridge"
	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Config is the supervisor's own configuration (root-owned; never from a
// client).
type Config struct {
	// Registry is the operator registry, as a file's bytes (JSON or CUE).
	Registry schema.Input
	// Socket is the pathname socket; SocketGID the group allowed to
	// connect (mode 0660). The socket's directory must be root-owned and
	// not writable by others.
	Socket    string
	SocketGID int
	// Listener, when set, is a listening socket bound at Socket that
	// another process made and keeps open (systemd socket activation,
	// docs/deploy/paseo-sandbox.socket): the supervisor serves it instead
	// of making the socket, so the socket's inode outlives supervisor
	// restarts and a container that binds the socket file alone keeps
	// reaching the supervisor. Its path, owner, group and mode are checked
	// as strictly as those of a socket the supervisor makes.
	Listener  *net.UnixListener
	StateRoot string
	RunscPath string
	Secrets   launcher.SecretSource
	// SecretsDir is the directory Secrets reads, when it is one
	// (launcher.SecretsDir): holders read the model route's key there at
	// every request, so a rotated key is used without a restart.
	SecretsDir string
	// ModelRoots, PEM, verify model providers instead of the system trust
	// store: supervise --model-ca (a private model gateway), and the tests'
	// fake model CA.
	ModelRoots []byte
	Uplink     string
	Resolve    sandboxnet.Resolver
	Bridge     bridge.Limits
	// HolderLinger is how long an ended sandbox's output waits, unread and
	// undeleted, before its holder exits (zero: 24 hours).
	HolderLinger time.Duration
	// Limits bound connections and frames (zero fields: DefaultLimits).
	Limits Limits
}

// Server serves the protocol.
type Server struct {
	cfg   Config
	reg   *schema.Registry
	ln    net.Listener
	mu    sync.Mutex
	boxes map[string]*box
	// pending counts creations under way per deployment, which hold a
	// place under its maxSandboxes before their box exists.
	pending map[string]int
	gate    gate
	wg      sync.WaitGroup
}

// New loads the registry and reconciles the sandboxes an earlier
// supervisor left: those whose holders live are adopted whole.
func New(cfg Config) (*Server, error) {
	// The whole registry, as every compile checks it: a bad entry refuses
	// the start rather than the first createSandbox.
	reg, diags := compiler.LoadRegistry(cfg.Registry)
	if len(diags) > 0 {
		return nil, fmt.Errorf("registry: %v", diags)
	}
	if cfg.Bridge.SpillDir == "" {
		cfg.Bridge.SpillDir = filepath.Join(cfg.StateRoot, "spill")
	}
	for _, d := range []string{cfg.StateRoot, cfg.Bridge.SpillDir, filepath.Join(cfg.StateRoot, "bundles"), HolderDir(cfg.StateRoot)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	cfg.Limits = cfg.Limits.withDefaults()
	s := &Server{cfg: cfg, reg: reg, boxes: map[string]*box{}, pending: map[string]int{},
		gate: gate{lim: cfg.Limits, perUID: map[int]int{}}}
	if err := s.reconcile(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) inventory() launcher.Inventory {
	return launcher.Inventory{StateRoot: s.cfg.StateRoot, RunscPath: s.cfg.RunscPath}
}

// reconcile adopts the sandboxes of an earlier supervisor. A sandbox whose
// holder lives is adopted whole (running-unattached until a client
// attaches; its output was kept meanwhile). A launch record whose holder
// is gone is reported too: orphaned while runsc still runs it (its stdio
// cannot be recovered from runsc; it stays for inspect, signal and
// delete), otherwise exited with its output lost.
func (s *Server) reconcile() error {
	s.adoptHolders()
	entries, err := s.inventory().PS()
	if err != nil {
		return err
	}
	recs, err := launcher.Records(s.cfg.StateRoot)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Launcher != "dead" || s.boxes[e.ID] != nil {
			continue
		}
		i := slices.IndexFunc(recs, func(r launcher.Record) bool { return r.ID == e.ID })
		if i < 0 {
			continue // not one of ours: gc's business
		}
		r := recs[i]
		first := stateExited
		if e.Status == "running" || e.Status == "created" {
			first = stateOrphaned
		}
		b, err := newBox(r.ID, r.Deployment, r.Agent, r.Profile, "", first)
		if err != nil {
			return err
		}
		s.boxes[r.ID] = b
	}
	return nil
}

// Listen creates the socket (0660, root:SocketGID) in a root-owned
// directory, or serves the inherited Listener, until ctx ends.
func (s *Server) Listen(ctx context.Context) error {
	dir := filepath.Dir(s.cfg.Socket)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if st.Uid != 0 || st.Mode&0o022 != 0 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("socket directory %s must be a root-owned directory no one else can write", dir)
	}
	if st.Mode&0o011 == 0 {
		return fmt.Errorf("socket directory %s must be searchable by the socket's group (mode 0711 or 0755)", dir)
	}
	if filepath.Clean(dir) == filepath.Clean(s.cfg.StateRoot) {
		// The launcher keeps the state root 0700, which would lock peers out.
		return fmt.Errorf("the socket may not live in the state root %s itself", s.cfg.StateRoot)
	}
	ln, err := s.listener()
	if err != nil {
		return err
	}
	s.ln = ln
	go func() { <-ctx.Done(); ln.Close() }()
	go s.idleHibernation(ctx, time.Second)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c.(*net.UnixConn))
		}()
	}
}

// listener is the inherited socket, checked, or a new one made at Socket
// (a stale socket there is replaced): 0660, root:SocketGID.
func (s *Server) listener() (net.Listener, error) {
	var st unix.Stat_t
	if ln := s.cfg.Listener; ln != nil {
		a, ok := ln.Addr().(*net.UnixAddr)
		if !ok || filepath.Clean(a.Name) != filepath.Clean(s.cfg.Socket) {
			return nil, fmt.Errorf("the inherited socket listens on %v, not on %s", ln.Addr(), s.cfg.Socket)
		}
		if err := unix.Lstat(s.cfg.Socket, &st); err != nil {
			return nil, fmt.Errorf("the inherited socket: %w", err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Uid != 0 || int(st.Gid) != s.cfg.SocketGID || st.Mode&0o7777 != 0o660 {
			return nil, fmt.Errorf("the inherited socket %s must be a socket of mode 0660 owned by root:%d (systemd: SocketMode=0660, SocketGroup=%d)", s.cfg.Socket, s.cfg.SocketGID, s.cfg.SocketGID)
		}
		return ln, nil
	}
	if err := unix.Lstat(s.cfg.Socket, &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, fmt.Errorf("%s exists and is not a socket", s.cfg.Socket)
		}
		_ = os.Remove(s.cfg.Socket)
	}
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", s.cfg.Socket)
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chown(s.cfg.Socket, 0, s.cfg.SocketGID); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Chmod(s.cfg.Socket, 0o660); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Close stops serving and ends this supervisor's attachments; the
// sandboxes go on in their holders for the next supervisor to adopt.
func (s *Server) Close() {
	if s.ln != nil {
		s.ln.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.boxes {
		b.mu.Lock()
		if b.detach != nil {
			b.detach()
		}
		b.mu.Unlock()
	}
}

// Shutdown deletes every sandbox the supervisor knows (tests, and an
// operator who wants nothing left running).
func (s *Server) Shutdown() {
	s.Close()
	s.mu.Lock()
	boxes := make([]*box, 0, len(s.boxes))
	for _, b := range s.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	for _, b := range boxes {
		_ = s.delete(b)
	}
}

// peer is who is on the other end of a connection.
type peer struct{ uid, gid, pid int }

func peerOf(c *net.UnixConn) (peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, cerr
	}
	return peer{uid: int(cred.Uid), gid: int(cred.Gid), pid: int(cred.Pid)}, nil
}

// allowed reports whether p may use deployment: its uid or its primary gid
// must be bound to the id in the registry. An id without peers is usable by
// no one through the socket.
func (s *Server) allowed(p peer, deployment string) bool {
	d, ok := s.reg.Deployments[deployment]
	if !ok || d.Peers == nil {
		return false
	}
	return slices.Contains(d.Peers.UIDs, p.uid) || slices.Contains(d.Peers.GIDs, p.gid)
}

// conn is one client connection; writes of responses and events are
// serialized.
type conn struct {
	c    *net.UnixConn
	peer peer
	wmu  sync.Mutex
	enc  *json.Encoder
	// frameTimeout bounds one request's arrival once it began (zero: no
	// bound); idleTimeout the wait for the next request while nothing
	// streams to the connection (zero: none).
	frameTimeout, idleTimeout time.Duration
	streams                   atomic.Int32
}

func (c *conn) send(v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	return c.enc.Encode(v)
}

func (s *Server) serveConn(ctx context.Context, uc *net.UnixConn) {
	defer uc.Close()
	p, err := peerOf(uc)
	if err != nil {
		return
	}
	cn := &conn{c: uc, peer: p, enc: json.NewEncoder(uc), frameTimeout: s.cfg.Limits.FrameTimeout, idleTimeout: s.cfg.Limits.IdleTimeout}
	release, why := s.gate.enter(p.uid)
	if release == nil {
		_ = uc.SetWriteDeadline(time.Now().Add(time.Second))
		_ = cn.enc.Encode(Response{V: Version, OK: false, Error: &Error{Code: rpcerr.Busy, Message: why}})
		return
	}
	defer release()
	serveLines(ctx, cn, func(ctx context.Context, req Request) (any, *Error) {
		return s.handle(ctx, cn, req)
	})
}

// serveLines answers one connection's JSON-line requests, strictly decoded,
// each with its response, until the peer hangs up or a send fails. The context handle gets ends
// with the connection, and with it any stream the connection started.
func serveLines(ctx context.Context, cn *conn, handle func(context.Context, Request) (result any, e *Error)) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	br := bufio.NewReaderSize(cn.c, 16<<10)
	for {
		if err := cn.awaitRequest(br); err != nil {
			return
		}
		if cn.frameTimeout > 0 {
			_ = cn.c.SetReadDeadline(time.Now().Add(cn.frameTimeout))
		}
		line, err := readFrame(br)
		_ = cn.c.SetReadDeadline(time.Time{})
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = fmt.Errorf("request did not arrive whole within %s", cn.frameTimeout)
			}
			if !errors.Is(err, io.EOF) {
				_ = cn.send(Response{V: Version, OK: false, Error: &Error{Code: rpcerr.Malformed, Message: err.Error()}})
			}
			return
		}
		var req Request
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.V != Version || req.ID == "" {
			_ = cn.send(Response{V: Version, ID: req.ID, OK: false, Error: &Error{Code: rpcerr.Malformed, Message: "want one JSON request with v 1, an id and known fields only"}})
			continue
		}
		if len(line) > MaxFrame && req.Op != "write" {
			// A duplicate "op" key can get a large frame past opOf.
			_ = cn.send(Response{V: Version, ID: req.ID, OK: false, Error: &Error{Code: rpcerr.Malformed, Message: fmt.Sprintf("only write may be longer than %d bytes", MaxFrame)}})
			return
		}
		result, e := handle(cctx, req)
		if err := cn.send(Response{V: Version, ID: req.ID, OK: e == nil, Result: result, Error: e}); err != nil {
			return
		}
	}
}

// awaitRequest waits for the first byte of the next request. Without a
// stream to the connection, an idle timeout ends the wait (and so the
// connection); with one, the client may stay silent while it listens.
func (cn *conn) awaitRequest(br *bufio.Reader) error {
	for {
		if cn.idleTimeout > 0 {
			_ = cn.c.SetReadDeadline(time.Now().Add(cn.idleTimeout))
		}
		_, err := br.Peek(1)
		if err == nil {
			return nil
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() && cn.streams.Load() > 0 {
			continue
		}
		return err
	}
}

// readFrame reads one request line: at most MaxFrame bytes, or
// MaxWriteFrame for a write (its op found in the first MaxFrame bytes).
func readFrame(br *bufio.Reader) ([]byte, error) {
	limit := MaxFrame
	return lineio.Read(br, func(line []byte) error {
		if len(line) > limit && limit == MaxFrame {
			if opOf(line[:MaxFrame]) != "write" {
				return fmt.Errorf("request longer than %d bytes (only write may be longer, up to %d)", MaxFrame, MaxWriteFrame)
			}
			limit = MaxWriteFrame
		}
		if len(line) > limit {
			return fmt.Errorf("write request longer than %d bytes", MaxWriteFrame)
		}
		return nil
	})
}

func fail(code rpcerr.Code, format string, a ...any) *Error { return rpcerr.New(code, format, a...) }

func (s *Server) handle(ctx context.Context, cn *conn, req Request) (any, *Error) {
	if req.Op == "createSandbox" {
		return s.create(cn.peer, req)
	}
	if req.Op == "list" {
		return s.list(cn.peer), nil
	}
	switch req.Op {
	case "attach", "write", "ack", "closeInput", "signal", "inspect", "delete", "hibernate", "wake":
	default:
		return nil, fail(rpcerr.UnknownOp, "unknown op %q", req.Op)
	}
	b := s.lookup(cn.peer, req.Sandbox)
	if b == nil || b.state() == stateDeleted {
		// The same answer whether the sandbox does not exist or belongs to
		// a deployment this peer may not use: ids are not an oracle.
		return nil, fail(rpcerr.NotFound, "no sandbox %q for this peer", req.Sandbox)
	}
	switch req.Op {
	case "attach", "write", "closeInput", "wake":
		// These need the agent's process: a hibernated one is woken first,
		// and none hibernates before the request reached its holder.
		release, e := s.awake(ctx, b)
		if e != nil {
			return nil, e
		}
		defer release()
	case "hibernate":
		return s.hibernate(ctx, b)
	}
	switch req.Op {
	case "wake":
		in, err := s.inspect(b)
		if err != nil {
			return nil, fail(rpcerr.State, "%v", err)
		}
		return in, nil
	case "attach":
		if req.MCPToken != "" {
			if e := s.handToken(ctx, b, req.MCPToken); e != nil {
				return nil, e
			}
		}
		return s.attach(ctx, cn, b, req.Cursor)
	case "write", "ack", "closeInput":
		// The holder owns the bridge: fencing, duplicate suppression and
		// acknowledgment happen there.
		sock := b.holder()
		if sock == "" {
			return nil, fail(rpcerr.State, "sandbox %s is %s: its stdio is gone", b.id, b.info(nil, nil).Status)
		}
		var result any
		var err error
		switch req.Op {
		case "write":
			result, err = holder.Write(ctx, sock, req.Epoch, req.InputID, req.Data)
		case "ack":
			result, err = holder.Ack(ctx, sock, req.Cursor)
		default:
			result, err = holder.CloseInput(ctx, sock, req.Epoch)
		}
		if err != nil {
			return nil, typed(err, "%s", req.Op)
		}
		return result, nil
	case "signal":
		sig := map[string]unix.Signal{"TERM": unix.SIGTERM, "INT": unix.SIGINT, "KILL": unix.SIGKILL, "HUP": unix.SIGHUP}[strings.TrimPrefix(req.Signal, "SIG")]
		if sig == 0 {
			return nil, fail(rpcerr.Malformed, "signal must be TERM, INT, HUP or KILL")
		}
		if err := s.signal(b, sig); err != nil {
			return nil, fail(rpcerr.State, "%v", err)
		}
		return map[string]string{"signal": unix.SignalName(sig)}, nil
	case "inspect":
		in, err := s.inspect(b)
		if err != nil {
			return nil, fail(rpcerr.State, "%v", err)
		}
		return in, nil
	case "delete":
		if err := s.delete(b); err != nil {
			return nil, fail(rpcerr.Internal, "%v", err)
		}
		return map[string]string{"deleted": b.id}, nil
	}
	return nil, fail(rpcerr.UnknownOp, "unknown op %q", req.Op)
}

func (s *Server) lookup(p peer, id string) *box {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil || !s.allowed(p, b.deployment) {
		return nil
	}
	return b
}

// create compiles the facts for the deployment and starts the sandbox.
// The facts must name the same deployment the request does, and the peer
// must be bound to it: a peer cannot borrow another deployment's roots by
// naming its id in facts.
func (s *Server) create(p peer, req Request) (any, *Error) {
	if !s.allowed(p, req.Deployment) {
		return nil, fail(rpcerr.Forbidden, "peer uid %d gid %d is not bound to deployment %q", p.uid, p.gid, req.Deployment)
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
	b, e := s.start(id, dir, res.Files, req.Deployment, res.Manifest.Agent, res.Manifest.Profile, req.MCPToken)
	if e != nil {
		_ = os.RemoveAll(dir)
		return nil, e
	}
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
// bridge, and waits until runsc runs it (or the launch failed). files are
// the compile's own bytes, written to bundleDir: the supervisor plans from
// them, and the launcher alone reads the directory (once, into its launch
// plan).
func (s *Server) start(id, bundleDir string, files bundle.Files, deployment, agent, profile string, mcpToken string) (*box, *Error) {
	spec := holder.Spec{ID: id, BundleDir: bundleDir, StateRoot: s.cfg.StateRoot, RunscPath: s.cfg.RunscPath,
		Uplink: s.cfg.Uplink, Bridge: s.cfg.Bridge, Deployment: deployment, Agent: agent, Profile: profile,
		Linger: s.cfg.HolderLinger, MCPToken: mcpToken}
	if spec.Linger <= 0 {
		spec.Linger = 24 * time.Hour
	}
	if e := s.prepare(&spec, files); e != nil {
		return nil, e
	}
	b, err := newBox(id, deployment, agent, profile, holderSocket(s.cfg.StateRoot, id), stateCreating)
	if err != nil {
		return nil, fail(rpcerr.Internal, "%v", err)
	}
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

// handToken gives the sandbox's holder the daemon's current MCP bearer; its
// route proxy uses it for every request from then on. A daemon restart
// rotates the token, and the reattaching daemon brings the new one here.
func (s *Server) handToken(ctx context.Context, b *box, token string) *Error {
	if !routeproxy.ValidToken([]byte(token)) {
		return fail(rpcerr.Malformed, "%v", routeproxy.ErrBadToken)
	}
	sock := b.holder()
	if sock == "" {
		return fail(rpcerr.State, "sandbox %s is %s: its route proxy is gone", b.id, b.info(nil, nil).Status)
	}
	if err := holder.SetMCPToken(ctx, sock, token); err != nil {
		return typed(err, "handing the MCP token to the holder")
	}
	return nil
}

// attach makes this connection the sandbox's attachment: the holder gives
// it a new epoch (fencing the earlier one), replays every record after
// cursor and then streams live output, which this supervisor relays. An
// earlier attachment is told it was superseded.
func (s *Server) attach(ctx context.Context, cn *conn, b *box, cursor uint64) (any, *Error) {
	sock := b.holder()
	if sock == "" {
		return nil, fail(rpcerr.State, "sandbox %s is %s: its output cannot be recovered", b.id, b.info(nil, nil).Status)
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
	cn.streams.Add(1)
	go func() {
		defer cn.streams.Add(-1)
		defer stop()
		go func() { <-actx.Done(); hc.Close() }()
		reason := "the sandbox's holder is gone"
		for e := range hc.Events {
			if e.Event == holder.EventDetached {
				reason = e.Reason
				break
			}
			if cn.send(Event{V: Version, Event: e.Event, Sandbox: e.Sandbox, Seq: e.Seq, Stream: e.Stream, Data: e.Data, Reason: e.Reason}) != nil {
				break
			}
		}
		if actx.Err() != nil {
			reason = "superseded or connection closed"
		}
		_ = cn.send(Event{V: Version, Event: "detached", Sandbox: b.id, Reason: reason})
	}()
	return map[string]uint64{"epoch": att.Epoch, "cursor": cursor}, nil
}

func (s *Server) signal(b *box, sig unix.Signal) error {
	return s.inventory().Kill(b.id, sig)
}

// lose records that a box's holder stopped answering, in the request that
// found it out: runsc may still run its sandbox (orphaned) or it ended
// with the holder (exited).
func (s *Server) lose(b *box) error {
	runs := false
	if entries, err := s.inventory().PS(); err == nil {
		for _, e := range entries {
			if e.ID == b.id {
				runs = e.Status == "running" || e.Status == "created"
			}
		}
	}
	return b.holderGone(runs)
}

// inspect asks a live holder for its sandbox's state, records a holder it
// finds gone (lose), and then answers from the box's state. The error is a
// move the state table refused (the box was deleted meanwhile).
func (s *Server) inspect(b *box) (Info, error) {
	sock := b.holder()
	if sock == "" {
		return b.info(nil, nil), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := holder.Inspect(ctx, sock)
	cancel()
	if err == nil {
		in := fromHolder(st)
		return b.info(&in, nil), nil
	}
	if holder.Dead(err) {
		if lerr := s.lose(b); lerr != nil {
			return b.info(nil, nil), lerr
		}
	}
	return b.info(nil, err), nil
}

func (s *Server) list(p peer) []Info {
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
	return out
}

// delete stops the sandbox if it runs and removes everything it had.
func (s *Server) delete(b *box) error {
	b.mu.Lock()
	st, sock := b.st, b.sock
	if b.detach != nil {
		b.detach()
	}
	b.mu.Unlock()
	if st == stateDeleted {
		return nil // a delete that raced this one did the work
	}
	gone := !st.holderLives()
	if !gone {
		// The holder's launcher stops runsc and tears everything down;
		// release then ends the holder.
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		_, err := holder.Stop(ctx, sock)
		if err == nil {
			err = holder.Release(ctx, sock)
		}
		if err != nil {
			if !holder.Dead(err) {
				return err
			}
			// The holder died meanwhile: remove as gc would.
			if err := s.lose(b); err != nil {
				return err
			}
			gone = true
		}
	}
	if gone {
		s.awaitLauncherEnd(b.id, 10*time.Second)
		rep, err := s.inventory().Remove(b.id)
		if err != nil {
			return err
		}
		if len(rep.Errors) > 0 {
			return fmt.Errorf("%s", strings.Join(rep.Errors, "; "))
		}
	}
	_ = os.RemoveAll(s.bundleDir(b.id))
	_ = launcher.RemoveHibernation(s.cfg.StateRoot, b.id) // the holder's stop removed it, unless the holder was gone
	_ = os.Remove(holder.Log(s.cfg.StateRoot, b.id))
	_ = os.Remove(holderSocket(s.cfg.StateRoot, b.id))
	s.mu.Lock()
	delete(s.boxes, b.id)
	s.mu.Unlock()
	if err := b.move(stateDeleted); err != nil && b.state() != stateDeleted {
		return err
	}
	return nil
}

// awaitLauncherEnd gives a holder that just died the moment it takes to be
// reaped (a zombie still counts as a live launcher), so that delete does
// not refuse it.
func (s *Server) awaitLauncherEnd(id string, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		recs, err := launcher.Records(s.cfg.StateRoot)
		if err != nil {
			return
		}
		i := slices.IndexFunc(recs, func(r launcher.Record) bool { return r.ID == id })
		if i < 0 || !recs[i].LauncherAlive() {
			return
		}
	}
}

func newID() string { return execution.NewID("pp-") }

func (s *Server) bundleDir(id string) string { return filepath.Join(s.cfg.StateRoot, "bundles", id) }
