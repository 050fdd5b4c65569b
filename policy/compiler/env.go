package compiler

import (
	"slices"
	"sort"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// env adds the environment allowlist. Nothing from the daemon's own
// environment passes; each variable is a grant with its reason. gitEnv is
// the private Git dir's, which the binds settled (gitprotect.go repoView).
func (c *compilation) env(p *grant.Plan, gitEnv []grant.Env) {
	f := c.facts
	prof := "profile." + c.prof.Name
	add := func(name, value, reason, fact string) {
		p.Add(grant.Env{Name: name, Value: value, Provenance: why(reason, fact)})
	}
	add("HOME", sandboxHome, "private tmpfs home", prof)
	path, reason, fact := c.searchPath()
	add("PATH", path, reason, fact)
	add("TMPDIR", sandboxTmp, "private tmpfs", prof)
	add("LANG", sandboxLang, "fixed locale", prof)
	add("PI_OFFLINE", "1", "no catalog refresh, update check or helper download at run time", prof)
	add("PI_TELEMETRY", "0", "no install telemetry, whatever settings.json says (egress is deny-by-default anyway)", prof)
	add("PI_MCP_CONFIG_MODE", "exclusive", "pi-mcp-adapter reads only <agentDir>/mcp.json (the generated one, or none): never a workspace's .mcp.json or .pi/mcp.json, whose servers it would start", prof)
	add("PI_CODING_AGENT_DIR", f.State.AgentDir, "Pi's state dir: this sandbox's private projection of the agent dir", "state.agentDir")
	if c.prof.State.SessionDir != "none" {
		add("PI_CODING_AGENT_SESSION_DIR", f.State.SessionDir, "where Pi writes session logs", "state.sessionDir")
	}
	add("PASEO_AGENT_ID", f.Agent.ID, "Paseo's agent id for the integration extension", "agent.id")
	add("PASEO_AGENT_CWD", f.Workspace.Cwd, "Paseo's agent cwd for the integration extension", "workspace.cwd")
	for _, e := range gitEnv {
		p.Add(e)
	}
	if f.Credential.Mode == "api-key" && f.Credential.Env != "" {
		// Pi needs some key to call the model at all; the real one stays
		// with the model route's proxy, which accepts this one only.
		add(f.Credential.Env, bundle.ModelRoutePlaceholder,
			"a placeholder worth nothing outside the model route; the provider key (credential.secretRef) never enters the sandbox: the route adds it", "credential.secretRef")
	}
	names := make([]string, 0, len(c.prof.Env))
	for k := range c.prof.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if slices.ContainsFunc(p.Grants, func(g grant.Grant) bool { return g.Kind() == grant.KindEnv && g.Subject() == k }) {
			c.diags.Addf(diag.ProfileInvalid, prof+".env."+k, "the profile may not override the fixed environment")
			continue
		}
		add(k, c.prof.Env[k], "set by profile", prof+".env."+k)
	}
	c.fsmonitorEnv(p)
}
