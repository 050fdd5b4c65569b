// Package execution is the backend-neutral process seam the seed decided
// on: a backend starts one agent process under an identity it owns and
// hands back its stdio; the process can be signalled, stopped and waited
// for; a backend can clean up what crashed runs left behind. It holds the
// interfaces and neutral types only and imports no backend
// (internal/archtest holds it to that): the product's one adapter, OCI (a
// compiled bundle under gVisor runsc), lives beside the launcher it drives
// (runtime/launcher/ociexec); the contract test also runs a plain host
// process through internal/testkit/localexec, so the seam stays
// backend-neutral. A Spec's Command exists for such a backend and OCI
// refuses it: a sandboxed launch never becomes a local one by mistake.
//
// The provider's protocol (Pi's JSONL is the daemon's business; the tests
// speak it through internal/testkit/piproto) and output replay (package
// bridge) stay above this seam: a backend moves bytes and reports exits.
package execution

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"syscall"
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
	// Limit is the limit it was ended at (wallSeconds, outputBytes,
	// memoryBytes), if any.
	Limit string
	// Err is set when the backend itself failed after the start.
	Err error
	// Packets and Routes are the sandbox network's counters at teardown
	// (OCI backend, sandbox network mode): what the sandbox used and what
	// was blocked, kept for whoever asks after it ended.
	Packets map[string]uint64
	Routes  map[string]RouteStats
	// Search is the native search server's counters at teardown, when the
	// plan granted the search (OCI backend).
	Search *SearchStats
}

// SearchStats is what the native search's server did: searches answered
// from the host, answered "fallback" (the sandbox's own rg ran them) and
// refused (off the closed list).
type SearchStats struct {
	Answered uint64 `json:"answered"`
	Fallback uint64 `json:"fallback"`
	Refused  uint64 `json:"refused"`
}

// RouteStats is what one private route's proxy did: requests forwarded
// and refused, and why (the OCI backend's route proxies count them).
type RouteStats struct {
	Forwarded int64 `json:"forwarded"`
	Refused   int64 `json:"refused"`
	// OutOfScope are the refused requests whose JSON-RPC body was
	// malformed or outside the MCP scope; Filtered the tools dropped from
	// tools/list answers.
	OutOfScope int64 `json:"outOfScope,omitempty"`
	Filtered   int64 `json:"filtered,omitempty"`
	// RefusedConns are connections past the proxy's cap, closed at accept;
	// Cut requests ended before the guard (headers too large or too slow).
	RefusedConns int64 `json:"refusedConns,omitempty"`
	Cut          int64 `json:"cut,omitempty"`
	// A model route's refusals by reason (routeproxy.Reason: foreign-model,
	// connector, hosted-tool, ...), and the key's spellings it masked in
	// answers.
	ByReason map[string]int64 `json:"byReason,omitempty"`
	Scrubbed int64            `json:"scrubbed,omitempty"`
	// Decompressed: a model route's request bodies it decompressed (Pi's
	// zstd Codex turns) before checking them.
	Decompressed int64 `json:"decompressed,omitempty"`
}

// SecretSource returns the value of secret ref of one deployment, a fresh
// slice each call (the backend wipes it). An alias of the function type,
// so any backend's own named source type is one.
type SecretSource = func(deployment, ref string) ([]byte, error)

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

// Hibernator is a process whose sandbox can be checkpointed and restored
// (docs/supervisor.md "Hibernate").
type Hibernator interface {
	// Hibernate checkpoints the sandbox and releases it as at delete,
	// except the checkpoint; the process itself goes on (its stdio stays).
	Hibernate() error
	// Wake restores it, with the secrets as they are now. A refusal (the
	// OCI backend's is a *launcher.UnavailableError) leaves the process
	// hibernated.
	Wake(ctx context.Context, secrets SecretSource) error
	Hibernated() bool
}

// ErrNotRunning is a hibernate of a process that does not run, or a wake
// of one that is not hibernated.
var ErrNotRunning = errors.New("the sandbox is not in a state for this")

// ErrInputPending is a hibernate refused because the sandbox has not read
// input already handed to it: it is busy, not idle, and runs on. Worth
// retrying once the agent has read it (idle hibernation retries every tick).
var ErrInputPending = errors.New("the sandbox has not taken the input it was given; it is not idle")

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

// NewID returns prefix followed by 16 random hex digits: an identity no
// earlier run has used.
func NewID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
