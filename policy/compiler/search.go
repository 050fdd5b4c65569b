package compiler

import (
	"slices"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The native search (grant search workspace; docs/spec.md, "Read-only
// searches answered outside gVisor")
//
// An operator's opt-in per deployment (deployments.<id>.search "native"),
// for a profile that can use it (profile.nativeSearch: pi-session): the
// launcher answers the sandbox's rg, fd, find and cat from the host, in a jail
// of its own, on the gateway at a port no route and not the monitor has.
// It widens the trusted boundary (the agent's files meet the host kernel
// through those tools and the jail, not gVisor's Sentry), so it is never a default. The
// grants: the search itself (the launcher serves it), the client bound
// read-only at bundle.SearchDir under each of bundle.SearchClientNames (a
// bundle file: Perl naming the gateway, the port and the workspace), the
// spool for cat's bytes bound read-only at bundle.SearchSpoolPath, and
// PATH starting with bundle.SearchDir, so config.json says all of it.
// Network mode none has no gateway: the switch on is then refused
// (PP-SEARCH-GATEWAY), never silently off.

// searchPort is the search's port on the gateway, unless a route or the
// monitor has it (then the next free one).
const searchPort = 18091

// searchPlan is the compile's decision, made before the grants.
type searchPlan struct {
	on           bool
	reason, fact string
}

// decideSearch decides the search from the profile, the deployment's
// switch and the registry's network mode; nil: neither the profile nor the
// deployment asks for it, and the plan says nothing of it.
func (c *compilation) decideSearch() *searchPlan {
	prof := "profile." + c.prof.Name + ".nativeSearch"
	sw := "registry.deployments." + c.facts.Deployment.ID + ".search"
	native := c.dep.Search == "native"
	switch {
	case !c.prof.NativeSearch && !native:
		return nil
	case !c.prof.NativeSearch:
		return &searchPlan{reason: "the deployment turns it on, and profile " + c.prof.Name + " does not use it: its searches run in the sandbox", fact: sw + "," + prof}
	case !native:
		return &searchPlan{reason: "an operator's opt-in (registry deployments.<id>.search \"native\"), not turned on for this deployment: the sandbox's rg, fd and find search the workspace through the gofer", fact: sw + "," + prof}
	case c.reg.Network.Mode != "sandbox":
		c.diags.Addf(diag.SearchGateway, sw, "the deployment turns the native search on, which is served on the sandbox network's gateway only, and registry.network.mode is %q", c.reg.Network.Mode)
		return nil
	}
	return &searchPlan{on: true, reason: "turned on by the registry for this deployment: the sandbox's rg, fd, find and cat ask the launcher, which runs the image's own on the host in a jail of its own (namespaces, Landlock, seccomp, the workspace and the image's /usr read-only, the agent's uid); widens the trusted boundary", fact: sw + "," + prof}
}

// searchMounts binds the client under each of its names, read-only and
// executable (the sandbox's shell and Pi's tools run it).
func (c *compilation) searchMounts(p *grant.Plan) {
	if c.search == nil || !c.search.on {
		return
	}
	for _, n := range bundle.SearchClientNames {
		p.Add(grant.Mount{Destination: bundle.SearchDir + "/" + n, Type: "bind", Source: bundle.SearchClientFile, Options: []string{"bind", "ro", "nosuid", "nodev"},
			Provenance: why("generated: the native search's client, answering as "+n+"; it asks the launcher on the gateway and runs the image's "+n+" for whatever it does not forward", c.search.fact)})
	}
	p.Add(grant.Mount{Destination: bundle.SearchSpoolPath, Type: "bind", Source: bundle.SearchSpoolFile, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		Provenance: why("generated, empty: the spool the launcher writes the bytes of the cats it answers into (this sandbox's own answers only) and the client reads them from, a file's read through the gofer instead of the sandbox's network stack; read-only here, written by the launcher only", c.search.fact)})
}

// searchPath is PATH with the client's directory first when the search is
// on: the value, its reason and its fact.
func (c *compilation) searchPath() (value, reason, fact string) {
	value, reason, fact = c.reg.Image.Path, "the image's fixed tool paths", "registry.image.path"
	if c.search != nil && c.search.on {
		value = bundle.SearchDir + ":" + value
		reason = "the native search's client first (bound read-only at " + bundle.SearchDir + "), then the image's fixed tool paths"
		fact += "," + c.search.fact
	}
	return value, reason, fact
}

// searchGrant adds the search, on at a port no route and not the monitor
// has, or off with its reason; after the routes and the monitor, whose
// ports it avoids.
func (c *compilation) searchGrant(p *grant.Plan) {
	if c.search == nil {
		return
	}
	if !c.search.on {
		p.Add(grant.Search{Provenance: why(c.search.reason, c.search.fact)})
		return
	}
	port := searchPort
	for slices.ContainsFunc(p.Grants, func(g grant.Grant) bool { return gatewayPort(g) == port }) {
		port++
	}
	p.Add(grant.Search{On: true, Port: port, Path: c.facts.Workspace.Cwd, Provenance: why(c.search.reason, c.search.fact)})
}

// gatewayPort is the port a grant listens on at the gateway, or 0.
func gatewayPort(g grant.Grant) int {
	switch g := g.(type) {
	case grant.Route:
		return g.Port
	case grant.FSMonitor:
		return g.Port
	case grant.Search:
		return g.Port
	}
	return 0
}
