package supervisor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/bridge"
	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
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

func (s *Server) inventory() inventory.Inventory {
	return inventory.Inventory{StateRoot: s.cfg.StateRoot, RunscPath: s.cfg.RunscPath}
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
	for _, e := range entries {
		if e.Launcher != "dead" || s.boxes[e.ID] != nil {
			continue
		}
		r, ok, err := statedir.Lookup(s.cfg.StateRoot, e.ID)
		if err != nil {
			return err
		}
		if !ok {
			continue // not one of ours: gc's business
		}
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

func newID() string { return execution.NewID("pp-") }

func (s *Server) bundleDir(id string) string { return filepath.Join(s.cfg.StateRoot, "bundles", id) }
