package compiler

import (
	"slices"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The workspace monitor (grant fsmonitor workspace; docs/spec.md, "An
// agent's tools and the file path")
//
// A profile that asks for it (pi-session) gets it by default wherever the
// network is sandbox mode: a `git status` on a large workspace is then
// about its changed names instead of a full scan through the gofer. The
// grants: the monitor itself (the launcher serves it on the gateway, at
// a port no route has), the hook bound read-only at
// bundle.FSMonitorHookPath (a bundle file: Perl naming the gateway and the
// port), and core.fsmonitor as one more of the profile's Git settings.
// Network mode none has no gateway: the monitor is then off, and the
// grant says why. The registry may turn it off per deployment
// (deployments.<id>.fsmonitor "off") or require it ("on": a launch that
// cannot have it is refused, PP-FSMONITOR, never launched without).

// fsmonitorPort is the monitor's port on the gateway, unless a route has it.
const fsmonitorPort = 18090

// fsmonitorPlan is the compile's decision, made before the grants.
type fsmonitorPlan struct {
	on           bool
	reason, fact string
}

// decideFSMonitor decides the monitor from the profile, the registry's
// network mode and the deployment's switch; nil: the profile does not
// ask for it, and the plan says nothing of it.
func (c *compilation) decideFSMonitor() *fsmonitorPlan {
	if !c.prof.FSMonitor {
		return nil
	}
	prof := "profile." + c.prof.Name + ".fsmonitor"
	sw := "registry.deployments." + c.facts.Deployment.ID + ".fsmonitor"
	switch {
	case c.dep.FSMonitor == "off":
		return &fsmonitorPlan{reason: "turned off for this deployment: the sandbox's git scans the workspace in full", fact: sw}
	case c.reg.Network.Mode != "sandbox" && c.dep.FSMonitor == "on":
		c.diags.Addf(diag.FSMonitor, sw, "the deployment requires the workspace monitor, which is served on the sandbox network's gateway only, and registry.network.mode is %q", c.reg.Network.Mode)
		return nil
	case c.reg.Network.Mode != "sandbox":
		return &fsmonitorPlan{reason: "network mode none has no gateway to serve it on; the sandbox's git scans the workspace in full", fact: "registry.network.mode," + prof}
	case c.dep.FSMonitor == "on":
		return &fsmonitorPlan{on: true, reason: "required by the registry for this deployment", fact: sw + "," + prof}
	}
	return &fsmonitorPlan{on: true, reason: "on by default where the sandbox network exists: the sandbox's git asks the launcher's watcher which names changed instead of scanning every file through the gofer", fact: prof + ",registry.network.mode"}
}

// fsmonitorMount binds the hook, read-only and executable (Git runs it),
// and the vouched index beside it, read-only.
func (c *compilation) fsmonitorMount(p *grant.Plan) {
	if c.fsmon == nil || !c.fsmon.on {
		return
	}
	p.Add(grant.Mount{Destination: bundle.FSMonitorHookPath, Type: "bind", Source: bundle.FSMonitorHookFile, Options: []string{"bind", "ro", "nosuid", "nodev"},
		Provenance: why("generated: the workspace monitor's core.fsmonitor hook, which asks the launcher on the gateway", c.fsmon.fact)})
	p.Add(grant.Mount{Destination: bundle.FSMonitorIndexPath, Type: "bind", Source: bundle.FSMonitorIndexFile, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		Provenance: why("generated empty: the index the launcher vouched for, written at launch, which the start script seeds the private Git dir's index from when it is not empty", c.fsmon.fact)})
}

// fsmonitorEnv adds core.fsmonitor after the profile's Git settings
// (GIT_CONFIG_COUNT/KEY_n/VALUE_n): the count the profile set, one more.
func (c *compilation) fsmonitorEnv(p *grant.Plan) {
	if c.fsmon == nil || !c.fsmon.on {
		return
	}
	prof := "profile." + c.prof.Name + ".env"
	n := 0
	if v, ok := c.prof.Env["GIT_CONFIG_COUNT"]; ok {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 || n > 100 {
			c.diags.Addf(diag.ProfileInvalid, prof+".GIT_CONFIG_COUNT", "not a count of Git settings")
			return
		}
	}
	for i := range n {
		if v := c.prof.Env["GIT_CONFIG_KEY_"+strconv.Itoa(i)]; strings.EqualFold(v, "core.fsmonitor") {
			c.diags.Addf(diag.ProfileInvalid, prof+".GIT_CONFIG_KEY_"+strconv.Itoa(i), "core.fsmonitor is the workspace monitor's (profile.fsmonitor)")
			return
		}
	}
	count := strconv.Itoa(n + 1)
	i := slices.IndexFunc(p.Grants, func(g grant.Grant) bool { return g.Kind() == grant.KindEnv && g.Subject() == "GIT_CONFIG_COUNT" })
	reason := "the profile's Git settings and the workspace monitor's core.fsmonitor"
	if i >= 0 {
		p.Grants[i] = grant.Env{Name: "GIT_CONFIG_COUNT", Value: count, Provenance: why(reason, prof+".GIT_CONFIG_COUNT,"+c.fsmon.fact)}
	} else {
		p.Add(grant.Env{Name: "GIT_CONFIG_COUNT", Value: count, Provenance: why(reason, c.fsmon.fact)})
	}
	k := strconv.Itoa(n)
	p.Add(grant.Env{Name: "GIT_CONFIG_KEY_" + k, Value: "core.fsmonitor", Provenance: why("the sandbox's git asks the workspace monitor which names changed", c.fsmon.fact)})
	p.Add(grant.Env{Name: "GIT_CONFIG_VALUE_" + k, Value: bundle.FSMonitorHookPath, Provenance: why("the hook the monitor's mount binds", c.fsmon.fact)})
}

// fsmonitorGrant adds the monitor, on at a port no route has, or off with
// its reason; after the routes, whose ports it avoids.
func (c *compilation) fsmonitorGrant(p *grant.Plan) {
	if c.fsmon == nil {
		return
	}
	if !c.fsmon.on {
		p.Add(grant.FSMonitor{Provenance: why(c.fsmon.reason, c.fsmon.fact)})
		return
	}
	port := fsmonitorPort
	for slices.ContainsFunc(p.Of(grant.KindRoute), func(g grant.Grant) bool { return g.(grant.Route).Port == port }) {
		port++
	}
	p.Add(grant.FSMonitor{On: true, Port: port, Path: c.facts.Workspace.Cwd, Provenance: why(c.fsmon.reason, c.fsmon.fact)})
}
