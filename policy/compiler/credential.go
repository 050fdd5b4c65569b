package compiler

import (
	"encoding/json"
	"regexp"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/grant"
)

// credentialEnvName is what a provider credential variable may be called:
// it must look like a key or token and may not shadow loader, runtime or
// sandbox variables.
var credentialEnvName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*_(KEY|TOKEN)$`)

var reservedEnvPrefixes = []string{"LD_", "NODE_", "PI_", "PASEO_", "BASH_", "GIT_", "NPM_"}

// checkCredential refuses fields that do not belong to the credential mode.
func (c *compilation) checkCredential() {
	cr := c.facts.Credential
	bad := func(field, why string) { c.diags.Addf(diag.CredentialShape, "credential."+field, "%s", why) }
	switch cr.Mode {
	case "api-key":
		if cr.Env == "" {
			bad("env", "api-key mode needs the variable name Pi reads")
		}
		if cr.SecretRef == "" {
			bad("secretRef", "api-key mode needs a reference to the secret the launcher injects")
		}
		if cr.AuthFile != "" {
			bad("authFile", "api-key mode gets no auth.json")
		}
		if len(cr.RefreshURLs) > 0 {
			bad("refreshURLs", "api-key mode refreshes nothing")
		}
	case "oauth-file":
		if cr.AuthFile == "" {
			bad("authFile", "oauth-file mode needs the auth.json Pi refreshes")
		} else if cr.AuthFile != c.facts.State.AgentDir+"/auth.json" {
			bad("authFile", "Pi reads <agentDir>/auth.json; authFile must be exactly that path")
		}
		if cr.Env != "" || cr.SecretRef != "" {
			bad("env", "oauth-file mode takes its credential from auth.json, not the environment")
		}
	case "oauth-broker":
		if cr.AuthFile == "" {
			bad("authFile", "oauth-broker mode needs the deployment's auth.json whose login the model route brokers")
		} else if cr.AuthFile != c.facts.State.AgentDir+"/auth.json" {
			bad("authFile", "Pi reads <agentDir>/auth.json; authFile must be exactly that path")
		}
		if cr.Env != "" || cr.SecretRef != "" {
			bad("env", "oauth-broker mode takes its credential from auth.json, outside the sandbox, not the environment")
		}
		if len(cr.RefreshURLs) != 1 {
			bad("refreshURLs", "oauth-broker mode names exactly one URL: the provider's token endpoint, which the model route calls from the host")
		}
	case "none":
		if cr.Env != "" || cr.SecretRef != "" || cr.AuthFile != "" || len(cr.RefreshURLs) > 0 {
			bad("mode", "mode none takes no credential fields")
		}
	}
	if cr.Env != "" {
		ok := credentialEnvName.MatchString(cr.Env)
		for _, p := range reservedEnvPrefixes {
			ok = ok && !strings.HasPrefix(cr.Env, p)
		}
		if !ok {
			c.diags.Addf(diag.EnvInvalid, "credential.env", "must end in _KEY or _TOKEN and not start with %s", strings.Join(reservedEnvPrefixes, ", "))
		}
	}
}

// credentialMount grants auth.json read-write in oauth-file mode. In every
// other mode an existing <agentDir>/auth.json would be visible through the
// agent dir mount, so it is refused rather than silently exposed.
func (c *compilation) credentialMount() []grant.Mount {
	f := c.facts
	roots := c.dep.Roots.State
	if f.Credential.Mode == "oauth-file" {
		if f.Credential.AuthFile != f.State.AgentDir+"/auth.json" {
			return nil
		}
		s, ok := c.src.resolve("credential.authFile", f.Credential.AuthFile, "state", roots, pathsafe.File)
		if !ok {
			return nil
		}
		// The one persistent file the sandbox writes in the agent dir: it
		// must be this agent's, and hold nothing Pi would run (state.go).
		if !c.ownedByAgent("state.agentDir", f.State.AgentDir, "a read-write auth.json in oauth-file mode") {
			return nil
		}
		c.checkOAuthStore(s)
		m := bind(s.dest, s.host, grant.RW, "OAuth credential; read-write because Pi rewrites refreshed tokens", "credential.authFile")
		m.AuthFile = true // the launcher locks it for the sandbox's life
		return []grant.Mount{m}
	}
	if f.Credential.Mode == "oauth-broker" {
		// The login stays on the host: the model route reads it
		// (modelroute.go); the projection never binds auth.json.
		return nil
	}
	if code, _ := pathform.Check(f.State.AgentDir); code == "" {
		authFile := f.State.AgentDir + "/auth.json"
		if c.src.exists(authFile, "state", roots) && !c.emptyCredentialStore(authFile, roots) {
			c.diags.Addf(diag.CredentialExposed, "state.agentDir", "auth.json in the agent dir holds credentials that would be readable in credential mode %s; remove it or use oauth-file", f.Credential.Mode)
		}
	}
	return nil
}

// emptyCredentialStore reports whether auth.json is Pi's own empty store:
// Pi creates `{}` in its agent dir on every start, so refusing on mere
// existence would refuse every launch after the first. Anything else
// (credentials, unreadable, not JSON, not an object) counts as credentials.
func (c *compilation) emptyCredentialStore(authFile string, roots []string) bool {
	host, ok := c.src.hostPathQuiet(authFile)
	if !ok || rootOf(roots, host) == "" {
		return false
	}
	data, err := c.res.ReadSmall(rootOf(roots, host), host, 4096)
	if err != nil {
		return false
	}
	var m map[string]json.RawMessage
	return json.Unmarshal(data, &m) == nil && m != nil && len(m) == 0
}
