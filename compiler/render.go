package compiler

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/grant"
)

// render turns the plan into bundle files. Each artifact reads only the
// grant list (plus the manifest's identifying header), so whatever the plan
// says is exactly what the bundle does.
func render(c *compilation, plan *grant.Plan) (bundle.Files, *bundle.Manifest, error) {
	spec, err := RenderOCI(plan)
	if err != nil {
		return nil, nil, err
	}
	files := bundle.Files{}
	if files[bundle.ConfigFile], err = bundle.Marshal(spec); err != nil {
		return nil, nil, err
	}
	if files[bundle.EgressFile], err = bundle.Marshal(RenderEgress(plan, c.reg.Network.DNS)); err != nil {
		return nil, nil, err
	}
	files[bundle.HostsFile] = renderHosts(plan)
	files[bundle.ResolvFile] = renderResolv(plan)
	if mcp, ok, err := renderMCPConfig(plan); err != nil {
		return nil, nil, err
	} else if ok {
		files[bundle.MCPConfigFile] = mcp
	}
	m, err := c.manifest(plan, files)
	if err != nil {
		return nil, nil, err
	}
	if files[bundle.ManifestFile], err = bundle.Marshal(m); err != nil {
		return nil, nil, err
	}
	// pins.json names the manifest it belongs to, so it comes last.
	pins, err := c.renderPins(plan, files[bundle.ManifestFile])
	if err != nil {
		return nil, nil, err
	}
	if files[bundle.PinsFile], err = bundle.Marshal(pins); err != nil {
		return nil, nil, err
	}
	return files, m, nil
}

// RenderOCI renders config.json from the plan.
func RenderOCI(plan *grant.Plan) (*specs.Spec, error) {
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
		if err := applyOCI(s, g); err != nil {
			return nil, fmt.Errorf("grant %s: %w", g.Key(), err)
		}
	}
	return s, nil
}

// applyOCI is the one place a grant becomes spec fields; kinds the OCI spec
// does not carry (egress, route, launcher limits) are skipped here and
// rendered elsewhere.
func applyOCI(s *specs.Spec, g grant.Grant) error {
	switch g.Kind {
	case grant.Rootfs:
		s.Root = &specs.Root{Path: g.Source, Readonly: g.Access == grant.RO}
	case grant.Process:
		switch g.Subject {
		case "argv":
			s.Process.Args = append(s.Process.Args, g.Args...)
		case "cwd":
			s.Process.Cwd = g.Value
		case "noNewPrivileges":
			s.Process.NoNewPrivileges = g.Value == "true"
		case "terminal":
			s.Process.Terminal = g.Value == "true"
		case "capabilities":
			if g.Value != "none" {
				return fmt.Errorf("capabilities can only be none")
			}
		default:
			return fmt.Errorf("unknown process subject")
		}
	case grant.Identity:
		n, err := strconv.ParseUint(g.Value, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("identity must be a non-zero id")
		}
		if g.Subject == "uid" {
			s.Process.User.UID = uint32(n)
		} else {
			s.Process.User.GID = uint32(n)
		}
	case grant.Env:
		s.Process.Env = append(s.Process.Env, g.Subject+"="+g.Value)
	case grant.Mount:
		s.Mounts = append(s.Mounts, specs.Mount{Destination: g.Subject, Type: g.Type, Source: g.Source, Options: g.Options})
	case grant.Rlimit:
		n, err := strconv.ParseUint(g.Value, 10, 64)
		if err != nil {
			return err
		}
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: g.Subject, Hard: n, Soft: n})
	case grant.Cgroup:
		return applyCgroup(s.Linux.Resources, g)
	case grant.Namespace:
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.LinuxNamespaceType(g.Subject)})
	case grant.Hostname:
		s.Hostname = g.Value
	}
	return nil
}

func applyCgroup(r *specs.LinuxResources, g grant.Grant) error {
	switch g.Subject {
	case "memory":
		n, err := strconv.ParseInt(g.Value, 10, 64)
		if err != nil {
			return err
		}
		r.Memory = &specs.LinuxMemory{Limit: &n, Swap: &n}
	case "pids":
		n, err := strconv.ParseInt(g.Value, 10, 64)
		if err != nil {
			return err
		}
		r.Pids = &specs.LinuxPids{Limit: &n}
	case "cpu":
		cpus, err := strconv.ParseFloat(g.Value, 64)
		if err != nil {
			return err
		}
		period := uint64(cpuPeriodUsec)
		quota := int64(cpus * cpuPeriodUsec)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	default:
		return fmt.Errorf("unknown cgroup subject")
	}
	return nil
}

// RenderEgress renders egress.json from the plan: deny by default, one
// rule per egress grant, one route per route grant.
func RenderEgress(plan *grant.Plan, dns string) *bundle.Egress {
	e := &bundle.Egress{APIVersion: bundle.APIVersion, Kind: "Egress", Default: "deny", DNS: dns,
		Rules: []bundle.EgressRule{}, Routes: []bundle.Route{}}
	for _, g := range plan.Grants {
		switch g.Kind {
		case grant.Runtime:
			if g.Subject == "network" {
				e.Mode = g.Value
			}
		case grant.Egress:
			e.Rules = append(e.Rules, bundle.EgressRule{Proto: g.Proto, Host: g.Subject, Port: g.Port, Purpose: g.Value, Fact: g.Fact})
		case grant.Route:
			method, path, _ := strings.Cut(g.Value, " ")
			r := bundle.Route{Purpose: g.Subject, Listen: gatewayHost, Port: g.Port, Method: method, Path: path, Upstream: g.Source, Fact: g.Fact}
			for _, o := range g.Options {
				k, v, _ := strings.Cut(o, "=")
				switch k {
				case "callerAgentId":
					r.CallerAgentID = v
				case "tokenRef":
					r.TokenRef = v
				case "method":
					r.Methods = append(r.Methods, v)
				case "tool":
					r.Tools = append(r.Tools, v)
				}
			}
			// Empty, not null: the proxy forwards nothing outside these.
			r.Methods, r.Tools = orEmpty(r.Methods), orEmpty(r.Tools)
			e.Routes = append(e.Routes, r)
		}
	}
	return e
}

// renderHosts writes the base /etc/hosts. Names egress may reach are listed
// as comments; the launcher resolves them on the trusted side and appends
// the pinned addresses in its private copy.
func renderHosts(plan *grant.Plan) []byte {
	var b strings.Builder
	b.WriteString("# generated by paseo-policy; the launcher appends pinned egress addresses\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("127.0.1.1\t" + hostname + "\n")
	var names []string
	for _, g := range plan.Of(grant.Egress) {
		if parseIP(g.Subject) == nil {
			names = append(names, g.Subject)
		}
	}
	sort.Strings(names)
	for i, n := range names {
		if i > 0 && names[i-1] == n {
			continue
		}
		b.WriteString("# pin: " + n + "\n")
	}
	if len(plan.Of(grant.Route)) > 0 {
		b.WriteString("# gateway: " + gatewayName + "\n")
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
	for _, g := range plan.Of(grant.Mount) {
		mounted = mounted || g.Source == bundle.MCPConfigFile
	}
	var route *grant.Grant
	for _, g := range plan.Of(grant.Route) {
		if g.Subject == "mcp" {
			route = &g
		}
	}
	if !mounted || route == nil {
		return nil, false, nil
	}
	_, path, _ := strings.Cut(route.Value, " ")
	var agent string
	for _, o := range route.Options {
		if v, ok := strings.CutPrefix(o, "callerAgentId="); ok {
			agent = v
		}
	}
	u := url.URL{Scheme: "http", Host: net.JoinHostPort(gatewayName, strconv.Itoa(route.Port)), Path: path,
		RawQuery: url.Values{"callerAgentId": {agent}}.Encode()}
	doc := bundle.MCPConfig{Servers: map[string]bundle.MCPServer{bundle.MCPServerName: {URL: u.String(), Auth: false, OAuth: false}}}
	out, err := bundle.Marshal(doc)
	return out, true, err
}

func renderResolv(plan *grant.Plan) []byte {
	var b strings.Builder
	b.WriteString("# generated by paseo-policy\n")
	servers := map[string]bool{}
	for _, g := range plan.Of(grant.Egress) {
		if g.Value == "dns" && !servers[g.Subject] {
			servers[g.Subject] = true
			b.WriteString("nameserver " + g.Subject + "\n")
		}
	}
	if len(servers) == 0 {
		b.WriteString("# no resolver: egress names are pinned in /etc/hosts\noptions ndots:0 attempts:1 timeout:1\n")
	}
	return []byte(b.String())
}

// renderPins writes one pin per bind mount with a host source, from the
// plan's mount grants (so a bind cannot go unpinned) and the identity its
// source resolved to. A bind whose source was never resolved is a compiler
// bug and fails the compile rather than a launch.
func (c *compilation) renderPins(plan *grant.Plan, manifest []byte) (*bundle.Pins, error) {
	out := &bundle.Pins{APIVersion: bundle.APIVersion, Kind: bundle.PinsKind, Manifest: bundle.Digest(manifest), Pins: []bundle.Pin{}}
	for _, g := range plan.Of(grant.Mount) {
		if g.Type != "bind" || slices.Contains(bundle.InternalSources, g.Source) {
			continue
		}
		s, ok := c.src.resolved[g.Source]
		if !ok {
			return nil, fmt.Errorf("bind %s: source %s was never resolved beneath a root, so it cannot be pinned", g.Subject, g.Source)
		}
		out.Pins = append(out.Pins, bundle.Pin{Destination: g.Subject, Source: s.host, Root: s.root, Dev: s.id.Dev, Ino: s.id.Ino, Kind: string(s.id.Kind)})
	}
	sort.Slice(out.Pins, func(i, j int) bool { return out.Pins[i].Destination < out.Pins[j].Destination })
	return out, nil
}

// manifest ties the bundle to its inputs. Input digests are over canonical
// JSON of the decoded values, so CUE and JSON spellings of the same facts
// give the same manifest.
func (c *compilation) manifest(plan *grant.Plan, files bundle.Files) (*bundle.Manifest, error) {
	factsJSON, err := json.Marshal(c.facts)
	if err != nil {
		return nil, err
	}
	entry := struct {
		ID         string `json:"id"`
		Deployment any    `json:"deployment"`
		Image      any    `json:"image"`
		Network    any    `json:"network"`
		Limits     any    `json:"limits"`
		Supervisor any    `json:"supervisor"`
	}{c.facts.Deployment.ID, c.dep, c.reg.Image, c.reg.Network, c.reg.Limits, c.reg.Supervisor}
	entryJSON, err := json.Marshal(entry)
	if err != nil {
		return nil, err
	}
	profJSON, err := json.Marshal(c.prof)
	if err != nil {
		return nil, err
	}
	m := &bundle.Manifest{
		APIVersion: bundle.APIVersion, Kind: "Manifest", Compiler: "paseo-policy/" + Version,
		Profile: c.prof.Name, Deployment: c.facts.Deployment.ID, Topology: c.dep.Topology, Agent: c.facts.Agent.ID,
		Image: bundle.ImageRef{Version: c.reg.Image.Version, Digest: c.reg.Image.Digest, Rootfs: c.reg.Image.Rootfs},
		Inputs: map[string]string{
			"facts":         bundle.Digest(factsJSON),
			"registryEntry": bundle.Digest(entryJSON),
			"profile":       bundle.Digest(profJSON),
		},
		Outputs: map[string]string{},
		Grants:  plan.Grants,
	}
	for _, n := range files.Names() {
		if n != bundle.PinsFile {
			m.Outputs[n] = bundle.Digest(files[n])
		}
	}
	return m, nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
