// Package rpcerr is the one set of error codes the supervisor's protocol
// (what a daemon speaks) and the holders' protocol (what the supervisor
// speaks) answer with, and the error both send. Each code has one meaning
// in both; the supervisor passes a holder's refusal to its client as it
// is, never remapped. Callers branch on Code (and, for Refused, on each
// diagnostic's code and fact path), never on Message. Like containerd's
// errdefs, it is a leaf every layer may import.
package rpcerr

import (
	"fmt"

	"paseo.dev/paseo-policy/diag"
)

// Code is a stable error code of the wire protocols.
type Code string

// The codes. docs/supervisor.md ("Error codes") lists each with its
// meaning; TestCodesDocumented holds that table, this list and All to one
// another.
const (
	// Malformed: not one JSON request of the protocol's version with an id
	// and known fields only, a frame too long or too slow, or a field's
	// value refused (a bad MCP token, an unknown signal).
	Malformed Code = "malformed"
	// UnknownOp: the op is not in the protocol.
	UnknownOp Code = "unknown-op"
	// Forbidden: the peer is not bound to the deployment, or the facts
	// name another deployment than the request.
	Forbidden Code = "forbidden"
	// NotFound: no such sandbox for this peer (also a sandbox of a
	// deployment the peer may not use: ids are no oracle).
	NotFound Code = "not-found"
	// Refused: the compiler refused the facts; Diagnostics holds every
	// diagnostic (PP-* code, fact path, message).
	Refused Code = "refused"
	// Unavailable: a new sandbox cannot start on this host (the launcher's
	// preflight, a secret the bundle needs cannot be resolved). Nothing
	// was made. Diagnostics holds each failed preflight check
	// (PP-PREFLIGHT-*, path preflight.<check>), or the launch step that
	// refused (PP-LAUNCH-*, path launch.<step>).
	Unavailable Code = "unavailable"
	// Fenced: a write or closeInput under an epoch that is not the newest
	// attachment's.
	Fenced Code = "fenced"
	// State: the op is not valid in the sandbox's state (its holder is
	// gone, its input is closed, it still runs).
	State Code = "state"
	// OutOfOrder: an attach cursor behind the acknowledged position.
	OutOfOrder Code = "out-of-order"
	// Busy: a connection cap is reached (sent once, then the connection is
	// closed).
	Busy Code = "busy"
	// Quota: the deployment holds its maxSandboxes.
	Quota Code = "quota"
	// Internal: a failure on the service's side; the request may or may
	// not have taken effect (inspect to find out).
	Internal Code = "internal"
	// SandboxUnavailable: a hibernated sandbox's checkpoint cannot be
	// restored (image changed, key rotated, a pin moved, runsc failed).
	// Nothing was cold-started, the sandbox stays hibernated; StartFresh
	// is set: the caller deletes it and creates it again.
	SandboxUnavailable Code = "sandbox-unavailable"
	// InputPending: a hibernate refused because the agent has not read the
	// input it was given (it is working): nothing changed; retry later.
	InputPending Code = "input-pending"
)

// All is every code, in the order docs/supervisor.md lists them.
var All = []Code{Malformed, UnknownOp, Forbidden, NotFound, Refused, Unavailable, Fenced, State,
	OutOfOrder, Busy, Quota, Internal, SandboxUnavailable, InputPending}

// Error is a typed refusal, as both protocols send it.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// Diagnostics are the compiler's, all of them, for Refused; for
	// Unavailable and SandboxUnavailable, the launcher's preflight checks
	// that failed (PP-PREFLIGHT-* at preflight.<check>) or the launch
	// step that refused (PP-LAUNCH-* at launch.<step>; none for another
	// cause); nil otherwise. Each names its PP-* code and path. Messages
	// name no secret values (package diag).
	Diagnostics []diag.Diagnostic `json:"diagnostics,omitempty"`
	// StartFresh is set with SandboxUnavailable: the caller's explicit
	// choice is to delete the sandbox and create it again (a cold start,
	// its session resumed from the session log).
	StartFresh bool `json:"startFresh,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// New is an error with a formatted message.
func New(code Code, format string, a ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, a...)}
}

// Is makes errors.Is(err, &Error{Code: c}) match any error of code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == "" && t.Diagnostics == nil
}
