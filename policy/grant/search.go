package grant

import (
	"errors"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Search is the native search (docs/spec.md, "Read-only searches answered
// outside gVisor"): the launcher answers the sandbox's read-only searches
// and name listings (rg, fd, find) from the host, in a jail of their own
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
func (g Search) Access() Access {
	if g.On {
		return Allow
	}
	return Set
}

// Restricts: an off search grants nothing, so adding it widens nothing.
func (g Search) Restricts() bool { return !g.On }

// Against: turning it on widens (the sandbox reaches one more port of its
// gateway, and the host runs searches of the agent's files); off narrows;
// a new port or path is a change to review.
func (g Search) Against(old Grant) Direction {
	o := old.(Search)
	switch {
	case !o.On && g.On:
		return Widened
	case o.On && !g.On:
		return Narrowed
	}
	return Changed
}

func (g Search) Validate() error {
	switch {
	case !g.On && (g.Port != 0 || g.Path != ""):
		return errors.New("a search that is off has no port and no path")
	case g.On && (g.Port < 1 || g.Port > 65535):
		return errors.New("search port must be 1-65535")
	case g.On && !absolute(g.Path):
		return errors.New("search path must be absolute")
	}
	return nil
}

func (g Search) encode() Encoded {
	w := head(g)
	w.Value, w.Port, w.Path = g.On, g.Port, g.Path
	return w
}
