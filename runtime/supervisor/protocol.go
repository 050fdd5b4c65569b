// Package supervisor is the root service a Paseo daemon talks to instead
// of runsc: a pathname Unix socket, a small versioned JSON-lines protocol of
// domain operations (create, attach, write, ack, signal, inspect, list,
// delete), peer credentials checked against the registry on every request,
// and a bridge per sandbox that keeps its output while no client is
// attached. It never accepts argv, OCI JSON, runsc flags, host paths or
// mount pairs: a sandbox is made from a deployment id and facts, compiled
// with the embedded, reviewed profiles.
package supervisor

import (
	"encoding/json"

	"paseo.dev/paseo-policy/internal/lineserve"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Version is the protocol version every frame carries.
const Version = 1

// Request is one line from a client.
type Request struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	Op string `json:"op"`

	Deployment string          `json:"deployment,omitempty"` // createSandbox
	Facts      json.RawMessage `json:"facts,omitempty"`      // createSandbox
	Sandbox    string          `json:"sandbox,omitempty"`    // every op on a sandbox
	Cursor     uint64          `json:"cursor,omitempty"`     // attach, ack
	Epoch      uint64          `json:"epoch,omitempty"`      // write, closeInput
	InputID    string          `json:"inputId,omitempty"`    // write
	Data       []byte          `json:"data,omitempty"`       // write (base64 in JSON)
	Signal     string          `json:"signal,omitempty"`     // signal: TERM, INT, KILL
	// MCPToken is the daemon's current MCP bearer (createSandbox, attach):
	// the sandbox's route proxy adds it to every request from then on.
	// It rotates with every daemon run, so a daemon hands it over again
	// each time it (re)attaches. It is kept only in the holder's memory:
	// never logged, echoed in an error, or written to the bundle, a
	// record or the sandbox.
	MCPToken string `json:"mcpToken,omitempty"`
	// DeleteOnExit (createSandbox): the supervisor deletes the sandbox
	// once it has exited and no connection that created or attached it is
	// open (reap.go): a sandbox whose client was killed before it could
	// delete it (a probe) does not stay behind. The holder keeps the flag,
	// so a restarted supervisor reaps it too.
	DeleteOnExit bool `json:"deleteOnExit,omitempty"`
}

// Head is what the connection loop reads of every request.
func (r Request) Head() lineserve.Head { return lineserve.Head{V: r.V, ID: r.ID, Op: r.Op} }

// Response answers a request by id: ok with the op's result (ops.go
// names each op's type), or an error. A refused connection's one response (busy)
// and a frame too broken to have an id answer with id "".
type Response = lineserve.Response[*Error]

// Event is an output record pushed to an attached client.
type Event struct {
	V       int    `json:"v"`
	Event   string `json:"event"` // "output" or "detached"
	Sandbox string `json:"sandbox"`
	Seq     uint64 `json:"seq,omitempty"`
	Stream  string `json:"stream,omitempty"`
	Data    []byte `json:"data,omitempty"`
	// Reason says why an attachment ended (superseded, sandbox ended).
	Reason string `json:"reason,omitempty"`
}

// Error is a typed refusal: package rpcerr's codes and type, which the
// holders' protocol shares (docs/supervisor.md, "Error codes").
type Error = rpcerr.Error

// Sandbox statuses.
const (
	StatusRunning           = "running"
	StatusExited            = "exited"
	StatusRunningUnattached = "running-unattached"
	StatusOrphaned          = "orphaned"
	// StatusHibernated: checkpointed to root-only storage; attach, write,
	// closeInput or wake restore it (docs/supervisor.md "Hibernate").
	StatusHibernated = "hibernated"
)

// Info is what inspect and list report.
type Info struct {
	Sandbox    string `json:"sandbox"`
	Deployment string `json:"deployment"`
	Agent      string `json:"agent"`
	Profile    string `json:"profile"`
	Status     string `json:"status"`
	ExitCode   *int   `json:"exitCode,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// Limit is the limit the launcher ended the sandbox at, by its name in
	// the facts (wallSeconds, outputBytes, memoryBytes): what a caller
	// matches, never Reason.
	Limit   string `json:"limit,omitempty"`
	Epoch   uint64 `json:"epoch"`
	NextSeq uint64 `json:"nextSeq"`
	Acked   uint64 `json:"acked"`
	Paused  bool   `json:"outputPaused"`
	// Packets and Routes, once the sandbox exited, are what its network
	// saw: packets per filter rule tag (allow-<purpose>, drop-egress, ...)
	// and, per private route, requests forwarded and refused.
	Packets map[string]uint64              `json:"packets,omitempty"`
	Routes  map[string]launcher.RouteStats `json:"routes,omitempty"`
	// Search, once the sandbox exited, is what the native search's server
	// did, when the plan granted it: searches answered from the host,
	// answered "fallback" and refused.
	Search *launcher.SearchStats `json:"search,omitempty"`
}

// The results of the ops that do not answer with Info. write, ack and
// closeInput answer as the holder does, in types of their own: the
// client-facing protocol stays apart from the holders' (as containerd's
// client API from its shim API), so one can change without the other.

// AttachResult answers attach: the new attachment's epoch (writes and
// closeInput name it) and the cursor its replay starts after. The fields
// are in the order the protocol has always sent them (it began as a map,
// whose keys encoding/json sorts).
type AttachResult struct {
	Cursor uint64 `json:"cursor"`
	Epoch  uint64 `json:"epoch"`
}

// WriteResult answers write: Applied is false for an input id the bridge
// already applied (a retried write).
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

// SignalResult answers signal with the signal sent, by its full name
// (SIGTERM).
type SignalResult struct {
	Signal string `json:"signal"`
}

// DeleteResult answers delete with the id of the sandbox deleted.
type DeleteResult struct {
	Deleted string `json:"deleted"`
}
