// Package oci renders a plan of grants into the OCI bundle runsc runs:
// config.json (the runtime spec), egress.json, the generated /etc files,
// the MCP config and models.json the plan mounts, manifest.json and
// pins.json. It is one rendering of the plan beside the Kubernetes one
// (policy/render/kubernetes), which reads the bundle this one writes.
//
// It reads the plan and nothing else (no compilation state, registry or
// host), so whatever the plan says is exactly what the bundle does, and
// the same plan gives the same bytes.
package oci

import (
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// gatewayHost is where egress.json says a route listens: the gateway
// address the launcher leases at launch.
const gatewayHost = "gateway"

// Render turns the plan into bundle files and the manifest they carry.
func Render(plan *bundle.Plan) (bundle.Files, *bundle.Manifest, error) {
	spec, err := Spec(&plan.Plan)
	if err != nil {
		return nil, nil, err
	}
	files := bundle.Files{}
	if files[bundle.ConfigFile], err = bundle.Marshal(spec); err != nil {
		return nil, nil, err
	}
	if files[bundle.EgressFile], err = bundle.Marshal(Egress(&plan.Plan, plan.DNS)); err != nil {
		return nil, nil, err
	}
	files[bundle.HostsFile] = renderHosts(&plan.Plan)
	files[bundle.ResolvFile] = renderResolv(&plan.Plan)
	if mcp, ok, err := renderMCPConfig(&plan.Plan); err != nil {
		return nil, nil, err
	} else if ok {
		files[bundle.MCPConfigFile] = mcp
	}
	for _, g := range plan.Grants {
		if m, ok := g.(grant.Mount); ok && m.Source == bundle.GitHeadFile {
			files[bundle.GitHeadFile] = []byte(bundle.GitHostWorktreeHead)
		}
		if m, ok := g.(grant.Mount); ok && m.Source == bundle.ModelsFile {
			files[bundle.ModelsFile] = plan.Models
		}
		if m, ok := g.(grant.FSMonitor); ok && m.On {
			files[bundle.FSMonitorHookFile] = bundle.FSMonitorHook(bundle.GatewayName, m.Port, m.Path)
			files[bundle.FSMonitorIndexFile] = []byte{} // the launcher writes the run dir's copy
		}
		if s, ok := g.(grant.Search); ok && s.On {
			files[bundle.SearchClientFile] = bundle.SearchClient(bundle.GatewayName, s.Port, s.Path)
			files[bundle.SearchSpoolFile] = []byte{} // the launcher's server writes the run dir's copy
		}
	}
	m := renderManifest(plan, files)
	if files[bundle.ManifestFile], err = bundle.MarshalManifest(m); err != nil {
		return nil, nil, err
	}
	// pins.json names the manifest it belongs to, so it comes last.
	pins := &bundle.Pins{APIVersion: bundle.APIVersion, Kind: bundle.PinsKind, Manifest: bundle.Digest(files[bundle.ManifestFile]), Pins: plan.Pins}
	if pins.Pins == nil {
		pins.Pins = []bundle.Pin{}
	}
	if files[bundle.PinsFile], err = bundle.Marshal(pins); err != nil {
		return nil, nil, err
	}
	return files, m, nil
}

// Spec renders config.json from the plan: a base spec, then each grant's
// Apply in plan order.
func Spec(plan *grant.Plan) (*specs.Spec, error) {
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Capabilities: &specs.LinuxCapabilities{
				Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{},
			},
		},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{}},
	}
	for _, g := range plan.Grants {
		if err := g.Apply(s); err != nil {
			return nil, fmt.Errorf("grant %s: %w", g.Key(), err)
		}
	}
	return s, nil
}

// Egress renders egress.json from the plan: deny by default, one rule per
// egress grant, one route per route grant.
func Egress(plan *grant.Plan, dns string) *bundle.Egress {
	e := &bundle.Egress{APIVersion: bundle.APIVersion, Kind: "Egress", Default: "deny", DNS: dns,
		Rules: []bundle.EgressRule{}, Routes: []bundle.Route{}}
	if len(plan.Of(grant.KindRoute)) > 0 || fsmonitorOn(plan) || searchOn(plan) {
		e.Gateway = &bundle.Gateway{Name: bundle.GatewayName}
	}
	for _, g := range plan.Grants {
		switch g := g.(type) {
		case grant.NetworkMode:
			e.Mode = g.Mode
		case grant.Egress:
			e.Rules = append(e.Rules, bundle.EgressRule{Proto: g.Proto, Host: g.Host, Port: g.Port, Purpose: g.Purpose, Fact: g.Fact})
		case grant.Route:
			// Empty, not null: the proxy forwards nothing outside these.
			e.Routes = append(e.Routes, bundle.Route{Purpose: g.Purpose, Listen: gatewayHost, Port: g.Port, Method: g.Method, Path: g.Path,
				Upstream: g.Upstream, Fact: g.Fact, CallerAgentID: g.CallerAgentID, TokenRef: g.TokenRef,
				Methods: orEmpty(g.Methods), Tools: orEmpty(g.Tools), API: g.API, Credential: g.Credential, Requests: g.Requests,
				Model: g.Model, Headers: g.Headers, HostedTools: g.HostedTools,
				LoginFile: g.LoginFile, LoginEntry: g.LoginEntry, LoginRefresh: g.LoginRefresh})
		}
	}
	return e
}

// renderHosts writes the base /etc/hosts. Names egress may reach are listed
// as comments; the launcher resolves them on the trusted side and appends
// the pinned addresses in its private copy, and the gateway's address
// under its name (egress.json's gateway).
func renderHosts(plan *grant.Plan) []byte {
	var b strings.Builder
	b.WriteString("# generated by paseo-policy; the launcher appends pinned egress addresses\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, g := range plan.Of(grant.KindHostname) {
		b.WriteString("127.0.1.1\t" + g.(grant.Hostname).Name + "\n")
	}
	var names []string
	for _, g := range plan.Of(grant.KindEgress) {
		if net.ParseIP(g.Subject()) == nil {
			names = append(names, g.Subject())
		}
	}
	sort.Strings(names)
	for i, n := range names {
		if i > 0 && names[i-1] == n {
			continue
		}
		b.WriteString("# pin: " + n + "\n")
	}
	return []byte(b.String())
}

// renderMCPConfig writes the MCP config Pi's adapter reads when the plan
// has the private MCP route and mounts it: Paseo's server only (the seed's
// minimum contract), addressed to the launcher's proxy on the gateway,
// with auth and OAuth off as Paseo injects it, and no bearer: the route
// proxy adds the daemon's current one outside the sandbox.
func renderMCPConfig(plan *grant.Plan) ([]byte, bool, error) {
	mounted := false
	var route *grant.Route
	for _, g := range plan.Grants {
		switch g := g.(type) {
		case grant.Mount:
			mounted = mounted || g.Source == bundle.MCPConfigFile
		case grant.Route:
			if g.Purpose == grant.RouteMCP {
				route = &g
			}
		}
	}
	if !mounted || route == nil {
		return nil, false, nil
	}
	u := url.URL{Scheme: "http", Host: net.JoinHostPort(bundle.GatewayName, strconv.Itoa(route.Port)), Path: route.Path,
		RawQuery: url.Values{"callerAgentId": {route.CallerAgentID}}.Encode()}
	doc := bundle.MCPConfig{Servers: map[string]bundle.MCPServer{bundle.MCPServerName: {URL: u.String(), Auth: false, OAuth: false}}}
	out, err := bundle.Marshal(doc)
	return out, true, err
}

func renderResolv(plan *grant.Plan) []byte {
	var b strings.Builder
	b.WriteString("# generated by paseo-policy\n")
	servers := map[string]bool{}
	for _, g := range plan.Grants {
		if e, ok := g.(grant.Egress); ok && e.Purpose == "dns" && !servers[e.Host] {
			servers[e.Host] = true
			b.WriteString("nameserver " + e.Host + "\n")
		}
	}
	if len(servers) == 0 {
		b.WriteString("# no resolver: egress names are pinned in /etc/hosts\noptions ndots:0 attempts:1 timeout:1\n")
	}
	return []byte(b.String())
}

// renderManifest is the plan's header with its grants and the digest of
// every other output.
func renderManifest(plan *bundle.Plan, files bundle.Files) *bundle.Manifest {
	m := plan.Header
	m.Grants = plan.Grants
	m.Outputs = map[string]string{}
	for _, n := range files.Names() {
		if n != bundle.PinsFile {
			m.Outputs[n] = bundle.Digest(files[n])
		}
	}
	return &m
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// fsmonitorOn reports whether the plan serves the workspace monitor (its
// hook names the gateway).
func fsmonitorOn(plan *grant.Plan) bool {
	for _, g := range plan.Of(grant.KindFSMonitor) {
		if g.(grant.FSMonitor).On {
			return true
		}
	}
	return false
}

// searchOn reports whether the plan serves the native search (its client
// names the gateway).
func searchOn(plan *grant.Plan) bool {
	for _, g := range plan.Of(grant.KindSearch) {
		if g.(grant.Search).On {
			return true
		}
	}
	return false
}
