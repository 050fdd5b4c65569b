package grant

import "fmt"

// The host services on the sandbox's gateway (the workspace monitor, the
// native search) are grants of one shape: on with a port on the gateway
// and the workspace's path, or off with neither and the reason why. What
// follows is that shape's behaviour, once; each grant's methods call it.

// servedAccess is allow when the launcher serves it, set (to off)
// otherwise.
func servedAccess(on bool) Access {
	if on {
		return Allow
	}
	return Set
}

// servedAgainst: turning a service on widens (the sandbox reaches one
// more port of its gateway and the host acts for it); off narrows; a new
// port or path is a change to review.
func servedAgainst(was, is bool) Direction {
	switch {
	case !was && is:
		return Widened
	case was && !is:
		return Narrowed
	}
	return Changed
}

// validateServed checks the shape: off has no port and no path; on has a
// port and an absolute path. name is the grant's kind, for the message.
func validateServed(name string, on bool, port int, path string) error {
	switch {
	case !on && (port != 0 || path != ""):
		return fmt.Errorf("%s: off, so no port and no path", name)
	case on && (port < 1 || port > 65535):
		return fmt.Errorf("%s port must be 1-65535", name)
	case on && !absolute(path):
		return fmt.Errorf("%s path must be absolute", name)
	}
	return nil
}
