package grant

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// FSMonitor is the workspace monitor (docs/spec.md, "An agent's tools and
// the file path"): the launcher watches the workspace bind at Path from
// the host and answers the sandbox's git (core.fsmonitor) which names
// changed, over TCP on the sandbox network's gateway at Port. The hook's
// bind and the Git setting are grants of their own (a mount, env); this
// one tells the launcher to serve it. Off, it records that the profile
// asked for the monitor and why this launch has none (no gateway, the
// registry turned it off).
type FSMonitor struct {
	On   bool
	Port int    // on the gateway; 0 when off
	Path string // the watched workspace in the sandbox (the cwd); "" when off
	Provenance
}

func (FSMonitor) Kind() Kind              { return KindFSMonitor }
func (FSMonitor) Subject() string         { return "workspace" }
func (g FSMonitor) Key() string           { return key(g) }
func (FSMonitor) Apply(*specs.Spec) error { return nil }

// Access is allow when the launcher serves it, set (to off) otherwise.
func (g FSMonitor) Access() Access { return servedAccess(g.On) }

// Restricts: an off monitor grants nothing, so adding it widens nothing.
func (g FSMonitor) Restricts() bool { return !g.On }

// Against: turning it on widens (the sandbox reaches one more port of its
// gateway and gets answers from the host); off narrows; a new port or
// path is a change to review.
func (g FSMonitor) Against(old Grant) Direction { return servedAgainst(old.(FSMonitor).On, g.On) }

func (g FSMonitor) Validate() error { return validateServed("fsmonitor", g.On, g.Port, g.Path) }

func (g FSMonitor) encode() Encoded {
	w := head(g)
	w.Value, w.Port, w.Path = g.On, g.Port, g.Path
	return w
}
