// Package grant defines the plan the compiler produces: an ordered list of
// grants, each one thing the sandbox may do or have, with the reason and the
// fact that produced it. Every artifact is a rendering of this list.
//
// Each kind of grant is its own Go type carrying its payload as typed
// fields. Each knows its diff key, how it applies to an OCI spec (Apply, in
// the manner of containerd's oci.SpecOpts), how it compares
// with its old version, and how to validate itself. Nothing downstream
// parses a grant's text.
package grant

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/diag"
)

// Kind names what a grant controls. Several Go types may share a kind
// (process argv and cwd); kind and subject together pick the type.
type Kind string

const (
	KindRootfs    Kind = "rootfs"    // the read-only image root
	KindProcess   Kind = "process"   // argv, cwd, terminal, no-new-privileges, capabilities
	KindIdentity  Kind = "identity"  // uid, gid
	KindMount     Kind = "mount"     // a bind, tmpfs, EROFS or kernel filesystem
	KindEnv       Kind = "env"       // one environment variable
	KindEgress    Kind = "egress"    // one allowed destination
	KindRoute     Kind = "route"     // a private route the launcher proxies (MCP)
	KindRlimit    Kind = "rlimit"    // a POSIX rlimit
	KindCgroup    Kind = "cgroup"    // a cgroup resource limit
	KindNamespace Kind = "namespace" // a new namespace
	KindRuntime   Kind = "runtime"   // a runsc flag
	KindLimit     Kind = "limit"     // a limit the launcher enforces (output, wall time)
	KindHostname  Kind = "hostname"  // the UTS hostname
	KindFSMonitor Kind = "fsmonitor" // the workspace monitor the launcher serves
	KindSearch    Kind = "search"    // the native search the launcher serves (an operator's opt-in)
)

// Access says how much of the subject is granted. It is derived from the
// typed payload, never set on its own.
type Access string

const (
	RO    Access = "ro"
	RW    Access = "rw"
	Set   Access = "set"   // a value is set (env, identity, runtime flag, process field)
	Allow Access = "allow" // egress or route allowed
	Max   Access = "max"   // an upper bound
	New   Access = "new"   // a fresh namespace
)

// Provenance is what every grant carries besides its authority: why it
// exists and the fact path (registry.*, profile.* or a facts path; several
// joined by commas) that produced it.
type Provenance struct {
	Reason string
	Fact   string
}

// Why returns the grant's provenance; every kind embeds Provenance.
func (p Provenance) Why() Provenance { return p }

// Direction is how a changed grant compares with its old version.
type Direction int

const (
	Changed  Direction = iota // neither can be shown: review it as a widening
	Widened                   // grants more
	Narrowed                  // grants less
)

// Grant is one unit of authority.
type Grant interface {
	Kind() Kind
	// Subject is what the grant applies to: a mount destination, a variable
	// name, a host, a limit name, or a fixed word (argv, uid, network).
	Subject() string
	Access() Access
	// Key identifies a grant across two plans, for diff: the same key in
	// both plans is the same grant, possibly changed.
	Key() string
	Why() Provenance
	// Apply sets the grant's part of an OCI spec, creating sub-structs as
	// needed; kinds the spec does not carry (egress, routes, launcher
	// limits, runsc flags) leave it alone.
	Apply(*specs.Spec) error
	// Against compares the grant with its old version of the same key,
	// when their authority differs.
	Against(old Grant) Direction
	// Restricts reports whether the grant takes authority away, so adding
	// it narrows the sandbox and removing it widens it.
	Restricts() bool
	// Validate checks the payload on its own (the compiler's refusals
	// need the facts; these need only the grant).
	Validate() error

	encode() Encoded
}

func key(g Grant) string { return string(g.Kind()) + " " + g.Subject() }

// Plan is the compiler's whole decision for one launch.
type Plan struct {
	Grants List `json:"grants"`
}

// Add appends a grant.
func (p *Plan) Add(g Grant) { p.Grants = append(p.Grants, g) }

// Of returns the grants of one kind, in plan order.
func (p *Plan) Of(k Kind) []Grant {
	var out []Grant
	for _, g := range p.Grants {
		if g.Kind() == k {
			out = append(out, g)
		}
	}
	return out
}

// List is an ordered list of grants; in JSON, a tagged union per element
// (wire.go).
type List []Grant

// Validate checks every grant and returns the first problem, with its index.
func (l List) Validate() error {
	for i, g := range l {
		if err := g.Validate(); err != nil {
			return &Error{Code: diag.GrantInvalid, Index: i, Err: err}
		}
	}
	return nil
}
