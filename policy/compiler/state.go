package compiler

import (
	"encoding/json"
	"maps"
	"path"
	"slices"
	"strconv"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// Pi's state, and what an agent may leave behind in it (docs/grants.md "Pi's
// state"). Pi loads code from its agent dir at start (extensions/*.ts, the
// packages and extensions settings.json names, api_key values starting with
// "!" in auth.json and models.json, which it runs as shell commands), so a
// sandbox must never write a file a later Pi reads as configuration (and
// the daemon's settings.json may say only what settings.go allows):
//
//   - the agent dir is a projection: a private tmpfs per sandbox, with the
//     profile's agentFiles bound read-only from the host agent dir. Whatever
//     Pi writes there at start (auth.json "{}", the auth.json.lock and
//     settings.json.lock directories proper-lockfile makes beside a file,
//     trust.json, the MCP adapter's caches) dies with the sandbox;
//   - in oauth-file mode auth.json is the one persistent file bound
//     read-write, and only holding OAuth credentials (checked at compile);
//   - every directory the sandbox writes and a later Pi reads (the session
//     dir, the jiti cache, and in oauth-file mode the agent dir holding
//     auth.json) must be named for this agent, so two agents never share one.

// agentDir is what agentDirProjection grants and finds: the mounts, the
// daemon's settings.json (checked once every mount is known: settings.go
// checkSettings) and, with the model route, its API and generated
// models.json.
type agentDir struct {
	mounts   []grant.Mount
	settings *source
	model    modelFiles
}

// agentDirProjection grants the agent dir as a private tmpfs and binds the
// profile's agentFiles into it read-only. The host agent dir itself is
// resolved (it must be a directory beneath a state root) but never mounted.
func (c *compilation) agentDirProjection() agentDir {
	f := c.facts
	var ad agentDir
	agent, ok := c.src.resolve("state.agentDir", f.State.AgentDir, "state", c.dep.Roots.State, pathsafe.Dir)
	if !ok {
		return ad
	}
	if c.prof.State.AgentDir != "projected" {
		c.diags.Addf(diag.ProfileInvalid, "profile."+c.prof.Name+".state.agentDir", "the agent dir is only ever projected")
		return ad
	}
	uid, gid := c.ownerOptions()
	out := []grant.Mount{{Destination: agent.dest, Type: "tmpfs", Source: "tmpfs",
		Options:    []string{"nosuid", "nodev", "noexec", "mode=0700", uid, gid, "size=" + strconv.FormatInt(agentDirBytes, 10)},
		Provenance: why("PI_CODING_AGENT_DIR: a private projection destroyed with the sandbox; Pi's locks and start-up writes land here, and nothing written here reaches another Pi", "state.agentDir")}}
	var daemonModels []byte // nil: the daemon wrote none
	modelsBad := false
	for _, name := range c.prof.State.AgentFiles {
		p := agent.dest + "/" + name
		if !c.src.exists(p, "state", c.dep.Roots.State) {
			continue
		}
		fact := "state.agentDir/" + name
		s, ok := c.src.resolve(fact, p, "state", c.dep.Roots.State, pathsafe.File)
		if !ok {
			continue
		}
		if name == "settings.json" {
			ad.settings = &s
		}
		if name == "models.json" && c.modelRouted() {
			// Read for the selected provider's entry, never bound: the
			// sandbox gets the generated one below.
			data, err := c.res.ReadSmall(rootOf(c.dep.Roots.State, s.host), s.host, modelsBytes)
			if err != nil {
				c.diags.Addf(diag.ModelRoute, modelsFact, "models.json must be a regular file of at most %d bytes", modelsBytes)
				modelsBad = true
				continue
			}
			daemonModels = append([]byte{}, data...)
			continue
		}
		out = append(out, grant.Mount{Destination: s.dest, Type: "bind", Source: s.host, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
			Provenance: why("the daemon's "+name+", read-only: the sandbox cannot change what a later Pi is configured to load", fact)})
	}
	if c.modelRouted() && !modelsBad {
		if ad.model = c.modelsDoc(daemonModels, c.modelPort()); ad.model.doc != nil {
			out = append(out, grant.Mount{Destination: agent.dest + "/models.json", Type: "bind", Source: bundle.ModelsFile,
				Options:    []string{"bind", "ro", "nosuid", "nodev", "noexec"},
				Provenance: why("generated models.json: the selected provider only, at the model route on the gateway with a placeholder key; the provider key stays outside the sandbox", modelsFact)})
		}
	}
	ad.mounts = out
	return ad
}

// agentDirBytes bounds the agent dir projection: Pi writes a few small JSON
// files and lock directories there, and the MCP adapter its metadata cache.
const agentDirBytes = 16 << 20

// ownedByAgent refuses a directory the sandbox writes and a later Pi reads
// unless its last component is the agent id: the compiler sees one launch
// and cannot know which dirs other agents got, but two agents (ids are
// unique in a deployment) can then never be given the same one.
func (c *compilation) ownedByAgent(fact, dir, holds string) bool {
	id := c.facts.Agent.ID
	if code, _ := pathform.Check(dir); code != "" {
		return false // refused where the path is resolved
	}
	if path.Base(dir) != id {
		c.diags.Addf(diag.StateShared, fact, "holds %s, which the sandbox writes and a later Pi reads; it must be this agent's own directory, named for it: <...>/%s", holds, id)
		return false
	}
	return true
}

// apart refuses a writable per-agent dir that is, contains or lies inside
// another bind of this launch (the workspace, which other agents may share,
// or another state dir), where someone else could write into it.
func (c *compilation) apart(fact, dir, holds string, others []grant.Mount) bool {
	overlap := map[string]string{}
	for _, g := range others {
		// A bundle file (the generated models.json) is no host directory
		// anyone could write into.
		if g.Fact != fact && g.IsBind() && !slices.Contains(bundle.InternalSources, g.Source) {
			overlap[g.Destination] = g.Fact
		}
	}
	for _, p := range slices.Sorted(maps.Keys(overlap)) {
		if pathform.Beneath(p, dir) || pathform.Beneath(dir, p) {
			c.diags.Addf(diag.PathLayout, fact, "%s must be a directory of its own, apart from %s", holds, overlap[p])
			return false
		}
	}
	return true
}

// checkOAuthStore refuses an auth.json that holds anything but OAuth
// credentials: it is bound read-write, so the sandbox could have written
// it, and Pi runs an api_key value starting with "!" as a shell command.
// Unreadable, not JSON or over the size bound counts as refused.
func (c *compilation) checkOAuthStore(s source) {
	root := rootOf(c.dep.Roots.State, s.host)
	data, err := c.res.ReadSmall(root, s.host, authStoreBytes)
	var store map[string]struct {
		Type string `json:"type"`
	}
	if err == nil {
		err = json.Unmarshal(data, &store)
	}
	if err != nil {
		c.diags.Addf(diag.CredentialContent, "credential.authFile", "auth.json must be a JSON object of OAuth credentials of at most %d bytes", authStoreBytes)
		return
	}
	// The entry's name is not printed: it is text the sandbox may have written.
	for _, id := range slices.Sorted(maps.Keys(store)) {
		if store[id].Type != "oauth" {
			c.diags.Addf(diag.CredentialContent, "credential.authFile", "auth.json holds an entry that is not an OAuth credential; in oauth-file mode it may hold nothing else (Pi runs an api_key value starting with \"!\" as a command)")
			return
		}
	}
}

// authStoreBytes bounds the auth.json the compiler reads: a few OAuth
// credentials are well under it.
const authStoreBytes = 64 << 10

// agentDirApart refuses a host agent dir that is, contains or lies inside a
// read-write bind (other than its own auth.json): the sandbox could write
// the daemon's settings.json or models.json through that bind.
func (c *compilation) agentDirApart(binds []grant.Mount) {
	dir := c.facts.State.AgentDir
	for _, g := range binds {
		if !g.IsBind() || g.ReadOnly() || g.Fact == "credential.authFile" {
			continue
		}
		if pathform.Beneath(dir, g.Destination) || pathform.Beneath(g.Destination, dir) {
			c.diags.Addf(diag.PathLayout, "state.agentDir", "the agent dir must lie apart from every read-write bind; it overlaps %s", g.Fact)
			return
		}
	}
}
