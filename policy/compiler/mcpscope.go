package compiler

import (
	"slices"
)

// The MCP scope of the private route: which JSON-RPC methods and which
// tools the route proxy forwards to the daemon. The reviewed profile
// names what its kind of Pi process needs (profile.mcp); a deployment's
// registry entry may narrow it (registry.deployments.<id>.mcp) but never
// add to it, so an operator cannot widen a profile by mistake. The result
// is written into the route grant's methods and tools, in the profile's
// order, where explain shows it and diff flags a widening.

// mcpScope returns the route's scope.
func (c *compilation) mcpScope() (methods, tools []string) {
	if c.prof.MCP == nil {
		return nil, nil // no scope: the proxy forwards nothing
	}
	methods, tools = c.prof.MCP.Methods, c.prof.MCP.Tools
	if n := c.dep.MCP; n != nil {
		methods, tools = narrow(methods, n.Methods), narrow(tools, n.Tools)
	}
	// tools/call without the method allows no tool: keep the two consistent.
	if !slices.Contains(methods, "tools/call") && !slices.Contains(methods, "tools/list") {
		tools = nil
	}
	return slices.Clone(methods), slices.Clone(tools)
}

// narrow keeps the profile's entries the registry names, or all of them
// when the registry names none (a nil list; an empty one keeps nothing).
func narrow(profile, registry []string) []string {
	if registry == nil {
		return profile
	}
	var out []string
	for _, v := range profile {
		if slices.Contains(registry, v) && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
