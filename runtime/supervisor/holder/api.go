// Package holder is the per-sandbox holder process and its API: the
// process that runs one sandbox's launcher and owns its stdio and bridge
// (so a supervisor restart ends nothing), the small versioned JSON-lines
// protocol it serves on a root-only socket, and the client the supervisor
// uses to spawn, adopt and drive holders. It is to the supervisor what
// containerd's shim API is to containerd's client API: the supervisor
// imports it and keeps the client-facing protocol; this package never
// imports the supervisor.
//
// Holders do not survive an upgrade of the binary's protocol in any sense
// that matters: a holder is /proc/self/exe of the supervisor that started
// it, and speaks that build's Version. A newer supervisor adopting an
// older holder gets rpcerr.Malformed on a version mismatch, never a guess.
package holder

import (
	"syscall"
	"time"

	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Version is the holder protocol's version; every frame carries it.
const Version = 1

// Ops of the holder protocol.
const (
	OpInspect    = "inspect"    // → State
	OpAttach     = "attach"     // Cursor → AttachResult, then Events
	OpWrite      = "write"      // Epoch, InputID, Data → WriteResult
	OpAck        = "ack"        // Cursor → AckResult
	OpCloseInput = "closeInput" // Epoch → CloseResult
	OpMCPToken   = "mcpToken"   // MCPToken → TokenResult
	OpSignal     = "signal"     // Signal → SignalResult
	OpStop       = "stop"       // → State, once the sandbox ended
	OpHibernate  = "hibernate"  // → State: checkpointed, stdio and bridge kept
	OpWake       = "wake"       // Secrets → State: restored
	OpRelease    = "release"    // → ReleaseResult; the holder exits after answering
)

// Request is one line from the supervisor.
type Request struct {
	V       int    `json:"v"`
	ID      string `json:"id"`
	Op      string `json:"op"`
	Cursor  uint64 `json:"cursor,omitempty"`
	Epoch   uint64 `json:"epoch,omitempty"`
	InputID string `json:"inputId,omitempty"`
	Data    []byte `json:"data,omitempty"`
	// MCPToken is the daemon's current MCP bearer; kept in the holder's
	// memory only, never logged or echoed.
	MCPToken string `json:"mcpToken,omitempty"`
	// Secrets are the values a wake injects again (resolved by the
	// supervisor as at create); kept in memory only for the wake.
	Secrets map[string][]byte `json:"secrets,omitempty"`
	// Signal names a signal of Signals (signal).
	Signal string `json:"signal,omitempty"`
}

// Signals are the signals a holder sends its sandbox on request, by name
// without "SIG" (the supervisor's signal op takes the same names).
var Signals = map[string]syscall.Signal{"TERM": syscall.SIGTERM, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "HUP": syscall.SIGHUP}

// SignalResult answers signal with the signal sent, by its full name.
type SignalResult struct {
	Signal string `json:"signal"`
}

// Head is what the connection loop reads of every request.
func (r Request) Head() lineserve.Head { return lineserve.Head{V: r.V, ID: r.ID, Op: r.Op} }

// Response answers a request by id (a frame too broken to have one: id "").
type Response = lineserve.Response[*Error]

// Event is an output record (or the end of an attachment) pushed on an
// attach connection.
type Event struct {
	V       int    `json:"v"`
	Event   string `json:"event"` // EventOutput or EventDetached
	Sandbox string `json:"sandbox"`
	Seq     uint64 `json:"seq,omitempty"`
	Stream  string `json:"stream,omitempty"`
	Data    []byte `json:"data,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Event kinds.
const (
	EventOutput   = "output"
	EventDetached = "detached"
)

// Error is a holder's typed refusal: the codes and the type are package
// rpcerr's, shared with the supervisor's protocol (the supervisor passes a
// holder's refusal through to its client as it is).
type Error = rpcerr.Error

// State is a holder's answer to inspect and stop: its sandbox's identity
// and whether it ended, and the bridge's position.
type State struct {
	Sandbox    string `json:"sandbox"`
	Deployment string `json:"deployment"`
	Agent      string `json:"agent"`
	Profile    string `json:"profile"`
	Exited     bool   `json:"exited"`
	ExitCode   *int   `json:"exitCode,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// Limit is the limit the sandbox was ended at (launcher.Result.Limit).
	Limit   string `json:"limit,omitempty"`
	Epoch   uint64 `json:"epoch"`
	NextSeq uint64 `json:"nextSeq"`
	Acked   uint64 `json:"acked"`
	Paused  bool   `json:"outputPaused"`
	// Packets and Routes are the network counters of an ended sandbox
	// (execution.Exit).
	Packets map[string]uint64              `json:"packets,omitempty"`
	Routes  map[string]launcher.RouteStats `json:"routes,omitempty"`
	// Search is the native search's counters of an ended sandbox whose
	// plan granted it (execution.Exit).
	Search *launcher.SearchStats `json:"search,omitempty"`
	// Hibernated: the sandbox is checkpointed; output and input wait.
	Hibernated bool `json:"hibernated,omitempty"`
	// IdleMillis is how long no input was written and no output read from
	// the sandbox (for the supervisor's idle hibernation).
	IdleMillis int64 `json:"idleMillis"`
	// DeleteOnExit: Spec.DeleteOnExit, for a supervisor that adopts the
	// holder.
	DeleteOnExit bool `json:"deleteOnExit,omitempty"`
}

// AttachResult answers attach.
type AttachResult struct {
	Epoch  uint64 `json:"epoch"`
	Cursor uint64 `json:"cursor"`
}

// WriteResult answers write: applied is false for a duplicate InputID.
type WriteResult struct {
	Applied bool `json:"applied"`
}

// AckResult answers ack.
type AckResult struct {
	Acked uint64 `json:"acked"`
}

// CloseResult answers closeInput.
type CloseResult struct {
	Closed bool `json:"closed"`
}

// TokenResult answers mcpToken (the token itself is never echoed).
type TokenResult struct {
	MCPToken bool `json:"mcpToken"`
}

// ReleaseResult answers release with the sandbox id whose holder exits.
type ReleaseResult struct {
	Released string `json:"released"`
}

// MaxFrame bounds one request line: a write's 1 MiB of data, base64'd,
// and its envelope. The supervisor bounds its clients' frames tighter
// before relaying them.
const MaxFrame = 2 << 20

// StopTimeout bounds how long stop waits for the sandbox to end.
const StopTimeout = 60 * time.Second
