package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// TestPiGrepNativeSearchThroughSupervisor: the supervisor's createSandbox
// compiles the native search when the registry turns it on for the
// deployment (deployments.<id>.search "native": grant search workspace),
// with no option of any launch path. The real Pi's grep tool (the fake
// model asks for a grep; settings.json adds the tool) spawns rg from
// PATH, which is the compiled client, and the launcher's server answers
// it from the host: the sandbox's Info counts the answered search once it
// exited, and the tool's result holds the match. Control: the same
// session with the switch left out finds the same match through the
// sandbox's own rg, and no search server ran (no counters).
func TestPiGrepNativeSearchThroughSupervisor(t *testing.T) {
	for _, native := range []bool{true, false} {
		name := "native"
		if !native {
			name = "control"
		}
		t.Run(name, func(t *testing.T) {
			in, out := grepThroughSupervisor(t, native)
			t.Logf("the search server's counters: %+v", in.Search)
			if !strings.Contains(out, "needle.txt:1: the NEEDLE_7f3c line") {
				t.Errorf("Pi's grep result lacks the match; its output ends: %q", tailOf(out, 1500))
			}
			switch {
			case native && (in.Search == nil || in.Search.Answered < 1 || in.Search.Refused != 0):
				t.Errorf("the search server's counters: %+v, want the grep answered from the host", in.Search)
			case !native && in.Search != nil:
				t.Errorf("control: a search server ran: %+v", in.Search)
			}
		})
	}
}

// grepThroughSupervisor runs one session of the real Pi through the
// supervisor in which the model asks for a grep of the workspace, and
// returns the sandbox's Info once it exited and Pi's output.
func grepThroughSupervisor(t *testing.T, native bool) (supervisor.Info, string) {
	e := newEnv(t,
		fakemodel.Turn{ToolCalls: []fakemodel.ToolCall{{Name: "grep", Arguments: map[string]any{"pattern": "NEEDLE_7f3c", "path": "notes"}}}},
		fakemodel.Text("found it"))
	e.settings = `{"packages":["/opt/pi/node_modules/pi-mcp-adapter"],"defaultTools":["+grep"]}`
	sc := e.scene(t, "pi-session", "")
	write(t, filepath.Join(sc.Workspace(), "notes", "needle.txt"), "the NEEDLE_7f3c line\n")
	// The workspace is the deployment user's, as a daemon's is: rg reads
	// the worktree's .git file (root's 0600 in the scene) for its ignore
	// rules, and reports it, and Pi the error, when it cannot.
	chownTree(t, sc.Workspace(), daemonUID, daemonUID)
	reg := sc.Registry
	if native {
		var err error
		if reg, err = testtree.MergePatch(reg, []byte(`{"deployments":{"host-alice":{"search":"native"}}}`)); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("/run", "paseo-e2e-search-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755) // the socket's directory is searchable by its group
	socket := filepath.Join(dir, "supervisor.sock")
	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: reg},
		Socket: socket, SocketGID: 0, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Listen(sctx) }()
	t.Cleanup(func() { cancel(); srv.Shutdown() })

	c := ctx(t)
	cl := dialSupervisor(t, socket)
	var in supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts}, &in); err != nil {
		t.Fatal(err)
	}
	id := in.Sandbox
	t.Cleanup(func() { _ = cl.Call(context.Background(), supervisor.Request{Op: "delete", Sandbox: id}, nil) })
	var att struct{ Epoch uint64 }
	if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: id}, &att); err != nil {
		t.Fatal(err)
	}
	tr := &stream{}
	line := `{"id":"g1","type":"prompt","message":"where is the needle?"}` + "\n"
	if err := cl.Call(c, supervisor.Request{Op: "write", Sandbox: id, Epoch: att.Epoch, InputID: "g1", Data: []byte(line)}, nil); err != nil {
		t.Fatal(err)
	}
	if !tr.until(t, cl, id, `"type":"agent_end"`, 120*time.Second) {
		t.Fatalf("Pi's turn did not end; its output ends: %q; stderr: %q", tr.tail(), tailOf(tr.Stderr.String(), 800))
	}
	if err := cl.Call(c, supervisor.Request{Op: "closeInput", Sandbox: id, Epoch: att.Epoch}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := cl.Call(c, supervisor.Request{Op: "inspect", Sandbox: id}, &in); err != nil {
			t.Fatal(err)
		}
		if in.Status == supervisor.StatusExited {
			return in, tr.Stdout.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox did not exit after its input closed: %+v", in)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
