package holder

import (
	"context"
	"crypto/x509"
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

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/runtime/bridge"
	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/ociexec"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
)

// The holder process: one per sandbox that owns its stdio
//
// `runsc run` ties a sandbox to the process that started it, and a pipe's
// other end dies with the process holding it. If the supervisor itself ran
// the launcher, a supervisor restart (upgrade, crash) would end every
// sandbox and its turn. So the supervisor starts one small holder process
// per sandbox (this binary, re-executed with Env set), in a session of
// its own, that runs the launcher and keeps the sandbox's bridge. The
// holder serves the bridge on a root-only socket in the state root; the
// supervisor is its only client. A supervisor that restarts finds the
// holders' sockets, adopts their sandboxes as running-unattached, and a
// daemon that attaches with its last acknowledged cursor continues the
// same turn without a gap. A holder ends only when the supervisor releases
// it (delete); its death ends its sandbox too (runsc run is its child with
// a parent-death signal), so a sandbox never runs without an owner of its
// stdio for longer than runsc takes to notice.

// Env, when set to "1" in a process's environment, makes MaybeRun turn the
// process into a sandbox holder. Every binary that embeds the supervisor
// (the CLI, test binaries) calls MaybeRun first thing.
const Env = "PASEO_POLICY_HOLDER"

// Spec is what the supervisor hands a new holder on its stdin. The
// secrets and name pins are resolved by the supervisor (its configuration
// holds the sources); they travel over a pipe only the two processes share.
type Spec struct {
	ID         string                  `json:"id"`
	BundleDir  string                  `json:"bundleDir"`
	StateRoot  string                  `json:"stateRoot"`
	RunscPath  string                  `json:"runscPath"`
	Uplink     string                  `json:"uplink,omitempty"`
	Bridge     bridge.Limits           `json:"bridge"`
	Deployment string                  `json:"deployment"`
	Agent      string                  `json:"agent"`
	Profile    string                  `json:"profile"`
	Pins       map[string][]netip.Addr `json:"pins,omitempty"`
	// MCPToken is the daemon's bearer at createSandbox, if it gave one.
	MCPToken string `json:"mcpToken,omitempty"`
	// ModelKey is the provider key the bundle's model route adds,
	// resolved by the supervisor in this holder's deployment; nil when the
	// route adds none (no model route, or a login route, which reads its
	// login itself). The holder keeps it for the route's proxy (and takes
	// the one a wake brings), never for the sandbox; Spawn wipes the
	// supervisor's copy once sent.
	ModelKey *RouteKey `json:"modelKey,omitempty"`
	// SecretsDir, when the supervisor reads one, is where the model
	// route's proxy reads the provider key at every request, so a key
	// rotated there is the next request's, asleep or running. Without it
	// the holder serves the copy it was handed (at start, at each wake).
	SecretsDir string `json:"secretsDir,omitempty"`
	// ModelRoots, PEM, verify the model provider instead of the system
	// trust store (tests only: supervisor.Config.ModelRoots).
	ModelRoots []byte `json:"modelRoots,omitempty"`
	// Linger is how long an ended sandbox's holder keeps its output for a
	// client after the last connection closed, before it exits on its own.
	Linger time.Duration `json:"linger"`
	// DeleteOnExit is the creator's request (supervisor reap.go); the
	// holder only keeps it and reports it on inspect.
	DeleteOnExit bool `json:"deleteOnExit,omitempty"`
}

// ready is the holder's one message on its ready pipe (fd 3).
type ready struct {
	OK          bool   `json:"ok"`
	Error       string `json:"error,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
	// Diagnostics are a refused launch's codes: the failed preflight
	// checks (PP-PREFLIGHT-*) or the launch step's (PP-LAUNCH-*)
	// (launchDiagnostics).
	Diagnostics diag.List `json:"diagnostics,omitempty"`
}

// launchDiagnostics are the codes a refused launch carries
// (UnavailableError.Diagnostics): each failed preflight check, or the
// launch step's PP-LAUNCH-* code; nil for an error that is no refusal.
func launchDiagnostics(err error) diag.List {
	var ue *launcher.UnavailableError
	if errors.As(err, &ue) {
		return ue.Diagnostics()
	}
	return nil
}

// Dir holds the holders' sockets and logs (root-only, in the state root).
func Dir(stateRoot string) string { return filepath.Join(stateRoot, "holders") }

// Socket is the socket of sandbox id's holder.
func Socket(stateRoot, id string) string { return filepath.Join(Dir(stateRoot), id+".sock") }

// Log is the holder's own diagnostics file.
func Log(stateRoot, id string) string { return filepath.Join(Dir(stateRoot), id+".log") }

// maxSpec bounds the spec read from the supervisor (trusted, bounded anyway).
const maxSpec = 1 << 20

// MaybeRun runs the holder and exits if Env is set; otherwise it returns
// at once.
func MaybeRun() {
	if os.Getenv(Env) != "1" {
		return
	}
	os.Exit(run(os.Stdin, os.NewFile(3, "ready")))
}

func run(in io.Reader, readyF *os.File) int {
	var spec Spec
	dec := json.NewDecoder(io.LimitReader(in, maxSpec))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		tell(readyF, ready{Error: "holder spec: " + err.Error()})
		return 2
	}
	h, err := newHolder(spec)
	if err != nil {
		tell(readyF, ready{Error: err.Error()})
		return 1
	}
	return h.run(readyF)
}

func tell(f *os.File, r ready) {
	if f == nil {
		return
	}
	data, _ := json.Marshal(r)
	_, _ = f.Write(append(data, '\n'))
	_ = f.Close()
}

type holder struct {
	spec Spec
	// token is the route proxy's daemon bearer; the supervisor replaces it
	// (op mcpToken) when the daemon reattaches with a new one.
	token routeproxy.Token
	// modelKey is the provider key the model route adds; set at start and
	// at each wake from the secrets the supervisor resolved then.
	modelKey routeproxy.Token
	ln       net.Listener
	sess     *bridge.Session
	proc     execution.Process

	done chan struct{}
	exit execution.Exit

	mu       sync.Mutex
	detach   context.CancelFunc // the current attachment's stream
	conns    int                // open connections
	contact  time.Time          // when the last connection closed
	active   time.Time          // the last input, wake or output seen (idle)
	seenSeq  uint64             // the bridge's next seq when active was set
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

func newHolder(spec Spec) (*holder, error) {
	if err := os.MkdirAll(Dir(spec.StateRoot), 0o700); err != nil {
		return nil, err
	}
	ln, err := lineserve.Listen(Socket(spec.StateRoot, spec.ID), 0o600, -1)
	if err != nil {
		return nil, err
	}
	return &holder{spec: spec, ln: ln, done: make(chan struct{}), released: make(chan struct{})}, nil
}

// RouteKey is a route's credential as the supervisor hands it to a
// holder: the route it is for, the secret reference it was resolved under
// (the route's tokenRef, which a wake and the secrets dir resolve again)
// and its value.
type RouteKey struct {
	Route grant.RoutePurpose `json:"route"`
	Ref   string             `json:"ref"`
	Value []byte             `json:"value"`
}

// run launches the sandbox, reports readiness and serves until released.
func (h *holder) run(readyF *os.File) int {
	defer os.Remove(Socket(h.spec.StateRoot, h.spec.ID))
	pins, key := h.spec.Pins, h.spec.ModelKey
	if h.spec.MCPToken != "" {
		// create checked it; until a token is set the proxy answers 503.
		_ = h.token.Set([]byte(h.spec.MCPToken))
		h.spec.MCPToken = ""
	}
	if key != nil {
		// A bad key leaves it unset: the launch is refused for it.
		_ = h.modelKey.Set(key.Value)
	}
	var roots *x509.CertPool
	if len(h.spec.ModelRoots) > 0 {
		roots = x509.NewCertPool()
		roots.AppendCertsFromPEM(h.spec.ModelRoots)
	}
	backend := ociexec.OCI{StateRoot: h.spec.StateRoot, RunscPath: h.spec.RunscPath, Uplink: h.spec.Uplink, MCPToken: &h.token,
		ModelKey: h.modelKeySource(), ModelRoots: roots,
		Secrets: func(deployment, ref string) ([]byte, error) {
			// The supervisor resolved the route's key for this holder's
			// deployment only.
			if key != nil && ref == key.Ref && deployment == h.spec.Deployment {
				return key.Value, nil
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
		tell(readyF, ready{Error: err.Error(), Unavailable: errors.As(err, &ue), Diagnostics: launchDiagnostics(err)})
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
	tell(readyF, ready{OK: true})
	// The launch has used the key (kept in modelKey); drop this copy.
	if key != nil {
		clear(key.Value)
	}
	h.contacted(0)
	h.touched()
	go h.linger()
	go func() {
		_ = lineserve.Accept(h.ln, func(c *net.UnixConn) {
			h.contacted(+1)
			defer h.contacted(-1)
			h.serve(c)
		})
	}()
	<-h.released
	h.ln.Close()
	return 0
}

// modelKeySource is where the model route finds the provider key: the
// secrets dir at every request when the supervisor named one, else the
// copy this holder keeps.
func (h *holder) modelKeySource() func() ([]byte, error) {
	if dir, key, dep := h.spec.SecretsDir, h.spec.ModelKey, h.spec.Deployment; dir != "" && key != nil {
		src, ref := launcher.SecretsDir(dir), key.Ref
		return func() ([]byte, error) { return src(dep, ref) }
	}
	return h.modelKey.Source()
}
