package grant

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Search is the native search (docs/spec.md, "Read-only searches answered
// outside gVisor"): the launcher answers the sandbox's read-only searches
// and name listings (rg, fd, find) and cats of a batch of files from the host, in a jail of their own
// that holds the workspace at Path read-only and the image's /usr, over
// TCP on the sandbox network's gateway at Port. It widens the trusted
// boundary (the agent's files meet the host kernel through those tools
// and the jail, not gVisor's Sentry), so it is
// an operator's opt-in per deployment, never a default. The client's
// binds and PATH are grants of their own (mounts, env); this one tells
// the launcher to serve it. Off, it records that the profile could use it
// and why this launch has none.
type Search struct {
	On   bool
	Port int    // on the gateway; 0 when off
	Path string // the workspace in the sandbox (the cwd); "" when off
	Provenance
}

func (Search) Kind() Kind              { return KindSearch }
func (Search) Subject() string         { return "workspace" }
func (g Search) Key() string           { return key(g) }
func (Search) Apply(*specs.Spec) error { return nil }

// Access is allow when the launcher serves it, set (to off) otherwise.
func (g Search) Access() Access { return servedAccess(g.On) }

// Restricts: an off search grants nothing, so adding it widens nothing.
func (g Search) Restricts() bool { return !g.On }

// Against: turning it on widens (the sandbox reaches one more port of its
// gateway, and the host runs searches of the agent's files); off narrows;
// a new port or path is a change to review.
func (g Search) Against(old Grant) Direction { return servedAgainst(old.(Search).On, g.On) }

func (g Search) Validate() error { return validateServed("search", g.On, g.Port, g.Path) }

func (g Search) encode() Encoded {
	w := head(g)
	w.Value, w.Port, w.Path = g.On, g.Port, g.Path
	return w
}
