package compiler

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/netdest"
	"paseo.dev/paseo-policy/policy/grant"
)

// network adds the runsc network flag and, in sandbox mode, one egress or
// route grant per destination the profile's purposes and the facts require.
// modelAPI is the model route's provider API, which the generated
// models.json settled (modelroute.go modelsDoc); "" when it was refused.
func (c *compilation) network(p *grant.Plan, modelAPI string) {
	n := c.reg.Network
	p.Add(grant.NetworkMode{Mode: n.Mode, Provenance: why(networkReason(n.Mode), "registry.network.mode")})
	p.Add(grant.DirectFS{On: false, Provenance: why("file access stays behind the gofer", "profile."+c.prof.Name)})
	if n.Mode != "sandbox" {
		c.checkURLs() // still refuse bad URLs: facts must be valid whatever the registry says
		c.fsmonitorGrant(p)
		c.searchGrant(p)
		return
	}
	purposes := c.prof.Egress
	f := c.facts
	if c.modelRouted() {
		c.modelRoute(p, modelAPI)
	} else if slices.Contains(purposes, "model") {
		if host, port, scheme, ok := c.endpoint("model.baseURL", f.Model.BaseURL); ok {
			p.Add(grant.Egress{Host: host, Proto: "tcp", Port: port, Purpose: "model",
				Provenance: why("the selected model endpoint ("+scheme+")", "model.baseURL")})
		}
	} else {
		c.endpoint("model.baseURL", f.Model.BaseURL)
	}
	if f.MCP != nil {
		c.mcpRoute(p, slices.Contains(purposes, "mcp"))
	}
	for i, u := range f.Credential.RefreshURLs {
		fact := fmt.Sprintf("credential.refreshURLs[%d]", i)
		host, port, _, ok := c.endpoint(fact, u)
		if ok && slices.Contains(purposes, "oauth-refresh") && f.Credential.Mode == "oauth-file" {
			p.Add(grant.Egress{Host: host, Proto: "tcp", Port: port, Purpose: "oauth-refresh",
				Provenance: why("OAuth token refresh for the credential in auth.json", fact)})
		}
	}
	if n.DNS == "resolver" && slices.Contains(purposes, "dns") {
		for _, proto := range []string{"udp", "tcp"} {
			p.Add(grant.Egress{Host: n.Resolver, Proto: proto, Port: 53, Purpose: "dns",
				Provenance: why("DNS to the configured resolver only", "registry.network.resolver")})
		}
	}
	c.fsmonitorGrant(p)
	c.searchGrant(p)
}

func networkReason(mode string) string {
	if mode == "none" {
		return "runsc --network=none: loopback only, no egress at all"
	}
	return "runsc --network=sandbox: gVisor's own stack in a fresh netns; the launcher filters egress on the veth peer"
}

func (c *compilation) checkURLs() {
	f := c.facts
	c.endpoint("model.baseURL", f.Model.BaseURL)
	for i, u := range f.Credential.RefreshURLs {
		c.endpoint(fmt.Sprintf("credential.refreshURLs[%d]", i), u)
	}
	if f.MCP != nil {
		c.mcpUpstream()
	}
}

// endpoint parses an egress URL into host and port. Hosts netdest refuses
// (loopback, link-local, metadata, numeric forms parsers disagree on) never
// become egress grants: loopback is the sandbox's own, the others reach the
// host's link or its cloud credentials.
func (c *compilation) endpoint(fact, raw string) (host string, port int, scheme string, ok bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		c.diags.Addf(diag.URLInvalid, fact, "not an absolute URL with a host")
		return "", 0, "", false
	}
	if u.User != nil {
		c.diags.Addf(diag.SecretInFacts, fact, "URL carries user information")
		return "", 0, "", false
	}
	host = strings.ToLower(u.Hostname())
	port, ok = urlPort(u)
	if !ok {
		c.diags.Addf(diag.URLInvalid, fact, "port must be 1-65535")
		return "", 0, "", false
	}
	if v := netdest.Host(host); v.Unsafe() {
		c.diags.Addf(diag.DestUnsafe, fact, "%s; egress destinations must be routable hosts outside the sandbox's host and link", v.Why)
		return "", 0, "", false
	}
	return host, port, u.Scheme, true
}

func urlPort(u *url.URL) (int, bool) {
	if ps := u.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		return n, err == nil && n > 0 && n < 65536
	}
	if u.Scheme == "https" {
		return 443, true
	}
	return 80, true
}

// mcpUpstream checks the daemon MCP URL: it is the daemon's own listener,
// usually loopback, reached only through the launcher's proxy.
func (c *compilation) mcpUpstream() (*url.URL, int, bool) {
	u, err := url.Parse(c.facts.MCP.AgentsURL)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		c.diags.Addf(diag.URLInvalid, "mcp.agentsURL", "must be http://host:port/mcp/agents with no user information, query or fragment")
		return nil, 0, false
	}
	port, ok := urlPort(u)
	if !ok {
		c.diags.Addf(diag.URLInvalid, "mcp.agentsURL", "port must be 1-65535")
		return nil, 0, false
	}
	if u.Path != "/mcp/agents" {
		c.diags.Addf(diag.URLInvalid, "mcp.agentsURL", "path must be /mcp/agents, the only route the proxy forwards")
		return nil, 0, false
	}
	return u, port, true
}

// mcpRoute grants the private MCP route: the sandbox reaches the launcher's
// proxy on its gateway, which forwards only POST /mcp/agents for this agent.
func (c *compilation) mcpRoute(p *grant.Plan, allowed bool) {
	u, port, ok := c.mcpUpstream()
	if !ok || !allowed {
		return
	}
	upstream, fact := u.String(), "mcp.agentsURL"
	if c.dep.Topology == "docker" {
		// The facts' URL is the container's own loopback; the proxy runs on
		// the host and must use the address the registry publishes.
		if c.dep.Daemon == nil || c.dep.Daemon.MCPUpstream == "" {
			c.diags.Addf(diag.Registry, "registry.deployments."+c.facts.Deployment.ID+".daemon.mcpUpstream",
				"a docker deployment needs the host-reachable address of the daemon's MCP listener for the MCP route")
			return
		}
		upstream, fact = c.dep.Daemon.MCPUpstream+u.Path, "registry.deployments."+c.facts.Deployment.ID+".daemon.mcpUpstream"
	}
	methods, tools := c.mcpScope()
	p.Add(grant.Route{Purpose: "mcp", Proto: "tcp", Port: port, Method: "POST", Path: u.Path, Upstream: upstream,
		CallerAgentID: c.facts.Agent.ID, TokenRef: c.facts.MCP.TokenRef, Methods: methods, Tools: tools,
		Provenance: why("Paseo MCP tools via the launcher's per-sandbox proxy on the gateway, which adds the daemon's bearer and forwards only the methods and tools named here "+
			"(profile.mcp, narrowed by registry.deployments."+c.facts.Deployment.ID+".mcp); the daemon's listener itself stays unreachable", fact)})
}

// checkResolver refuses a registry resolver that is not an IP address in
// canonical form, or one netdest refuses: DNS egress to it is a grant like
// any other.
func checkResolver(l *diag.List, resolver string) {
	if resolver == "" {
		return
	}
	const fact = "registry.network.resolver"
	if v := netdest.Host(resolver); v.Unsafe() {
		l.Addf(diag.DestUnsafe, fact, "%s; the resolver must be routable from the sandbox's uplink", v.Why)
		return
	}
	if _, err := netip.ParseAddr(resolver); err != nil {
		l.Addf(diag.Registry, fact, "resolver must be an IP address")
	}
}
