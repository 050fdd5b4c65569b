package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// The daemon's MCP bearer across a daemon restart, with the real Pi
// through the supervisor: the daemon hands its token at createSandbox, a
// Pi turn calls a Paseo tool through the route; the daemon restarts with a
// new token (its listener accepts only that one from then on), so the
// next call with the old token is refused; the daemon reattaches with the
// new token and the next call succeeds. Neither token is ever in the
// sandbox (files, env, argv), the bundle or the state.
func TestPiMCPTokenRotation(t *testing.T) {
	const tokA, tokB = "run-one-5e81c0d2", "run-two-9a47f3b6"
	// The tokens' text is assembled inside the sandbox so that the bash
	// command itself (argv, the session log) does not hold it.
	look := func(tok string) string {
		half := len(tok) / 2
		return fmt.Sprintf(`T=%s; T="${T}%s"; if grep -rqsF "$T" /proc/[0-9]*/environ /proc/[0-9]*/cmdline /etc /tmp /home /srv 2>/dev/null; then echo token-inside; else echo token-absent; fi`, tok[:half], tok[half:])
	}
	e := newEnv(t)
	e.daemon.Restart(tokA)
	listAgents := fakemodel.Turn{ToolCalls: []fakemodel.ToolCall{{Name: "mcp", Arguments: map[string]any{"tool": "paseo_list_agents", "args": "{}"}}}}
	e.setScript(t,
		listAgents, fakemodel.Text("first"),
		listAgents, fakemodel.Text("after the restart"),
		listAgents, fakemodel.Text("after the reattach"),
		// The model key is not in the sandbox either (the model route adds
		// it); the model route's stand-in is in Pi's environment: the
		// probe must see that (the control that shows it can find one).
		fakemodel.Bash(look(tokA)+"; "+look(tokB)+"; "+look(apiKey)+"; "+look(bundle.ModelRoutePlaceholder)), fakemodel.Text("looked"),
	)
	sc := e.scene(t, "pi-session", "")
	socket := e.startSupervisor(t, sc)
	dial := func() *supervisor.Client { return dialSupervisor(t, socket) }
	c := ctx(t)
	cl := dial()
	var in supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts, MCPToken: tokA}, &in); err != nil {
		t.Fatal(err)
	}
	tr := &stream{}
	attach := func(token string) uint64 {
		var att struct{ Epoch uint64 }
		if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor, MCPToken: token}, &att); err != nil {
			t.Fatal(err)
		}
		return att.Epoch
	}
	n := 0
	turn := func(epoch uint64, message string) string {
		n++
		id := fmt.Sprintf("p%d", n)
		tr.from = tr.Stdout.Len()
		line := fmt.Sprintf(`{"id":%q,"type":"prompt","message":%q}`, id, message)
		if err := cl.Call(c, supervisor.Request{Op: "write", Sandbox: in.Sandbox, Epoch: epoch, InputID: id, Data: []byte(line + "\n")}, nil); err != nil {
			t.Fatal(err)
		}
		if !tr.until(t, cl, in.Sandbox, `"agent_settled"`, 90*time.Second) {
			t.Fatalf("turn %q never settled: %q", message, tr.tail())
		}
		return e.lastToolResult(t)
	}
	epoch := attach("")
	if got := turn(epoch, "list agents"); !strings.Contains(got, "agents listed by paseo") {
		t.Fatalf("with the token from createSandbox: %q", got)
	}
	// The daemon restarts: new run, new token. The sandbox outlives it;
	// until the daemon reattaches, its proxy still has the old token.
	e.daemon.Restart(tokB)
	cl.Close()
	cl = dial()
	// The fake daemon answers a wrong bearer "unauthorized" (401).
	if got := turn(attach(""), "list agents again"); strings.Contains(got, "agents listed by paseo") || !strings.Contains(got, "unauthorized") {
		t.Errorf("the old token was accepted after the restart: %q", got)
	} else {
		t.Logf("the call with the old token: %.300s", got)
	}
	cl.Close()
	cl = dial()
	epoch = attach(tokB)
	if got := turn(epoch, "list agents once more"); !strings.Contains(got, "agents listed by paseo") {
		t.Errorf("after the reattach with the new token: %q", got)
	}
	if got := turn(epoch, "look for the tokens"); strings.Count(got, "token-absent") != 3 || strings.Count(got, "token-inside") != 1 {
		t.Errorf("a token is inside the sandbox: %q", got)
	}
	var bearers []string
	for _, s := range e.daemon.Requests() {
		if f := strings.Fields(s); len(f) > 4 && f[4] == "tools/call" {
			bearers = append(bearers, f[3])
		}
	}
	if want := fmt.Sprintf("[%s %s %s]", tokA, tokA, tokB); fmt.Sprint(bearers) != want {
		t.Errorf("tools/call bearers %v, want %s", bearers, want)
	}
	_ = filepath.WalkDir(sc.State, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), tokA) || strings.Contains(string(b), tokB) {
				t.Errorf("%s holds a token", p)
			}
		}
		return nil
	})
	if err := cl.Call(c, supervisor.Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
}
