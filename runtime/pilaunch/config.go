package pilaunch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
)

// DefaultConfigPath is where the operator puts the configuration.
const DefaultConfigPath = "/etc/paseo-sandbox/pi.json"

// maxConfigBytes bounds the configuration (a few hundred bytes in practice).
const maxConfigBytes = 64 << 10

// Config is the operator's configuration of the Pi command: everything the
// facts hold that Paseo does not pass in argv. The daemon user cannot change
// it (LoadConfig checks owner and modes), and nothing in the daemon's
// environment is read instead of or beside it.
type Config struct {
	// Socket is the supervisor's socket (docs/supervisor.md).
	Socket string `json:"socket"`
	// Deployment is the registry's deployment this daemon speaks for.
	Deployment string `json:"deployment"`
	// WorkspaceID is the facts' workspace.id (Paseo does not pass one).
	WorkspaceID string `json:"workspaceId"`
	// Models maps a Pi provider (the part of --model before the slash) to
	// its endpoint and credential. A provider not listed is refused.
	Models map[string]ModelRoute `json:"models"`
	// DefaultModel (provider/id) is used when Paseo passes no --model
	// (probes, a session with no model chosen).
	DefaultModel string `json:"defaultModel"`
	// MCP is Paseo's MCP listener as the daemon sees it (agentsURL) and the
	// facts' tokenRef; the bearer itself comes from Paseo's generated MCP
	// config, per daemon run, and goes to the supervisor only.
	MCP *MCPRoute `json:"mcp,omitempty"`
	// State names the dirs.
	State StateDirs `json:"state"`
	// Extension is the integration extension the facts name when Paseo
	// passes none (its current head passes none): a file under the
	// registry's launch roots.
	Extension string `json:"extension"`
	// ProbeCwd is the directory probes run in (Paseo probes from the
	// daemon user's home, which is never a workspace).
	ProbeCwd string `json:"probeCwd"`
	// GitImport is when the command imports the agent's Git work from
	// its store (state.gitStoresDir) onto the worktree's branch:
	// "turn-end" (the default: after each agent_end and when the sandbox
	// ends) or "off". Only this file decides it; nothing Paseo passes or
	// the agent writes does.
	GitImport string `json:"gitImport,omitempty"`
}

// Values of Config.GitImport.
const (
	GitImportTurnEnd = "turn-end"
	GitImportOff     = "off"
)

// ModelRoute is one provider's endpoint and credential mapping.
type ModelRoute struct {
	BaseURL string `json:"baseURL"`
	API     string `json:"api,omitempty"`
	// Credential: mode, the env Pi reads and the secretRef the supervisor
	// resolves; never a value.
	Mode      string `json:"mode"`
	Env       string `json:"env,omitempty"`
	SecretRef string `json:"secretRef,omitempty"`
}

// MCPRoute is Paseo's MCP endpoint.
type MCPRoute struct {
	AgentsURL string `json:"agentsURL"`
	TokenRef  string `json:"tokenRef"`
}

// StateDirs are the dirs the facts and the command use.
type StateDirs struct {
	// AgentDir is Pi's agent dir (models.json, settings.json).
	AgentDir string `json:"agentDir"`
	// SessionsDir holds one session dir per agent: <SessionsDir>/<agent id>.
	SessionsDir string `json:"sessionsDir"`
	// BridgeDir holds the command's session records (sandbox, cursor),
	// owned by the daemon user, mode 0700.
	BridgeDir string `json:"bridgeDir"`
	// GitStoresDir, optional, holds one Git store per agent,
	// <GitStoresDir>/<agent id> (state.gitStore), made 0700 by the command:
	// with it, Git in the sandbox writes (into the store; `paseo-policy
	// git import` brings the work back); without it, Git is read-only.
	GitStoresDir string `json:"gitStoresDir,omitempty"`
}

var (
	providerRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	idRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	modelIDRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$`)
)

// LoadConfig opens path without following any symlink, checks that the
// daemon user cannot have written it (root-owned, not group or world
// writable, and so is every directory above it), reads it from that
// descriptor and decodes it strictly.
func LoadConfig(path string) (*Config, error) {
	data, err := readTrusted(path)
	if err != nil {
		return nil, err
	}
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, diag.List{{Code: CodeConfig, Path: "config", Message: "not the configuration's JSON: " + err.Error()}}
	}
	if dec.More() {
		return nil, diag.List{{Code: CodeConfig, Path: "config", Message: "more than one JSON value"}}
	}
	if l := c.check(); len(l) > 0 {
		return nil, l
	}
	return &c, nil
}

// readTrusted walks path from / one component at a time with O_NOFOLLOW,
// checking each directory (root-owned, not group/world writable) and the
// file (regular, root-owned, not group/world writable, bounded), and reads
// the file from the descriptor it checked.
func readTrusted(path string) ([]byte, error) {
	bad := func(format string, a ...any) error {
		return diag.List{{Code: CodeConfig, Path: "config", Message: fmt.Sprintf(format, a...)}}
	}
	if code, msg := pathform.Check(path); code != "" {
		return nil, bad("%s: %s", path, msg)
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, bad("open /: %v", err)
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, part := range parts {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, bad("stat: %v", err)
		}
		// A sticky directory (/tmp) lets no one else rename or remove the
		// root-owned entry below it, whose owner the next step checks.
		if st.Uid != 0 || (st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0) {
			unix.Close(fd)
			return nil, bad("directory above %s is not root's alone (owner %d, mode %o): the daemon user could replace the configuration", path, st.Uid, st.Mode&0o7777)
		}
		flags := unix.O_PATH | unix.O_DIRECTORY
		if i == len(parts)-1 {
			flags = unix.O_RDONLY | unix.O_NONBLOCK
		}
		next, err := unix.Openat(fd, part, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			if err == unix.ELOOP || err == unix.ENOTDIR {
				return nil, bad("%s: a component is a symlink or not a directory; the configuration is opened without following links", path)
			}
			return nil, bad("%s: %v", path, err)
		}
		fd = next
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, bad("stat: %v", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, bad("%s is not a regular file", path)
	case st.Uid != 0 || st.Mode&0o022 != 0:
		return nil, bad("%s must be owned by root and writable by no one else (owner %d, mode %o)", path, st.Uid, st.Mode&0o7777)
	case st.Size > maxConfigBytes:
		return nil, bad("%s is larger than %d bytes", path, maxConfigBytes)
	}
	buf := make([]byte, maxConfigBytes+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err != nil {
			return nil, bad("read %s: %v", path, err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n > maxConfigBytes {
		return nil, bad("%s is larger than %d bytes", path, maxConfigBytes)
	}
	return buf[:n], nil
}

// check reports every missing or malformed value at once.
func (c *Config) check() diag.List {
	var l diag.List
	path := func(field, p string) {
		if p == "" {
			l.Addf(CodeConfig, "config."+field, "required")
		} else if code, msg := pathform.Check(p); code != "" {
			l.Addf(CodeConfig, "config."+field, "%s", msg)
		}
	}
	path("socket", c.Socket)
	path("state.agentDir", c.State.AgentDir)
	path("state.sessionsDir", c.State.SessionsDir)
	path("state.bridgeDir", c.State.BridgeDir)
	if c.State.GitStoresDir != "" {
		path("state.gitStoresDir", c.State.GitStoresDir)
	}
	if c.GitImport != "" && c.GitImport != GitImportTurnEnd && c.GitImport != GitImportOff {
		l.Addf(CodeConfig, "config.gitImport", "%q: turn-end (the default) or off", c.GitImport)
	}
	path("extension", c.Extension)
	path("probeCwd", c.ProbeCwd)
	if !idRE.MatchString(c.Deployment) {
		l.Addf(CodeConfig, "config.deployment", "required: the registry's deployment id")
	}
	if !idRE.MatchString(c.WorkspaceID) {
		l.Addf(CodeConfig, "config.workspaceId", "required: an opaque id")
	}
	if len(c.Models) == 0 {
		l.Addf(CodeConfig, "config.models", "required: at least one provider")
	}
	for p, m := range c.Models {
		if !providerRE.MatchString(p) {
			l.Addf(CodeConfig, "config.models", "provider %q is not a Pi provider name", p)
		}
		if u, err := url.Parse(m.BaseURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			l.Addf(CodeConfig, "config.models."+p+".baseURL", "required: an http(s) URL")
		}
		if m.Mode == "" {
			l.Addf(CodeConfig, "config.models."+p+".mode", "required: api-key or none")
		}
	}
	if prov, _, ok := splitModel(c.DefaultModel); !ok {
		l.Addf(CodeConfig, "config.defaultModel", "required: provider/id")
	} else if _, ok := c.Models[prov]; !ok {
		l.Addf(CodeConfig, "config.defaultModel", "provider %q is not in config.models", prov)
	}
	if c.MCP != nil {
		if u, err := url.Parse(c.MCP.AgentsURL); err != nil || u.Scheme != "http" || u.Host == "" || u.Path != "/mcp/agents" {
			l.Addf(CodeConfig, "config.mcp.agentsURL", "must be http://<host>:<port>/mcp/agents")
		}
		if c.MCP.TokenRef == "" {
			l.Addf(CodeConfig, "config.mcp.tokenRef", "required")
		}
	}
	return l.Sorted()
}

// splitModel splits provider/id as Pi's --model does for a provider-qualified id.
func splitModel(s string) (provider, id string, ok bool) {
	provider, id, ok = strings.Cut(s, "/")
	if !ok || !providerRE.MatchString(provider) || !modelIDRE.MatchString(id) {
		return "", "", false
	}
	return provider, id, true
}
