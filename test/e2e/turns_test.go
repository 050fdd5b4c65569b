package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
)

// A session: get_state answers; a plain turn settles; a scripted write
// lands in the host workspace with the sandbox user as owner; a write
// outside the workspace and a bash command reading a host canary and
// reaching the decoy both fail and leave the host unchanged; the session
// log lands in the session dir; the model saw the injected key while the
// bundle holds a placeholder; abort ends a streaming turn in Pi's order.
// Then a second sandbox resumes the session by its path.
func TestPiSession(t *testing.T) {
	marker := "canary-" + apiKey[len(apiKey)-6:] + "-e2e"
	e := newEnv(t)
	sc := e.scene(t, "pi-session", "")
	ws := sc.Workspace()
	outside := filepath.Join(filepath.Dir(ws), "neighbour", "planted.txt")
	canary := filepath.Join(sc.Host, "home/alice/.ssh/id_ed25519")
	write(t, canary, marker+"\n")
	if err := os.MkdirAll(filepath.Dir(outside), 0o755); err != nil {
		t.Fatal(err)
	}
	// The script names host paths, known once the scene exists.
	e.setScript(t,
		fakemodel.Text("hello from the fake model"),
		fakemodel.WriteFile("notes.txt", "written by pi\n"),
		fakemodel.Text("wrote it"),
		fakemodel.WriteFile(outside, "escaped\n"),
		fakemodel.Text("tried"),
		// The decoy's SYN is dropped, so the connect is bounded by timeout.
		fakemodel.Bash("cat "+canary+"; timeout 3 bash -c 'exec 3<>/dev/tcp/"+e.decoyAddr()+"/8443' && echo decoy-reached || echo decoy-blocked; echo key=$FAKE_LLM_KEY; cat /proc/self/environ /proc/1/environ 2>/dev/null | tr '\\0' '\\n' | grep -c "+apiKey[:8]+" || :"),
		fakemodel.Text("ran"),
		fakemodel.Slow(strings.Repeat("slow ", 60), 60, 6*time.Second),
	)

	p := e.launch(t, sc)
	c := ctx(t)
	state := p.call(t, c, map[string]any{"type": "get_state"})
	if !strings.Contains(string(state.Data), "fake-1") {
		t.Errorf("get_state: %s", state.Data)
	}
	events := p.turn(t, c, "say hello")
	if !strings.Contains(strings.Join(piproto.Types(events), ","), "message_end") {
		t.Errorf("first turn events: %v", piproto.Types(events))
	}

	p.turn(t, c, "write notes.txt")
	got, err := os.ReadFile(filepath.Join(ws, "notes.txt"))
	if err != nil || string(got) != "written by pi\n" {
		t.Errorf("workspace write: %q %v", got, err)
	}
	if uid, gid := ownerOf(t, filepath.Join(ws, "notes.txt")); uid != 1000 || gid != 1000 {
		t.Errorf("notes.txt owned by %d:%d, want the sandbox user 1000:1000", uid, gid)
	}

	p.turn(t, c, "write outside")
	if _, err := os.Stat(outside); err == nil {
		t.Errorf("Pi wrote outside the workspace: %s", outside)
	}

	p.turn(t, c, "run bash")
	if e.decoy.Conns() != 0 {
		t.Error("the decoy saw a connection")
	}
	toolOut := e.lastToolResult(t)
	if strings.Contains(toolOut, marker) || strings.Contains(toolOut, "decoy-reached") {
		t.Errorf("the bash tool reached the host: %q", toolOut)
	}
	if !strings.Contains(toolOut, "No such file") || !strings.Contains(toolOut, "decoy-blocked") {
		t.Errorf("bash tool output does not show the canary missing: %q", toolOut)
	}
	// The model route (issue 24): the sandbox's variable is the route's
	// stand-in, and no environment in it holds the key.
	if strings.Contains(toolOut, apiKey) || !strings.Contains(toolOut, "key=paseo-model-route") {
		t.Errorf("the sandbox's environment: %q, want the route's placeholder and no key", toolOut)
	}

	// Abort during a streaming turn: aborted message and agent_settled,
	// then the response.
	p.call(t, c, map[string]any{"type": "prompt", "message": "stream slowly"})
	if _, _, err := p.Until(c, piproto.Event("message_update")); err != nil {
		t.Fatal(err)
	}
	id, _ := p.Send(map[string]any{"type": "abort"})
	resp, before, err := p.Until(c, piproto.Response(id))
	if err != nil || !resp.OK() {
		t.Fatalf("abort: %+v %v", resp, err)
	}
	types := strings.Join(piproto.Types(before), ",")
	if !strings.Contains(types, "agent_settled") || !strings.Contains(aborted(before), "aborted") {
		t.Errorf("abort order: %s", types)
	}

	res := p.stop(t)
	if res.ExitCode != 0 {
		t.Errorf("Pi exit %d, reason %q; stderr: %s", res.ExitCode, res.Reason, p.stderr.String())
	}
	for _, r := range e.requests() {
		if !r.Authorized || !r.TLS || r.ServerName != "llm.example.test" {
			t.Errorf("the model saw %s %s: key %v, TLS %v, SNI %q; want the key the route added, over TLS to the provider's name", r.Method, r.Path, r.Authorized, r.TLS, r.ServerName)
		}
	}
	if rs := res.Routes["model"]; rs.Forwarded < 5 || rs.Refused != 0 {
		t.Errorf("model route: %+v, want every turn forwarded and nothing refused", rs)
	}
	bundleCfg, _ := os.ReadFile(filepath.Join(sc.Bundle, "config.json"))
	if strings.Contains(string(bundleCfg), apiKey) {
		t.Error("the compiled bundle holds the key")
	}

	// The session log is where the facts say sessions go.
	logs, _ := filepath.Glob(filepath.Join(sc.Host, "srv/paseo/state/pi-sessions/agent-7f3c", "*.jsonl"))
	if len(logs) != 1 {
		t.Fatalf("session logs: %v", logs)
	}
	header, _ := os.ReadFile(logs[0])
	if !strings.Contains(string(header), `"cwd":"`+ws+`"`) {
		t.Errorf("session header does not name the workspace path: %.200s", header)
	}

	// Resume in a second sandbox with --session <that path>.
	e.setScript(t, fakemodel.Text("resumed"))
	sc2 := e.scene(t, "pi-session", `{"launch":{"session":"`+logs[0]+`"}}`)
	p2 := e.launch(t, sc2)
	c2 := ctx(t)
	st := p2.call(t, c2, map[string]any{"type": "get_state"})
	if !strings.Contains(string(st.Data), logs[0]) {
		t.Errorf("resumed get_state does not name the session file: %s", st.Data)
	}
	p2.turn(t, c2, "continue")
	reqs := e.requests()
	if len(reqs) == 0 || reqs[len(reqs)-1].Messages < 8 {
		t.Errorf("the resumed turn did not carry the earlier conversation: %d requests", len(reqs))
	}
	p2.stop(t)
}

func aborted(frames []piproto.Frame) string {
	var b strings.Builder
	for _, f := range frames {
		if f.Type == "message_end" || f.Type == "turn_end" || f.Type == "agent_end" {
			b.Write(f.Raw)
		}
	}
	return b.String()
}

// lastToolResult is the content of the last tool message the model was
// sent: what Pi's tool returned inside the sandbox.
func (e *env) lastToolResult(t *testing.T) string {
	reqs := e.requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		var body struct {
			Messages []struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		if json.Unmarshal(reqs[i].Body, &body) != nil {
			continue
		}
		for j := len(body.Messages) - 1; j >= 0; j-- {
			if body.Messages[j].Role == "tool" {
				return string(body.Messages[j].Content)
			}
		}
	}
	t.Fatal("no tool result reached the model")
	return ""
}

// The catalog probe lists the models under the same sandbox contract, with
// no egress at all; the adapter probe shows the mcp command.
func TestPiProbes(t *testing.T) {
	e := newEnv(t)
	p := e.launch(t, e.scene(t, "pi-catalog-probe", ""))
	c := ctx(t)
	models := p.call(t, c, map[string]any{"type": "get_available_models"})
	if !strings.Contains(string(models.Data), "fake-1") {
		t.Errorf("get_available_models: %s", models.Data)
	}
	p.stop(t)

	p = e.launch(t, e.scene(t, "pi-adapter-probe", ""))
	cmds := p.call(t, c, map[string]any{"type": "get_commands"})
	var data struct {
		Commands []struct {
			Name   string `json:"name"`
			Source string `json:"source"`
		} `json:"commands"`
	}
	_ = json.Unmarshal(cmds.Data, &data)
	found := false
	for _, cmd := range data.Commands {
		found = found || (cmd.Name == "mcp" && cmd.Source == "extension")
	}
	if !found {
		t.Errorf("get_commands has no mcp extension command: %s", cmds.Data)
	}
	p.stop(t)
}

// An MCP tool call made by the model reaches the fake daemon through the
// private route, as this agent and with the bearer the proxy adds; a raw
// request from the sandbox as another agent, or to another path, is
// refused by the proxy and never reaches the daemon. A tool outside the
// scope (create_agent) is not offered to Pi, and called anyway (by Pi or
// by a raw request) it is refused before the daemon.
func TestPiMCPRoute(t *testing.T) {
	e := newEnv(t)
	raw := func(target string) string {
		return fmt.Sprintf(`timeout 5 bash -c 'exec 3<>/dev/tcp/paseo-gateway/%d; printf "POST %s HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}" >&3; head -1 <&3'`, e.daemon.port, target)
	}
	createAgent := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"create_agent","arguments":{}}}`
	rawCreate := fmt.Sprintf(`timeout 5 bash -c 'exec 3<>/dev/tcp/paseo-gateway/%d; printf "POST /mcp/agents?callerAgentId=agent-7f3c HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" >&3; cat <&3'`, e.daemon.port, len(createAgent), strings.ReplaceAll(createAgent, `"`, `\"`))
	e.setScript(t,
		fakemodel.Turn{ToolCalls: []fakemodel.ToolCall{{Name: "mcp", Arguments: map[string]any{"tool": "paseo_list_agents", "args": "{}"}}}},
		fakemodel.Text("called"),
		fakemodel.Bash(raw("/mcp/agents?callerAgentId=agent-other")+"; "+raw("/api/agents?callerAgentId=agent-7f3c")),
		fakemodel.Text("probed"),
		fakemodel.Turn{ToolCalls: []fakemodel.ToolCall{{Name: "mcp", Arguments: map[string]any{"tool": "paseo_create_agent", "args": "{}"}}}},
		fakemodel.Text("tried"),
		fakemodel.Bash(rawCreate),
		fakemodel.Text("tried raw"),
	)
	sc := e.scene(t, "pi-session", "")
	p := e.launch(t, sc)
	c := ctx(t)
	p.turn(t, c, "call the paseo tool")
	if got := e.lastToolResult(t); !strings.Contains(got, "agents listed by paseo") {
		t.Errorf("the MCP tool result did not come back from the daemon: %q", got)
	}
	p.turn(t, c, "probe the route")
	if got := e.lastToolResult(t); !strings.Contains(got, "403") || !strings.Contains(got, "404") {
		t.Errorf("raw requests as another agent / to another path: %q", got)
	}
	p.turn(t, c, "create an agent")
	if got := e.lastToolResult(t); strings.Contains(got, "DAEMON RAN") {
		t.Errorf("create_agent through Pi reached the daemon: %q", got)
	}
	p.turn(t, c, "create an agent, raw")
	if got := e.lastToolResult(t); !strings.Contains(got, "outside the sandbox's MCP scope") || strings.Contains(got, "DAEMON RAN") {
		t.Errorf("a raw create_agent: %q", got)
	}
	res := p.stop(t)
	if st := res.Routes["mcp"]; st.Refused < 3 || st.OutOfScope < 1 || st.Forwarded < 3 || st.Filtered < 1 {
		t.Errorf("route stats %+v", res.Routes)
	}
	seen := e.daemon.Requests()
	t.Logf("route stats %+v; the daemon saw %q", res.Routes["mcp"], seen)
	if len(seen) == 0 {
		t.Fatalf("the fake daemon saw nothing; tool result: %q; routes %+v; stderr: %s", e.lastToolResult(t), res.Routes, p.stderr.String())
	}
	for _, s := range seen {
		if !strings.HasPrefix(s, "POST /mcp/agents?callerAgentId=agent-7f3c Bearer "+mcpToken) || strings.Contains(s, "create_agent") {
			t.Errorf("daemon request %q", s)
		}
	}
	if !strings.Contains(strings.Join(seen, "\n"), "tools/call") {
		t.Errorf("no tools/call reached the daemon: %q; tool result %q", seen, e.lastToolResult(t))
	}
}
