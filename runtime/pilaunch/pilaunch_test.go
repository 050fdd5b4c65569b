package pilaunch

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/skip"
)

func codes(t *testing.T, err error) []string {
	t.Helper()
	var l diag.List
	if !errors.As(err, &l) {
		t.Fatalf("want diagnostics, got %v", err)
	}
	var out []string
	for _, d := range l {
		out = append(out, string(d.Code)+" "+d.Path)
	}
	return out
}

// Paseo's argv as buildPiLaunch makes it (providers/pi/runtime.ts): every
// flag it appends parses; anything else is refused with PP-PI-ARGV.
func TestParseArgs(t *testing.T) {
	a, err := ParseArgs([]string{"--mode", "rpc", "--model", "fake/fake-1", "--thinking", "medium",
		"--session", "/s/agent-1/x.jsonl", "--append-system-prompt", "be brief", "--mcp-config", "/tmp/paseo-pi-mcp-1/mcp.json"})
	if err != nil {
		t.Fatal(err)
	}
	want := Args{Model: "fake/fake-1", Thinking: "medium", Session: "/s/agent-1/x.jsonl", AppendSystemPrompt: "be brief", MCPConfig: "/tmp/paseo-pi-mcp-1/mcp.json"}
	if a != want || a.Probe() {
		t.Errorf("got %+v", a)
	}
	if a, err := ParseArgs([]string{"--mode=rpc"}); err != nil || !a.Probe() {
		t.Errorf("a probe: %+v %v", a, err)
	}
	for _, bad := range [][]string{
		{"--mode", "rpc", "--tools", "bash"},
		{"--mode", "json"},
		{"--model"},
		{"--model", "a/b", "--model", "c/d"},
		{"--thinking", "extreme"},
		{"prompt text"},
		{"--no-session"},
	} {
		_, err := ParseArgs(bad)
		for _, c := range codes(t, err) {
			if !strings.HasPrefix(c, string(CodeArgv)) {
				t.Errorf("%q: %s", bad, c)
			}
		}
	}
}

func writeConfig(t *testing.T, dir string, c Config, mode os.FileMode) string {
	t.Helper()
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "pi.json")
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func refConfig() Config {
	return Config{Socket: "/run/paseo-sandbox/supervisor.sock", Deployment: "host-alice", WorkspaceID: "wks_1",
		Models:       map[string]ModelRoute{"fake": {BaseURL: "https://llm.example.test:8443/v1", API: "openai-completions", Mode: "api-key", Env: "FAKE_LLM_KEY", SecretRef: "alice/fake-llm"}},
		DefaultModel: "fake/fake-1",
		MCP:          &MCPRoute{AgentsURL: "http://127.0.0.1:6767/mcp/agents", TokenRef: "paseo/mcp-token"},
		State:        StateDirs{AgentDir: "/srv/paseo/state/pi-agent", SessionsDir: "/srv/paseo/state/pi-sessions", BridgeDir: "/srv/paseo/state/bridge"},
		Extension:    "/srv/paseo/launch/ext/paseo-integration.mjs", ProbeCwd: "/srv/paseo/workspace/probe"}
}

// The configuration is the operator's: a file the daemon user could
// have written (its mode, a symlink, a writable directory above it) is
// refused, and so is an unknown field.
func TestLoadConfigTrust(t *testing.T) {
	skip.UnlessRoot(t, "the configuration must be root-owned, and the test chowns it")
	dir := t.TempDir()
	p := writeConfig(t, dir, refConfig(), 0o644)
	if _, err := LoadConfig(p); err != nil {
		t.Fatalf("the reference configuration: %v", err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(p); err == nil {
		t.Error("a world-writable configuration was loaded")
	}
	_ = os.Chmod(p, 0o644)
	if err := os.Chown(p, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(p); err == nil {
		t.Error("a configuration of uid 1000 was loaded")
	}
	_ = os.Chown(p, 0, 0)
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(link); err == nil {
		t.Error("a symlink was followed")
	}
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(open, 0o777)
	q := writeConfig(t, open, refConfig(), 0o644)
	if _, err := LoadConfig(q); err == nil {
		t.Error("a configuration in a world-writable directory was loaded")
	}
	if err := os.WriteFile(p, []byte(`{"socket":"/x","unknown":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := codes(t, func() error { _, err := LoadConfig(p); return err }()); len(got) != 1 || got[0] != "PP-PI-CONFIG config" {
		t.Errorf("unknown field: %q", got)
	}
}

// The facts come from the configuration, argv and cwd only: decoy keys in
// the environment reach nothing, and the MCP bearer stays out of the facts.
func TestPlanFromConfigOnly(t *testing.T) {
	for _, k := range []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "PI_CODING_AGENT_DIR", "FAKE_LLM_KEY"} {
		t.Setenv(k, "decoy-"+strings.ToLower(k))
	}
	cfg := refConfig()
	dir := t.TempDir()
	mcp := filepath.Join(dir, "mcp.json")
	if err := os.WriteFile(mcp, []byte(`{"mcpServers":{"paseo":{"url":"http://127.0.0.1:6767/mcp/agents?callerAgentId=agent-9","headers":{"Authorization":"Bearer tok-123"},"auth":false,"oauth":false},
	 "other":{"url":"http://127.0.0.1:9999/mcp"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := ParseArgs([]string{"--mode", "rpc", "--thinking", "low", "--mcp-config", mcp, "--append-system-prompt", "p"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Plan(&cfg, a, "/srv/paseo/workspace/proj")
	if err != nil {
		t.Fatal(err)
	}
	if ln.AgentID != "agent-9" || ln.MCPToken != "tok-123" || ln.Probe || !ln.NewSession {
		t.Errorf("launch: %+v", ln)
	}
	facts, _ := json.Marshal(ln.Facts)
	for _, s := range []string{"decoy", "tok-123"} {
		if strings.Contains(string(facts), s) {
			t.Errorf("%s in the facts: %s", s, facts)
		}
	}
	if ln.Facts.State.SessionDir != "/srv/paseo/state/pi-sessions/agent-9" || ln.Facts.Model.ID != "fake-1" || ln.Facts.Launch.MCPConfig != mcp || ln.Facts.MCP == nil {
		t.Errorf("facts: %s", facts)
	}
	// A resume names its agent by its session log's dir; another agent's
	// MCP config is refused.
	a.Session = "/srv/paseo/state/pi-sessions/agent-8/2026_x.jsonl"
	if got := codes(t, func() error { _, err := Plan(&cfg, a, "/w"); return err }()); len(got) != 1 || got[0] != "PP-PI-SESSION agent.id" {
		t.Errorf("two agent ids: %q", got)
	}
	a.Session = "/elsewhere/agent-9/x.jsonl"
	if got := codes(t, func() error { _, err := Plan(&cfg, a, "/w"); return err }()); len(got) != 1 || got[0] != "PP-PI-SESSION launch.session" {
		t.Errorf("a session outside the sessions dir: %q", got)
	}
	// Probes run in the probe dir with the catalog probe's profile.
	p, err := Plan(&cfg, Args{}, "/home/alice")
	if err != nil || !p.Probe || p.Facts.Agent.Profile != "pi-catalog-probe" || p.Facts.Workspace.Cwd != cfg.ProbeCwd {
		t.Errorf("probe: %+v %v", p, err)
	}
	// An MCP config naming another listener than the operator's route.
	if err := os.WriteFile(mcp, []byte(`{"mcpServers":{"paseo":{"url":"http://127.0.0.1:7000/mcp/agents?callerAgentId=agent-9","headers":{"Authorization":"Bearer t"}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Session = ""
	if got := codes(t, func() error { _, err := Plan(&cfg, a, "/w"); return err }()); len(got) != 1 || got[0] != "PP-PI-MCP-CONFIG launch.mcpConfig" {
		t.Errorf("another MCP listener: %q", got)
	}
	link := filepath.Join(dir, "link.json")
	_ = os.Symlink(mcp, link)
	a.MCPConfig = link
	if got := codes(t, func() error { _, err := Plan(&cfg, a, "/w"); return err }()); len(got) != 1 || got[0] != "PP-PI-MCP-CONFIG launch.mcpConfig" {
		t.Errorf("a symlinked MCP config: %q", got)
	}
}

// Records are 0600 files of the daemon user in a 0700 dir; a symlink
// planted as a record is not followed.
func TestStore(t *testing.T) {
	dir := t.TempDir()
	_ = os.Chmod(dir, 0o700)
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := s.Load("a1"); r != nil || err != nil {
		t.Fatalf("empty: %v %v", r, err)
	}
	if err := s.Save("a1", Record{Sandbox: "pp-1", Cursor: 7}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Load("a1")
	if err != nil || *r != (Record{Sandbox: "pp-1", Cursor: 7}) {
		t.Fatalf("%v %v", r, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "a1.json")); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	_ = os.Symlink(filepath.Join(dir, "a1.json"), filepath.Join(dir, "a2.json"))
	if _, err := s.Load("a2"); err == nil {
		t.Error("a symlinked record was read")
	}
	_ = os.Chmod(dir, 0o755)
	if _, err := OpenStore(dir); err == nil {
		t.Error("a bridge dir others can read was opened")
	}
}
