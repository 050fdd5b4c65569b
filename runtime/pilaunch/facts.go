package pilaunch

import (
	"crypto/rand"
	"encoding/hex"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/schema"
)

// Launch is one spawn's plan: the facts for the supervisor, and what the
// command itself keeps (the agent id its records are under, the MCP bearer
// for the supervisor only).
type Launch struct {
	Facts   schema.Facts
	AgentID string
	Probe   bool
	// MCPToken is the bearer from Paseo's MCP config (or ""): handed to the
	// supervisor on create and every attach, never into the facts.
	MCPToken string
	// NewSession: Paseo passed no --session, so the agent's session dir is
	// made before the sandbox starts.
	NewSession bool
	// Git, when the launch names a Git store and the configuration does
	// not turn the import off: where the command imports from and to at
	// each turn end (gitturn.go).
	Git *GitPlan
}

// GitPlan names what the turn-end import reads and writes, all from the
// configuration and the Git facts the compiler verifies.
type GitPlan struct {
	// GitDir is the worktree's gitdir, whose HEAD names the branch; Repo
	// is the shared repository (the common dir, or the gitdir itself).
	GitDir, Repo string
	// StateRoot is config.state.gitStoresDir; Store is the agent's store
	// beneath it (state.gitStore).
	StateRoot, Store string
}

// Plan builds the facts from the operator's configuration, Paseo's argv
// and the cwd it spawned the command in, and nothing else: no variable of
// the daemon's environment is read. Every refusal is reported at once.
func Plan(cfg *Config, a Args, cwd string) (*Launch, error) {
	var l diag.List
	ln := &Launch{Probe: a.Probe()}
	model := a.Model
	if model == "" {
		model = cfg.DefaultModel
	}
	provider, id, _ := splitModel(model)
	route, ok := cfg.Models[provider]
	if !ok {
		l.Addf(CodeSession, "model.provider", "provider %q is not in the operator's configuration (config.models)", provider)
	}
	var mcp PaseoMCP
	if a.MCPConfig != "" {
		m, err := ReadMCPConfig(a.MCPConfig, cfg.MCP)
		if err != nil {
			l = append(l, err.(diag.List)...)
		}
		mcp = m
	}
	sessionAgent := ""
	if a.Session != "" {
		sessionAgent = sessionAgentID(cfg.State.SessionsDir, a.Session)
		if sessionAgent == "" {
			l.Addf(CodeSession, "launch.session", "not a session log <config.state.sessionsDir>/<agent id>/<file>: the command resumes only sessions it started")
		}
	}
	switch {
	case sessionAgent != "" && mcp.AgentID != "" && sessionAgent != mcp.AgentID:
		l.Addf(CodeSession, "agent.id", "the session log belongs to another agent than the MCP config's callerAgentId")
	case sessionAgent != "":
		ln.AgentID = sessionAgent
	case mcp.AgentID != "":
		ln.AgentID = mcp.AgentID
	case ln.Probe:
		ln.AgentID = "probe-" + randomHex()
	default:
		ln.AgentID = "pi-" + randomHex()
	}
	if len(l) > 0 {
		return nil, l.Sorted()
	}
	ln.MCPToken = mcp.Token
	ln.NewSession = !ln.Probe && a.Session == ""

	f := &ln.Facts
	f.APIVersion, f.Kind = "paseo.dev/policy/v1alpha1", "Facts"
	f.Deployment.ID = cfg.Deployment
	f.Agent.ID = ln.AgentID
	f.Agent.Profile = "pi-session"
	f.Workspace = schema.Workspace{ID: cfg.WorkspaceID, Cwd: cwd}
	if ln.Probe {
		// Paseo probes from the daemon user's home; the probe runs in the
		// operator's probe dir with no session log and no network.
		f.Agent.Profile = "pi-catalog-probe"
		f.Workspace.Cwd = cfg.ProbeCwd
	}
	f.Model = schema.Model{Provider: provider, ID: id, BaseURL: route.BaseURL, API: route.API, Thinking: a.Thinking}
	f.Credential = schema.Credential{Mode: route.Mode, Env: route.Env, SecretRef: route.SecretRef}
	if cfg.MCP != nil && mcp.Token != "" {
		f.MCP = &schema.MCP{AgentsURL: cfg.MCP.AgentsURL, TokenRef: cfg.MCP.TokenRef}
	}
	f.State = schema.State{AgentDir: cfg.State.AgentDir, SessionDir: cfg.State.SessionsDir + "/" + ln.AgentID}
	if !ln.Probe {
		write := cfg.State.GitStoresDir != ""
		g, err := gitFacts(cwd, write)
		if err != nil {
			return nil, diag.List{{Code: CodeGit, Path: "workspace.git", Message: err.Error()}}
		}
		f.Workspace.Git = g
		if write && (g != nil || isDir(cwd+"/.git")) {
			f.State.GitStore = cfg.State.GitStoresDir + "/" + ln.AgentID
			if cfg.GitImport != GitImportOff {
				gp := &GitPlan{GitDir: cwd + "/.git", Repo: cwd + "/.git", StateRoot: cfg.State.GitStoresDir, Store: f.State.GitStore}
				if g != nil {
					gp.GitDir, gp.Repo = g.Gitdir, g.Gitdir
					if g.Commondir != "" {
						gp.Repo = g.Commondir
					}
				}
				ln.Git = gp
			}
		}
	}
	f.Launch = schema.Launch{Extension: cfg.Extension, MCPConfig: a.MCPConfig, Session: a.Session, AppendSystemPrompt: a.AppendSystemPrompt}
	if a.Extension != "" {
		f.Launch.Extension = a.Extension
	}
	if f.MCP == nil {
		f.Launch.MCPConfig = ""
	}
	return ln, nil
}

// sessionAgentID returns <id> for a session log <sessions>/<id>/…/<file>
// (Pi may keep logs in a subdirectory named for the cwd), or "".
func sessionAgentID(sessions, session string) string {
	if code, _ := pathform.Check(session); code != "" || !pathform.Beneath(sessions, session) {
		return ""
	}
	rel := strings.Split(pathform.Rel(sessions, session), "/")
	if len(rel) < 2 || !idRE.MatchString(rel[0]) {
		return ""
	}
	return rel[0]
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// isDir reports whether p is a directory, reached without following links.
func isDir(p string) bool {
	fd, err := openNoFollow(p, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
