// Package execution is the backend-neutral process seam the seed decided
// on: a backend starts one agent process under an identity it owns and
// hands back its stdio; the process can be signalled, stopped and waited
// for; a backend can clean up what crashed runs left behind. The product's
// one adapter is OCI (a compiled bundle under gVisor runsc, through the
// launcher); the contract test also runs a plain host process through
// internal/testkit/localexec, so the seam stays backend-neutral. A
// Spec's Command exists for such a backend and OCI refuses it: a
// sandboxed launch never becomes a local one by mistake.
//
// The provider's protocol (Pi's JSONL is the daemon's business; the tests
// speak it through internal/testkit/piproto) and output replay (package
// bridge) stay above this seam: a backend moves bytes and reports exits.
package execution

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"syscall"

	"paseo.dev/paseo-policy/runtime/launcher"
)

// Spec is what to run. Exactly one of Bundle (OCI) or Command (Local) is
// set; a backend refuses the other kind, so a sandboxed launch can never
// turn into a local one by mistake.
type Spec struct {
	// ID is the identity the caller asks for; empty lets the backend pick.
	ID string
	// Bundle is a compiled bundle directory (OCI).
	Bundle string
	// Command is a host process (Local).
	Command *Command
}

// Command is a local process: argv, environment, working directory and,
// when set, the credentials it runs as.
type Command struct {
	Argv     []string
	Env      []string
	Dir      string
	UID, GID *uint32
}

// Exit is how a process ended.
type Exit struct {
	Code int
	// Reason is set when the backend ended it (wall time, memory, a stop).
	Reason string
	// Limit is the limit it was ended at (launcher.Result.Limit), if any.
	Limit string
	// Err is set when the backend itself failed after the start.
	Err error
	// Packets and Routes are the sandbox network's counters at teardown
	// (OCI backend, sandbox network mode; launcher.Result): what the
	// sandbox used and what was blocked, kept for whoever asks after it
	// ended.
	Packets map[string]uint64
	Routes  map[string]launcher.RouteStats
}

// Process is a started process as its backend owns it. Its outputs must be
// read to EOF (the bridge does); Wait returns once the process has ended,
// its outputs are closed and the backend has torn down what it made.
type Process interface {
	ID() string
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	Signal(syscall.Signal) error
	// Stop ends the process (a grace period, then a kill) and tears down.
	Stop()
	Wait() Exit
}

// Backend starts processes and cleans up after crashed runs.
type Backend interface {
	Name() string
	// Start returns once the process runs; a refusal (prerequisites,
	// policy) is an error and nothing is left behind.
	Start(ctx context.Context, spec Spec) (Process, error)
	// Cleanup removes what runs of this backend left when their owner
	// died, and lists what it removed.
	Cleanup(ctx context.Context) ([]string, error)
}

// pipes are a process's stdio as its backend hands them out: the backend
// writes outputs into the *W ends and reads input from inR.
type pipes struct {
	inR        *io.PipeReader
	inW        *io.PipeWriter
	outR, errR *io.PipeReader
	outW, errW *io.PipeWriter
}

func newPipes() *pipes {
	p := &pipes{}
	p.inR, p.inW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	return p
}

// closeBackend closes the backend's ends once the process has ended: the
// readers see EOF and a writer to stdin gets an error.
func (p *pipes) closeBackend() {
	p.outW.Close()
	p.errW.Close()
	p.inR.Close()
}

// NewID returns prefix followed by 16 random hex digits: an identity no
// earlier run has used.
func NewID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
