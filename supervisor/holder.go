package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/bridge"
	"paseo.dev/paseo-policy/execution"
	"paseo.dev/paseo-policy/launcher"
	"paseo.dev/paseo-policy/launcher/routeproxy"
)

// The holder: one process per sandbox that owns its stdio
//
// `runsc run` ties a sandbox to the process that started it, and a pipe's
// other end dies with the process holding it. If the supervisor itself ran
// the launcher, a supervisor restart (upgrade, crash) would end every
// sandbox and its turn. So the supervisor starts one small holder process
// per sandbox (this binary, re-executed with HolderEnv set), in a session of
// its own, that runs the launcher and keeps the sandbox's bridge. The
// holder serves the bridge on a root-only socket in the state root; the
// supervisor is its only client. A supervisor that restarts finds the
// holders' sockets, adopts their sandboxes as running-unattached, and a
// daemon that attaches with its last acknowledged cursor continues the
// same turn without a gap. A holder ends only when the supervisor releases
// it (delete); its death ends its sandbox too (runsc run is its child with
// a parent-death signal), so a sandbox never runs without an owner of its
// stdio for longer than runsc takes to notice.

// HolderEnv, when set in a process's environment, makes MaybeRunHolder turn the
// process into a sandbox holder. Every binary that embeds the supervisor
// (the CLI, test binaries) calls MaybeRunHolder first thing.
const HolderEnv = "PASEO_POLICY_HOLDER"

// holderSpec is what the supervisor hands a new holder on its stdin. The
// secrets and name pins are resolved by the supervisor (its configuration
// holds the sources); they travel over a pipe only the two processes share.
type holderSpec struct {
	ID         string                  `json:"id"`
	BundleDir  string                  `json:"bundleDir"`
	StateRoot  string                  `json:"stateRoot"`
	RunscPath  string                  `json:"runscPath"`
	Uplink     string                  `json:"uplink,omitempty"`
	Bridge     bridge.Limits           `json:"bridge"`
	Deployment string                  `json:"deployment"`
	Agent      string                  `json:"agent"`
	Profile    string                  `json:"profile"`
	Secrets    map[string][]byte       `json:"secrets,omitempty"`
	Pins       map[string][]netip.Addr `json:"pins,omitempty"`
	// MCPToken is the daemon's bearer at createSandbox, if it gave one.
	MCPToken string `json:"mcpToken,omitempty"`
	// Linger is how long an ended sandbox's holder keeps its output for a
	// client after the last connection closed, before it exits on its own.
	Linger time.Duration `json:"linger"`
}

// holderReady is the holder's one message on its ready pipe (fd 3).
type holderReady struct {
	OK          bool   `json:"ok"`
	Error       string `json:"error,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
}

// HolderDir holds the holders' sockets and logs (root-only, in the state root).
func HolderDir(stateRoot string) string { return filepath.Join(stateRoot, "holders") }

func holderSocket(stateRoot, id string) string {
	return filepath.Join(HolderDir(stateRoot), id+".sock")
}

// MaybeRunHolder runs the holder and exits if HolderEnv is set; otherwise it
// returns at once.
func MaybeRunHolder() {
	if os.Getenv(HolderEnv) != "1" {
		return
	}
	os.Exit(runHolder(os.Stdin, os.NewFile(3, "ready")))
}

func runHolder(in io.Reader, ready *os.File) int {
	var spec holderSpec
	dec := json.NewDecoder(io.LimitReader(in, MaxWriteFrame)) // the supervisor's own spec: trusted, bounded anyway
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		tell(ready, holderReady{Error: "holder spec: " + err.Error()})
		return 2
	}
	h, err := newHolder(spec)
	if err != nil {
		tell(ready, holderReady{Error: err.Error()})
		return 1
	}
	return h.run(ready)
}

func tell(ready *os.File, r holderReady) {
	if ready == nil {
		return
	}
	data, _ := json.Marshal(r)
	_, _ = ready.Write(append(data, '\n'))
	_ = ready.Close()
}

type holder struct {
	spec holderSpec
	// token is the route proxy's daemon bearer; the supervisor replaces it
	// (op mcpToken) when the daemon reattaches with a new one.
	token routeproxy.Token
	ln    net.Listener
	sess  *bridge.Session
	proc  execution.Process

	done chan struct{}
	exit execution.Exit

	mu       sync.Mutex
	detach   context.CancelFunc // the current attachment's stream
	conns    int                // open connections
	contact  time.Time          // when the last connection closed
	released chan struct{}
	release  sync.Once
}

// end makes run return: the supervisor released the holder, or its ended
// sandbox's output lingered unread for spec.Linger.
func (h *holder) end() { h.release.Do(func() { close(h.released) }) }

// contacted counts a connection opening (+1) or closing (-1).
func (h *holder) contacted(delta int) {
	h.mu.Lock()
	h.conns += delta
	h.contact = time.Now()
	h.mu.Unlock()
}

// linger ends the holder once its sandbox has ended and no connection has
// been open for spec.Linger: a supervisor that never comes back to delete
// does not leave holders and their output behind for ever.
func (h *holder) linger() {
	<-h.done
	for {
		h.mu.Lock()
		idle, conns := time.Since(h.contact), h.conns
		h.mu.Unlock()
		if conns == 0 && idle >= h.spec.Linger {
			h.sess.Release()
			h.end()
			return
		}
		select {
		case <-time.After(max(h.spec.Linger-idle, 100*time.Millisecond)):
		case <-h.released:
			return
		}
	}
}

func newHolder(spec holderSpec) (*holder, error) {
	dir := HolderDir(spec.StateRoot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sock := holderSocket(spec.StateRoot, spec.ID)
	_ = os.Remove(sock)
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", sock)
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	return &holder{spec: spec, ln: ln, done: make(chan struct{}), released: make(chan struct{})}, nil
}

// run launches the sandbox, reports readiness and serves until released.
func (h *holder) run(ready *os.File) int {
	defer os.Remove(holderSocket(h.spec.StateRoot, h.spec.ID))
	pins, secrets := h.spec.Pins, h.spec.Secrets
	if h.spec.MCPToken != "" {
		// create checked it; until a token is set the proxy answers 503.
		_ = h.token.Set([]byte(h.spec.MCPToken))
		h.spec.MCPToken = ""
	}
	backend := execution.OCI{StateRoot: h.spec.StateRoot, RunscPath: h.spec.RunscPath, Uplink: h.spec.Uplink, MCPToken: &h.token,
		Secrets: func(deployment, ref string) ([]byte, error) {
			// The supervisor resolved these for this holder's deployment only.
			if v, ok := secrets[ref]; ok && deployment == h.spec.Deployment {
				return v, nil
			}
			return nil, fmt.Errorf("secret %s was not resolved by the supervisor", ref)
		},
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			if a, ok := pins[host]; ok {
				return a, nil
			}
			return nil, fmt.Errorf("%s was not resolved by the supervisor", host)
		},
	}
	proc, err := backend.Start(context.Background(), execution.Spec{ID: h.spec.ID, Bundle: h.spec.BundleDir})
	if err != nil {
		_ = os.RemoveAll(h.spec.BundleDir)
		var ue *launcher.UnavailableError
		tell(ready, holderReady{Error: err.Error(), Unavailable: errors.As(err, &ue)})
		return 1
	}
	h.proc = proc
	h.sess = bridge.Start(proc.Stdin(), map[string]io.Reader{"stdout": proc.Stdout(), "stderr": proc.Stderr()}, h.spec.Bridge)
	go func() {
		defer close(h.done)
		h.exit = proc.Wait()
		if h.exit.Err == nil {
			h.sess.Exited(h.exit.Code)
		} else {
			h.sess.Exited(-1)
		}
		_ = os.RemoveAll(h.spec.BundleDir)
	}()
	tell(ready, holderReady{OK: true})
	// The secrets are in the sandbox's private run dir now; drop this copy.
	for k := range secrets {
		clear(secrets[k])
	}
	h.contacted(0)
	go h.linger()
	go func() {
		for {
			c, err := h.ln.Accept()
			if err != nil {
				return
			}
			h.contacted(+1)
			go func() {
				defer h.contacted(-1)
				h.serve(c.(*net.UnixConn))
			}()
		}
	}()
	<-h.released
	h.ln.Close()
	return 0
}

// serve answers one connection. Only root may talk to a holder: the socket
// is 0600 in a 0700 directory, and the peer is checked anyway.
func (h *holder) serve(c *net.UnixConn) {
	defer c.Close()
	if p, err := peerOf(c); err != nil || p.uid != 0 {
		return
	}
	cn := &conn{c: c, enc: json.NewEncoder(c)}
	released := false
	serveLines(context.Background(), cn, func(ctx context.Context, req Request) (any, *Error, bool) {
		result, e := h.handle(ctx, cn, req)
		released = req.Op == "release" && e == nil
		return result, e, released
	})
	if released {
		h.end() // only now: the response has been sent
	}
}

func (h *holder) handle(ctx context.Context, cn *conn, req Request) (any, *Error) {
	switch req.Op {
	case "attach":
		if st := h.sess.State(); req.Cursor < st.Acked {
			return nil, fail(ErrOutOfOrder, "cursor %d is behind the acknowledged %d", req.Cursor, st.Acked)
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
				return cn.send(Event{V: Version, Event: "output", Sandbox: h.spec.ID, Seq: r.Seq, Stream: r.Stream, Data: r.Data})
			})
			reason := "sandbox ended"
			if errors.Is(err, context.Canceled) {
				reason = "superseded or connection closed"
			} else if err != nil {
				reason = err.Error()
			}
			_ = cn.send(Event{V: Version, Event: "detached", Sandbox: h.spec.ID, Reason: reason})
		}()
		return map[string]uint64{"epoch": epoch, "cursor": req.Cursor}, nil
	case "write":
		applied, err := h.sess.Write(req.Epoch, req.InputID, req.Data)
		switch {
		case errors.Is(err, bridge.ErrFenced):
			return nil, fail(ErrFenced, "epoch %d is not the current attachment", req.Epoch)
		case errors.Is(err, bridge.ErrInputClosed):
			return nil, fail(ErrState, "input closed")
		case err != nil:
			return nil, fail(ErrState, "write: %v", err)
		}
		return map[string]bool{"applied": applied}, nil
	case "ack":
		h.sess.Ack(req.Cursor)
		return map[string]uint64{"acked": req.Cursor}, nil
	case "closeInput":
		if err := h.sess.CloseInput(req.Epoch); err != nil {
			return nil, fail(ErrFenced, "%v", err)
		}
		return map[string]bool{"closed": true}, nil
	case "inspect":
		return h.state(), nil
	case "mcpToken":
		if err := h.token.Set([]byte(req.MCPToken)); err != nil {
			return nil, fail(ErrMalformed, "%v", err) // names no value
		}
		return map[string]bool{"mcpToken": true}, nil
	case "stop":
		go h.proc.Stop() // the launcher stops runsc and tears everything down
		select {
		case <-h.done:
		case <-time.After(60 * time.Second):
			return nil, fail(ErrInternal, "sandbox %s did not stop", h.spec.ID)
		}
		h.mu.Lock()
		if h.detach != nil {
			h.detach()
		}
		h.mu.Unlock()
		return h.state(), nil
	case "release":
		select {
		case <-h.done:
		default:
			return nil, fail(ErrState, "sandbox %s still runs: stop it first", h.spec.ID)
		}
		h.sess.Release()
		return map[string]string{"released": h.spec.ID}, nil
	}
	return nil, fail(ErrUnknownOp, "unknown holder op %q", req.Op)
}

func (h *holder) state() Info {
	s := h.spec
	in := Info{Sandbox: s.ID, Deployment: s.Deployment, Agent: s.Agent, Profile: s.Profile, Status: StatusRunning}
	select {
	case <-h.done:
		in.Status = StatusExited
		code := h.exit.Code
		in.ExitCode, in.Reason = &code, h.exit.Reason
		if h.exit.Err != nil {
			in.Reason = h.exit.Err.Error()
		}
	default:
	}
	st := h.sess.State()
	in.Epoch, in.NextSeq, in.Acked, in.Paused = h.sess.Epoch(), st.Next, st.Acked, st.Paused
	return in
}
