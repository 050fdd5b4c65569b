package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// Code and settings an agent plants never load outside its own session.
// Agent 1's Pi writes an extension into its agent dir (a private tmpfs: it
// lands there and dies with the sandbox), tries to overwrite the daemon's
// settings.json and models.json (read-only), writes an auth.json that would
// run a command, a forged session log into another agent's session dir (not
// mounted), an extension plus project settings into the workspace it
// shares with agent 2 (untrusted project resources) and MCP configs there
// (.mcp.json, .pi/mcp.json, which the MCP adapter in exclusive mode never
// reads), and code into the
// adapter's entry in its jiti cache (/tmp/jiti: the sandbox's own, seeded
// from the image at every start).
// Then agent 2 starts on
// the same agent dir and workspace, and agent 1 starts again: neither loads
// anything planted, while the daemon's integration extension, which writes a
// marker of its own the same way, shows that extensions do load and can
// leave that marker.
func TestPiPlantedCode(t *testing.T) {
	e := newEnv(t)
	sc := e.scene(t, "pi-session", "")
	ws := sc.Workspace()
	agentDir := filepath.Join(sc.Host, "srv/paseo/state/pi-agent")
	sessions := filepath.Join(sc.Host, "srv/paseo/state/pi-sessions")
	integration(t, sc)
	settings, models := readFile(t, filepath.Join(agentDir, "settings.json")), readFile(t, filepath.Join(agentDir, "models.json"))

	plant := `import { writeFileSync } from "node:fs";
writeFileSync(process.cwd() + "/PLANTED-RAN-" + process.env.PASEO_AGENT_ID, "planted\n");
export default function () {}
`
	wsExt := filepath.Join(ws, ".pi/extensions/planted.ts")
	e.setScript(t,
		fakemodel.WriteFile(filepath.Join(agentDir, "extensions/planted.ts"), plant),
		fakemodel.Text("planted in the agent dir"),
		fakemodel.WriteFile(wsExt, plant),
		fakemodel.Text("planted in the workspace"),
		fakemodel.Bash(strings.Join([]string{
			`cd "$PI_CODING_AGENT_DIR"`,
			`echo '{"extensions":["` + wsExt + `"],"defaultProjectTrust":"always"}' > settings.json && echo settings-written || echo settings-refused`,
			`echo '{"providers":{}}' > models.json && echo models-written || echo models-refused`,
			`echo '{"other":{"type":"api_key","key":"!touch ` + ws + `/AUTH-COMMAND-RAN"}}' > auth.json && echo auth-written || echo auth-refused`,
			`mkdir -p ` + sessions + `/agent-9d21 && echo '{"type":"session"}' > ` + sessions + `/agent-9d21/forged.jsonl && echo session-written || echo session-refused`,
			`echo '{"extensions":["` + wsExt + `"]}' > ` + ws + `/.pi/settings.json && echo project-settings-written`,
			// MCP configs in the workspace whose server pi-mcp-adapter would
			// start at every Pi start (eager) if it read them.
			`echo '{"mcpServers":{"planted":{"command":"/bin/sh","args":["-c","touch ` + ws + `/MCP-PLANT-RAN"],"lifecycle":"eager"}}}' > ` + ws + `/.mcp.json && cp ` + ws + `/.mcp.json ` + ws + `/.pi/mcp.json && echo mcp-config-written`,
			// The adapter's entry as jiti cached it, with code in front and
			// jiti's hash line kept: a hit for any later jiti that read
			// this cache.
			`f=$(ls /tmp/jiti/pi-mcp-adapter-index.*.mjs) && { printf 'require("node:fs").writeFileSync(process.cwd()+"/JITI-PLANT-RAN-"+process.env.PASEO_AGENT_ID,"x");'; cat "$f"; } > /tmp/plant && cp /tmp/plant "$f" && echo jiti-planted || echo jiti-refused`,
		}, "; ")),
		fakemodel.Text("tried the rest"),
	)
	p := e.launch(t, sc)
	c := ctx(t)
	p.turn(t, c, "plant an extension")
	if got := e.lastToolResult(t); !strings.Contains(got, "Successfully wrote") {
		t.Errorf("the extension did not land even in the sandbox's own agent dir, so the attempt proves nothing: %q", got)
	}
	p.turn(t, c, "plant in the workspace")
	p.turn(t, c, "plant settings")
	out := e.lastToolResult(t)
	p.stop(t)
	for _, want := range []string{"settings-refused", "models-refused", "session-refused", "project-settings-written", "mcp-config-written", "jiti-planted"} {
		if !strings.Contains(out, want) {
			t.Errorf("plant attempts: want %s in %q", want, out)
		}
	}
	// Read before the next scene rebuilds the tree.
	if _, err := os.Stat(filepath.Join(agentDir, "extensions")); !os.IsNotExist(err) {
		t.Errorf("the extension reached the host agent dir (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(agentDir, "auth.json")); !os.IsNotExist(err) {
		t.Errorf("auth.json reached the host agent dir (%v)", err)
	}
	if got := readFile(t, filepath.Join(agentDir, "settings.json")); got != settings {
		t.Errorf("host settings.json changed: %q", got)
	}
	if got := readFile(t, filepath.Join(agentDir, "models.json")); got != models {
		t.Errorf("host models.json changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(sessions, "agent-9d21", "forged.jsonl")); !os.IsNotExist(err) {
		t.Errorf("the forged session log reached agent 2's session dir (%v)", err)
	}
	if _, err := os.Stat(wsExt); err != nil {
		t.Fatalf("the workspace plant did not land, so agent 2 would not be tested against it: %v", err)
	}
	ran(t, ws, "INTEGRATION-RAN-agent-7f3c", true)

	// Agent 2: its own session, cache and Git store dirs, the same agent dir and workspace.
	git2 := filepath.Join(sc.Host, "srv/paseo/state/pi-git/agent-9d21")
	for _, d := range []string{filepath.Join(sessions, "agent-9d21"), filepath.Join(sc.Host, "srv/paseo/state/pi-cache/agent-9d21"), git2} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		chownTree(t, d, 1000, 1000)
	}
	sc2 := e.scene(t, "pi-session", fmt.Sprintf(`{"agent":{"id":"agent-9d21"},"state":{"sessionDir":%q,"cacheDir":%q,"gitStore":%q}}`,
		filepath.Join(sessions, "agent-9d21"), filepath.Join(sc.Host, "srv/paseo/state/pi-cache/agent-9d21"), git2))
	integration(t, sc2)
	e.startAndStop(t, sc2)
	ran(t, ws, "INTEGRATION-RAN-agent-9d21", true)

	// Agent 1 again, as the daemon would restart it.
	if err := os.Remove(filepath.Join(ws, "INTEGRATION-RAN-agent-7f3c")); err != nil {
		t.Fatal(err)
	}
	sc3 := e.scene(t, "pi-session", "")
	integration(t, sc3)
	e.startAndStop(t, sc3)
	ran(t, ws, "INTEGRATION-RAN-agent-7f3c", true)

	for _, m := range []string{"PLANTED-RAN-agent-7f3c", "PLANTED-RAN-agent-9d21", "AUTH-COMMAND-RAN", "JITI-PLANT-RAN-agent-7f3c", "MCP-PLANT-RAN"} {
		ran(t, ws, m, false)
	}
}

// integration makes the daemon's integration extension leave a marker
// named for the agent in the cwd, as a planted extension would.
func integration(t *testing.T, sc *testbundle.Scene) {
	write(t, filepath.Join(sc.Host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"), `import { writeFileSync } from "node:fs";
writeFileSync(process.cwd() + "/INTEGRATION-RAN-" + process.env.PASEO_AGENT_ID, "integration\n");
export default function () {}
`)
}

// startAndStop starts Pi, waits until it answers (its extensions loaded),
// and stops it.
func (e *env) startAndStop(t *testing.T, sc *testbundle.Scene) {
	p := e.launch(t, sc)
	p.call(t, ctx(t), map[string]any{"type": "get_state"})
	if res := p.stop(t); res.ExitCode != 0 {
		t.Errorf("Pi exit %d, reason %q; stderr: %s", res.ExitCode, res.Reason, p.stderr.String())
	}
}

func ran(t *testing.T, ws, marker string, want bool) {
	t.Helper()
	_, err := os.Stat(filepath.Join(ws, marker))
	if got := err == nil; got != want {
		t.Errorf("%s in the workspace: %v, want %v", marker, got, want)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// In oauth-file mode Pi reads and locks its auth.json inside the projection:
// proper-lockfile makes auth.json.lock beside the file (in the private
// tmpfs), and the OAuth credential it read shows in the model list. The
// write Pi makes on refresh goes through the read-write file bind to the
// host, which the sandbox's own write below stands in for.
func TestPiOAuthFile(t *testing.T) {
	e := newEnv(t)
	host := e.host
	agentDir := filepath.Join(host, "srv/paseo/state/pi-agents/agent-7f3c")
	auth := `{"anthropic":{"type":"oauth","access":"oat-e2e-access","refresh":"oat-e2e-refresh","expires":4102444800000}}`
	write(t, filepath.Join(agentDir, "auth.json"), auth)
	writeAgentFiles(t, agentDir)
	if err := os.Chmod(filepath.Join(agentDir, "auth.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	chownTree(t, agentDir, 1000, 1000)
	// The refresh endpoint by address: the test's resolver knows only the model.
	sc := e.scene(t, "pi-session", fmt.Sprintf(`{"credential":{"mode":"oauth-file","env":null,"secretRef":null,"authFile":%q,
		"refreshURLs":["https://%s:8443/oauth/token"]},"state":{"agentDir":%q}}`, filepath.Join(agentDir, "auth.json"), e.model.Addr, agentDir))
	p := e.launch(t, sc)
	c := ctx(t)
	models := p.call(t, c, map[string]any{"type": "get_available_models"})
	if !strings.Contains(string(models.Data), `"anthropic"`) {
		t.Errorf("Pi did not read the OAuth credential in auth.json: %.300s\nstderr: %s", models.Data, p.stderr.String())
	}
	p.stop(t)
	if got := readFile(t, filepath.Join(agentDir, "auth.json")); got != auth {
		t.Errorf("auth.json changed without a refresh: %q", got)
	}
	if _, err := os.Stat(filepath.Join(agentDir, "auth.json.lock")); !os.IsNotExist(err) {
		t.Errorf("the lock reached the host agent dir (%v)", err)
	}
}
