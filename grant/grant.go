// Package grant defines the plan the compiler produces: an ordered list of
// grants, each one thing the sandbox may do or have, with the reason and the
// fact that produced it. Every artifact is a rendering of this list.
package grant

import "strconv"

// Kind names what a grant controls.
type Kind string

const (
	Rootfs    Kind = "rootfs"    // the read-only image root
	Process   Kind = "process"   // argv, cwd, terminal, no-new-privileges, capabilities
	Identity  Kind = "identity"  // uid, gid
	Mount     Kind = "mount"     // a bind, tmpfs or kernel filesystem
	Env       Kind = "env"       // one environment variable
	Egress    Kind = "egress"    // one allowed destination
	Route     Kind = "route"     // a private route the launcher proxies (MCP)
	Rlimit    Kind = "rlimit"    // a POSIX rlimit
	Cgroup    Kind = "cgroup"    // a cgroup resource limit
	Namespace Kind = "namespace" // a new namespace
	Runtime   Kind = "runtime"   // a runsc flag
	Limit     Kind = "limit"     // a limit the launcher enforces (output, wall time)
	Hostname  Kind = "hostname"  // the UTS hostname
)

// Access says how much of the subject is granted.
type Access string

const (
	RO    Access = "ro"
	RW    Access = "rw"
	Set   Access = "set"   // a value is set (env, identity, runtime flag, process field)
	Allow Access = "allow" // egress or route allowed
	Max   Access = "max"   // an upper bound
	New   Access = "new"   // a fresh namespace
)

// Grant is one unit of authority. Which optional fields are used depends on
// Kind; docs/grants.md lists them per kind.
type Grant struct {
	Kind    Kind     `json:"kind"`
	Subject string   `json:"subject"`
	Access  Access   `json:"access"`
	Value   string   `json:"value,omitempty"`
	Args    []string `json:"args,omitempty"`    // process argv words
	Source  string   `json:"source,omitempty"`  // mount source (host path or bundle-relative file)
	Type    string   `json:"type,omitempty"`    // mount type
	Options []string `json:"options,omitempty"` // mount options
	Proto   string   `json:"proto,omitempty"`   // egress protocol
	Port    int      `json:"port,omitempty"`    // egress port
	Reason  string   `json:"reason"`
	Fact    string   `json:"fact"` // the fact path, registry.* or profile.* that produced it
}

// Key identifies a grant across two plans, for diff: the same key in both
// plans is the same grant, possibly changed.
func (g Grant) Key() string {
	switch g.Kind {
	case Egress:
		return string(g.Kind) + " " + g.Proto + " " + g.Subject + " " + strconv.Itoa(g.Port)
	}
	return string(g.Kind) + " " + g.Subject
}

// Plan is the compiler's whole decision for one launch.
type Plan struct {
	Grants []Grant `json:"grants"`
}

// Add appends a grant.
func (p *Plan) Add(g Grant) { p.Grants = append(p.Grants, g) }

// Of returns the grants of one kind, in plan order.
func (p *Plan) Of(k Kind) []Grant {
	var out []Grant
	for _, g := range p.Grants {
		if g.Kind == k {
			out = append(out, g)
		}
	}
	return out
}
