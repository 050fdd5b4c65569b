package compiler

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strconv"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/schema"
)

// Fixed sandbox layout. These are part of the contract with the image and
// with Pi (see docs/grants.md).
const (
	sandboxHome = "/home/sandbox"
	sandboxTmp  = "/tmp"
	sandboxLang = "C.UTF-8"
	hostname    = "paseo-sandbox"
	// gatewayName is the host name the sandbox reaches its gateway (the
	// launcher's route proxies) by; the launcher pins it in /etc/hosts
	// because the address is leased only at launch.
	gatewayName   = bundle.GatewayName
	cpuPeriodUsec = 100000
)

// compilation is one compile's context: the three inputs, the resolver,
// and what is decided from the inputs alone before the first phase
// (newCompilation). Every field is set there and only read after. A phase
// that settles something a later phase needs returns it, and plan hands
// it on, so the order the phases run in is written in plan's calls, not
// in which phase happened to set a field first.
type compilation struct {
	facts *schema.Facts
	reg   *schema.Registry
	prof  *schema.Profile
	res   pathsafe.Resolver
	// diags collects every refusal; each phase appends to it.
	diags *diag.List

	// dep is the facts' deployment entry in the registry.
	dep schema.Deployment
	// src resolves bind sources beneath the deployment's roots and
	// remembers what each resolved to, for the pins (plan.go pins).
	src *sources
	// limits are the effective limits: the registry's, capped by the
	// profile's.
	limits schema.Limits
	// hostedTools are the registry's hosted tools for this deployment,
	// checked (checkHostedTools) whatever the launch.
	hostedTools []string
	// fsmon is the workspace monitor's decision (fsmonitor.go); nil when
	// the profile does not ask for it.
	fsmon *fsmonitorPlan
	// search is the native search's decision (search.go); nil when neither
	// the profile nor the deployment asks for it.
	search *searchPlan
}

// newCompilation looks up the facts' deployment and decides what every
// phase reads: the limits, the hosted tools, the workspace monitor; and
// runs the checks that need no grant (the credential's shape, a brokered
// login's needs). Nothing is returned when the deployment is unknown.
func newCompilation(facts *schema.Facts, reg *schema.Registry, prof *schema.Profile, res pathsafe.Resolver, diags *diag.List) *compilation {
	dep, ok := reg.Deployments[facts.Deployment.ID]
	if !ok {
		diags.Addf(diag.DeploymentUnknown, "deployment.id", "deployment %q is not in the registry", facts.Deployment.ID)
		return nil
	}
	c := &compilation{facts: facts, reg: reg, prof: prof, res: res, diags: diags, dep: dep,
		src: &sources{diags: diags, depID: facts.Deployment.ID, dep: dep, forbid: forbiddenFor(dep, reg.Supervisor), res: res}}
	c.limits = c.effectiveLimits()
	c.hostedTools = c.checkHostedTools()
	c.checkCredential()
	c.checkLoginBroker()
	c.fsmon = c.decideFSMonitor()
	c.search = c.decideSearch()
	return c
}

// plan runs the phases in order. What one settles for a later one is its
// return value: the image's EROFS dirs (rootfs) bound where binds may go
// (mounts); the binds (mounts) settle the private Git dir's environment
// (env) and the model route's API and generated models.json (network, and
// the plan's Models).
func (c *compilation) plan() *bundle.Plan {
	p := &bundle.Plan{DNS: c.reg.Network.DNS}
	g := &p.Plan
	erofsDirs := c.rootfs(g)
	c.process(g)
	c.namespaces(g)
	settled := c.mounts(g, erofsDirs)
	c.env(g, settled.gitEnv)
	c.resources(g)
	c.network(g, settled.model.api)
	if len(*c.diags) > 0 {
		return p
	}
	var err error
	if p.Header, err = c.header(); err != nil {
		c.diags.Addf(diag.Internal, "", "manifest header: %v", err)
	}
	p.Models = settled.model.doc
	if p.Pins, err = c.pins(g); err != nil {
		c.diags.Addf(diag.Internal, "", "pins: %v", err)
	}
	if err := p.Grants.Validate(); err != nil {
		c.diags.Addf(diag.Internal, "", "%v", err)
	}
	return p
}

// rootfs grants the image and returns the directories its EROFS files
// cover, where no bind may go.
func (c *compilation) rootfs(p *grant.Plan) (erofsDirs []string) {
	img := c.reg.Image // checked with the whole registry (checkRootfs)
	p.Add(grant.Rootfs{Path: img.Rootfs, ReadOnly: true, Version: img.Version, Digest: img.Digest,
		Provenance: why("pinned image with Pi, Node, bash, git, rg and fd; read-only so the agent cannot change its own tools", "registry.image")})
	return c.erofs(p)
}

// erofs mounts the image's EROFS files over their directories. The Sentry
// reads an EROFS file itself, so Node's thousands of opens and stats under
// /usr and /opt no longer cross to the gofer. They are submounts, not
// gVisor's EROFS root (dev.gvisor.spec.rootfs.*): with root.readonly the
// pinned runsc puts no overlay over the root, and an EROFS root cannot make
// the mount points of binds the image does not have (the workspace, the
// state dirs); the gofer-backed root still can, in the launcher's private
// overlay. Nothing may be bound inside these directories for the same reason.
func (c *compilation) erofs(p *grant.Plan) []string {
	var dirs []string
	for i, e := range c.reg.Image.Erofs {
		fact := fmt.Sprintf("registry.image.erofs[%d]", i)
		bad := false
		for _, q := range []string{e.Dir, e.File} {
			if code, msg := pathform.Check(q); code != "" {
				c.diags.Addf(diag.Registry, fact, "%s", msg)
				bad = true
			}
		}
		if bad {
			continue
		}
		for _, r := range append([]string{sandboxTmp}, reservedDest...) {
			if e.Dir == "/" || pathform.Beneath(r, e.Dir) || pathform.Beneath(e.Dir, r) {
				c.diags.Addf(diag.Registry, fact+".dir", "an EROFS image may not cover / or the sandbox's own %s", r)
				bad = true
				break
			}
		}
		for _, d := range dirs {
			if pathform.Beneath(d, e.Dir) || pathform.Beneath(e.Dir, d) {
				c.diags.Addf(diag.Registry, fact+".dir", "overlaps the EROFS image of %s", d)
				bad = true
			}
		}
		if bad {
			continue
		}
		dirs = append(dirs, e.Dir)
		p.Add(grant.Mount{Destination: e.Dir, Type: "erofs", Source: e.File, Digest: e.Digest, Options: []string{"ro", "nosuid", "nodev"},
			Provenance: why("the image's "+e.Dir+" from its EROFS file, read by the Sentry without gofer round trips; same files as the tree, digest checked at launch", fact)})
	}
	return dirs
}

func (c *compilation) process(p *grant.Plan) {
	f := c.facts
	for i, w := range c.prof.Argv {
		fact := fmt.Sprintf("profile.%s.argv[%d]", c.prof.Name, i)
		if w.Lit != "" {
			p.Add(grant.Argv{Words: []string{w.Lit}, Provenance: why("fixed by profile "+c.prof.Name, fact)})
			continue
		}
		args, fact, reason := c.slot(w.Slot)
		if len(args) > 0 {
			p.Add(grant.Argv{Words: args, Provenance: why(reason, fact)})
		}
	}
	p.Add(grant.Cwd{Dir: f.Workspace.Cwd, Provenance: why("Pi runs in the agent cwd, at the same absolute path the daemon records", "workspace.cwd")})
	uid, gid, uidFact, gidFact := c.sandboxUser()
	who := "the image's unprivileged sandbox"
	if c.dep.User != nil {
		who = "deployment " + f.Deployment.ID + "'s sandbox"
	}
	p.Add(grant.Identity{Field: "uid", ID: uid, Provenance: why(who+" user", uidFact)})
	p.Add(grant.Identity{Field: "gid", ID: gid, Provenance: why(who+" group", gidFact)})
	p.Add(grant.Capabilities{Provenance: why("no Linux capability in any set", "profile."+c.prof.Name+".capabilities")})
	p.Add(grant.NoNewPrivileges{On: true, Provenance: why("setuid binaries and file capabilities cannot raise privilege", "profile."+c.prof.Name)})
	p.Add(grant.Terminal{On: false, Provenance: why("Pi RPC speaks JSONL over pipes the launcher owns", "profile."+c.prof.Name)})
}

// slot expands one argv slot from facts.
func (c *compilation) slot(name string) (args []string, fact, reason string) {
	f := c.facts
	switch name {
	case "model":
		return []string{"--model", f.Model.Provider + "/" + f.Model.ID}, "model.provider,model.id", "the model the daemon selected"
	case "thinking":
		if f.Model.Thinking == "" {
			return nil, "", ""
		}
		return []string{"--thinking", f.Model.Thinking}, "model.thinking", "the thinking level the daemon selected"
	case "session":
		switch f.Launch.Session {
		case "":
			return nil, "", ""
		case "none":
			return []string{"--no-session"}, "launch.session", "the daemon asked for no session log"
		default:
			return []string{"--session", f.Launch.Session}, "launch.session", "resume the session log the daemon recorded"
		}
	case "append-system-prompt":
		if f.Launch.AppendSystemPrompt == "" {
			return nil, "", ""
		}
		return []string{"--append-system-prompt", f.Launch.AppendSystemPrompt}, "launch.appendSystemPrompt", "the system prompt text the daemon appends"
	case "no-session":
		return []string{"--no-session"}, "profile." + c.prof.Name, "probes write no session log"
	case "mcp-config":
		if f.Launch.MCPConfig == "" || !c.mcpRouted() {
			// Without a private route the sandbox cannot reach the daemon, so
			// it gets neither the config nor the bearer token inside it.
			return nil, "", ""
		}
		return []string{"--mcp-config", f.Launch.MCPConfig}, "launch.mcpConfig", "the generated MCP config (files/mcp.json) at the path Paseo passes"
	case "extension":
		return []string{"--extension", f.Launch.Extension}, "launch.extension", "Paseo's generated integration extension"
	}
	c.diags.Addf(diag.ProfileInvalid, "profile."+c.prof.Name+".argv", "unknown slot %q", name)
	return nil, "", ""
}

func (c *compilation) namespaces(p *grant.Plan) {
	for _, ns := range []string{"pid", "ipc", "uts", "mount", "network"} {
		p.Add(grant.Namespace{Type: ns, Provenance: why("private "+ns+" namespace", "profile."+c.prof.Name)})
	}
	p.Add(grant.Hostname{Name: hostname, Provenance: why("a fixed name that reveals nothing about the host", "profile."+c.prof.Name)})
}

// mounts adds kernel filesystems, private tmpfs, generated /etc files and
// every bind the facts call for, none inside erofsDirs. Binds are sorted by
// destination so a parent is always mounted before what nests in it. It
// returns what the binds settled for the later phases.
func (c *compilation) mounts(p *grant.Plan, erofsDirs []string) bound {
	for i, m := range c.prof.Mounts {
		p.Add(grant.Mount{Destination: m.Destination, Type: m.Type, Source: m.Type, Options: m.Options,
			Provenance: why(m.Reason, fmt.Sprintf("profile.%s.mounts[%d]", c.prof.Name, i))})
	}
	size := "size=" + strconv.FormatInt(c.limits.TmpfsBytes, 10)
	uid, gid := c.ownerOptions()
	p.Add(grant.Mount{Destination: sandboxTmp, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", size},
		Provenance: why("private temp, destroyed with the sandbox; never the daemon's /tmp", "registry.limits.tmpfsBytes")})
	p.Add(grant.Mount{Destination: sandboxHome, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0700", uid, gid, size},
		Provenance: why("an empty HOME; the daemon user's home is never mounted", "registry.limits.tmpfsBytes")})
	p.Add(grant.Mount{Destination: "/etc/hosts", Type: "bind", Source: "files/hosts", Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		Provenance: why("generated; the launcher pins egress host names here", "registry.network.dns")})
	p.Add(grant.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: "files/resolv.conf", Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		Provenance: why("generated; names a resolver only when the DNS mode allows one", "registry.network.dns")})
	c.fsmonitorMount(p)
	c.searchMounts(p)

	bd := c.binds()
	binds := bd.mounts
	sort.SliceStable(binds, func(i, j int) bool { return binds[i].Destination < binds[j].Destination })
	seen := map[string]string{}
	for _, b := range binds {
		if prev, dup := seen[b.Destination]; dup {
			c.diags.Addf(diag.PathLayout, b.Fact, "mounts at the same path as %s", prev)
			continue
		}
		seen[b.Destination] = b.Fact
		p.Add(b)
	}
	for _, b := range binds {
		c.checkDestination(b, erofsDirs)
	}
	// Last: a shell settings.json names must lie outside every mount.
	c.checkSettings(p, bd.settings)
	return bd.bound
}

// reservedDest are sandbox paths a fact-driven bind may not cover or sit in.
var reservedDest = []string{"/proc", "/sys", "/dev", "/etc", sandboxHome}

func (c *compilation) checkDestination(b grant.Mount, erofsDirs []string) {
	for _, r := range reservedDest {
		if pathform.Beneath(r, b.Destination) || pathform.Beneath(b.Destination, r) {
			c.diags.Addf(diag.PathLayout, b.Fact, "would mount over or inside the sandbox's own %s", r)
			return
		}
	}
	if b.Destination == sandboxTmp || b.Destination == "/" {
		c.diags.Addf(diag.PathLayout, b.Fact, "would replace the sandbox's %s", b.Destination)
	}
	for _, d := range erofsDirs {
		if pathform.Beneath(d, b.Destination) || pathform.Beneath(b.Destination, d) {
			c.diags.Addf(diag.PathLayout, b.Fact, "would mount over or inside the image's read-only EROFS %s, which cannot hold mount points", d)
			return
		}
	}
}

func bindOpts(a grant.Access) []string {
	return []string{"bind", string(a), "nosuid", "nodev"}
}

// bind is a bind mount of a resolved source with the usual options.
func bind(dest, host string, a grant.Access, reason, fact string) grant.Mount {
	return grant.Mount{Destination: dest, Type: "bind", Source: host, Options: bindOpts(a), Provenance: why(reason, fact)}
}

func why(reason, fact string) grant.Provenance { return grant.Provenance{Reason: reason, Fact: fact} }

// bound is what the binds settle for the phases after mounts.
type bound struct {
	// gitEnv is the start script's environment for the private Git dir
	// (gitprotect.go repoView), added by env.
	gitEnv []grant.Env
	// model is the model route's API and generated models.json (state.go,
	// modelroute.go modelsDoc), granted by network.
	model modelFiles
}

// bindSet is binds' result: the fact-driven bind mounts, the projected
// settings.json that mounts checks once every mount is known, and what
// the later phases need.
type bindSet struct {
	mounts   []grant.Mount
	settings *source
	bound
}

// binds resolves every fact-driven bind mount.
func (c *compilation) binds() bindSet {
	f := c.facts
	roots := c.dep.Roots
	var out []grant.Mount
	add := func(s source, ok bool, a grant.Access, reason string) {
		if !ok {
			return
		}
		out = append(out, bind(s.dest, s.host, a, reason, s.fact))
	}
	cwd, cwdOK := c.src.resolve("workspace.cwd", f.Workspace.Cwd, "workspace", roots.Workspace, pathsafe.Dir)
	add(cwd, cwdOK, grant.RW, "the agent's workspace, read-write at the path the daemon uses")

	// verified is the repository the Git facts name, once they resolved
	// and match what the cwd uses; nil when a Git fact was refused (its
	// control data is not looked for) or the facts name none.
	var verified *gitLayout

	if g := f.Workspace.Git; g != nil {
		// The Git dirs are not bound here: gitBinds (gitprotect.go) shows
		// them as rule 1 and 2 say, once they are verified.
		gitdir, allOK := c.src.resolve("workspace.git.gitdir", g.Gitdir, "workspace", roots.Workspace, pathsafe.Dir)
		var common *source
		if g.Commondir != "" {
			s, ok := c.src.resolve("workspace.git.commondir", g.Commondir, "workspace", roots.Workspace, pathsafe.Dir)
			common, allOK = &s, allOK && ok
		}
		var alts []source
		for i, alt := range g.Alternates {
			fact := fmt.Sprintf("workspace.git.alternates[%d]", i)
			s, ok := c.src.resolve(fact, alt, "workspace", roots.Workspace, pathsafe.Dir)
			add(s, ok, grant.RO, "object alternate; read-only, new objects go to the repository's own store")
			alts, allOK = append(alts, s), allOK && ok
		}
		var dotgit dotGit
		if allOK && cwdOK {
			dotgit, allOK = c.verifyGit(gitdir, common, alts)
		}
		if allOK {
			l := gitLayout{gitdir: gitdir, repo: gitdir, worktree: path.Dir(dotgit.path), dotgit: dotgit, write: g.Write, fact: "workspace.git.gitdir"}
			if common != nil {
				l.repo, l.linked, l.fact = *common, true, "workspace.git.commondir"
			}
			verified = &l
		}
	}

	git := c.gitBinds(out, verified)
	out = append(out, git.mounts...)
	agent := c.agentDirProjection()
	out = append(out, agent.mounts...)
	if c.prof.State.SessionDir != "none" {
		// Pi replays a session log on resume, so whoever can write the
		// session dir writes what a later Pi of this agent reads.
		s, ok := c.src.resolve("state.sessionDir", f.State.SessionDir, "state", roots.State, pathsafe.Dir)
		if ok && c.ownedByAgent("state.sessionDir", f.State.SessionDir, "session logs") && c.apart("state.sessionDir", f.State.SessionDir, "the session dir", out) {
			add(s, ok, grant.Access(c.prof.State.SessionDir), "PI_CODING_AGENT_SESSION_DIR: this agent's own session logs, which the daemon resumes and imports")
		}
	}
	if sess := f.Launch.Session; sess != "" && sess != "none" {
		if c.src.lexical("launch.session", sess) && !pathform.Beneath(f.State.SessionDir, sess) {
			c.diags.Addf(diag.PathLayout, "launch.session", "the session log must lie in state.sessionDir, which is what the sandbox can see")
		}
	}

	s, ok := c.src.resolve("launch.extension", f.Launch.Extension, "launch", roots.Launch, pathsafe.File)
	add(s, ok, grant.RO, "Paseo's generated extension, read-only at its argv path")
	if f.Launch.MCPConfig != "" && c.usesSlot("mcp-config") && c.mcpRouted() && c.src.lexical("launch.mcpConfig", f.Launch.MCPConfig) {
		// The daemon's own file names its loopback, which the sandbox cannot
		// reach, and may list other servers; the sandbox gets a generated one
		// at the same path instead (policy/render/oci renderMCPConfig).
		out = append(out, grant.Mount{Destination: f.Launch.MCPConfig, Type: "bind", Source: bundle.MCPConfigFile,
			Options:    []string{"bind", "ro", "nosuid", "nodev", "noexec"},
			Provenance: why("generated MCP config: only Paseo's server, through the launcher's proxy on the gateway; no bearer (the proxy adds the daemon's)", "launch.mcpConfig")})
		// With PI_MCP_CONFIG_MODE=exclusive (env.go) the adapter reads its
		// config from <agentDir>/mcp.json only, never the --mcp-config path
		// or the workspace's .mcp.json and .pi/mcp.json: the same generated
		// file goes there, read-only in the agent dir's projection.
		if code, _ := pathform.Check(f.State.AgentDir); code == "" {
			out = append(out, grant.Mount{Destination: f.State.AgentDir + "/mcp.json", Type: "bind", Source: bundle.MCPConfigFile,
				Options:    []string{"bind", "ro", "nosuid", "nodev", "noexec"},
				Provenance: why("generated MCP config where the adapter reads it in exclusive mode (PI_MCP_CONFIG_MODE): only Paseo's server, through the launcher's proxy on the gateway; no bearer", "launch.mcpConfig")})
		}
	}
	out = append(out, c.credentialMount()...)
	c.agentDirApart(out)
	c.gitStoreApart(out, git.storeDest)
	return bindSet{mounts: out, settings: agent.settings, bound: bound{gitEnv: git.env, model: agent.model}}
}

// mcpRouted reports whether this launch gets the private MCP route: network
// mode sandbox, a profile that allows mcp, and an MCP endpoint in the facts.
func (c *compilation) mcpRouted() bool {
	return c.facts.MCP != nil && c.reg.Network.Mode == "sandbox" && slices.Contains(c.prof.Egress, "mcp")
}

func (c *compilation) usesSlot(name string) bool {
	for _, w := range c.prof.Argv {
		if w.Slot == name {
			return true
		}
	}
	return false
}

// pins records one pin per bind mount with a host source, from the plan's
// mount grants (so a bind cannot go unpinned) and the identity its source
// resolved to. A bind whose source was never resolved is a compiler bug and
// fails the compile rather than a launch.
func (c *compilation) pins(plan *grant.Plan) ([]bundle.Pin, error) {
	out := []bundle.Pin{}
	for _, g := range plan.Grants {
		m, ok := g.(grant.Mount)
		if !ok || !m.IsBind() || slices.Contains(bundle.InternalSources, m.Source) {
			continue
		}
		s, ok := c.src.resolved[m.Source]
		if !ok {
			return nil, fmt.Errorf("bind %s: source %s was never resolved beneath a root, so it cannot be pinned", m.Destination, m.Source)
		}
		out = append(out, bundle.Pin{Destination: m.Destination, Source: s.host, Root: s.root, Dev: s.id.Dev, Ino: s.id.Ino, Kind: string(s.id.Kind)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Destination < out[j].Destination })
	return out, nil
}

// header ties the bundle to its inputs. Input digests are over canonical
// JSON of the decoded values, so CUE and JSON spellings of the same facts
// give the same manifest.
func (c *compilation) header() (bundle.Manifest, error) {
	factsJSON, err := json.Marshal(c.facts)
	if err != nil {
		return bundle.Manifest{}, err
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
		return bundle.Manifest{}, err
	}
	profJSON, err := json.Marshal(c.prof)
	if err != nil {
		return bundle.Manifest{}, err
	}
	return bundle.Manifest{
		APIVersion: bundle.ManifestAPIVersion, Kind: bundle.ManifestKind, Compiler: "paseo-policy/" + Version,
		Profile: c.prof.Name, Deployment: c.facts.Deployment.ID, Topology: c.dep.Topology, Agent: c.facts.Agent.ID,
		Image: bundle.ImageRef{Version: c.reg.Image.Version, Digest: c.reg.Image.Digest, Rootfs: c.reg.Image.Rootfs},
		Inputs: map[string]string{
			"facts":         bundle.Digest(factsJSON),
			"registryEntry": bundle.Digest(entryJSON),
			"profile":       bundle.Digest(profJSON),
		},
	}, nil
}
