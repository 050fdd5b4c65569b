package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// tokenDaemon is the daemon's MCP listener across restarts: it accepts
// only the current run's bearer and records every bearer it was shown.
type tokenDaemon struct {
	mu      sync.Mutex
	current string
	seen    []string
}

func (d *tokenDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	auth := r.Header.Get("Authorization")
	d.seen = append(d.seen, auth)
	ok := auth == "Bearer "+d.current
	d.mu.Unlock()
	if !ok {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	var m struct{ ID json.RawMessage }
	_ = json.Unmarshal(body, &m)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"agents-listed"}]}}`, m.ID)
}

func (d *tokenDaemon) restart(token string) {
	d.mu.Lock()
	d.current = token
	d.mu.Unlock()
}

// routeScript stands in for Pi: for every input line it calls an MCP tool
// through the route named in its MCP config, as Pi's adapter would (no
// bearer of its own), and prints the answer.
const routeScript = `#!/bin/busybox sh
while [ $# -gt 0 ]; do [ "$1" = --mcp-config ] && CFG=$2; shift; done
URL=$(/bin/busybox sed -n 's/.*"url": "\(.*\)",/\1/p' $CFG)
while read -r line; do
  /bin/busybox wget -q -O - --header 'Content-Type: application/json' --post-data '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{}}}' "$URL" 2>&1
  echo " call=$line"
done
`

// The daemon hands its MCP token at createSandbox; it restarts with a new
// one (the old is refused by its listener from then on); it reattaches
// with the new one, and the sandbox's next call carries it. The sandbox
// never sends a token, and none is written anywhere in the state root.
func TestMCPTokenHandedOverAndRotated(t *testing.T) {
	const tokA, tokB = "tok-A-4b1d9e2f", "tok-B-7c30a81e"
	d := &tokenDaemon{current: tokA}
	up := httptest.NewServer(d)
	t.Cleanup(up.Close)
	port := up.Listener.Addr().(*net.TCPAddr).Port
	world := testnet.New(t)
	model := world.Host("model")

	script := filepath.Join(t.TempDir(), "pi")
	if err := os.WriteFile(script, []byte(routeScript), 0o755); err != nil {
		t.Fatal(err)
	}
	sc := testbundle.New(t, testbundle.Options{
		Argv:          []string{"/usr/local/bin/pi", "--mode", "rpc"},
		RootfsFiles:   map[string]string{"/usr/local/bin/pi": script},
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"deployments":{"host-alice":{"peers":{"uids":[%d],"gids":[4243]}}}}`, allowedUID),
		FactsPatch:    fmt.Sprintf(`{"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, port),
	})
	dir, err := os.MkdirTemp("/run", "paseo-supervisor-test-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fixture{sc: sc, socket: filepath.Join(dir, "supervisor.sock")}
	f.cfg = Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry}, Socket: f.socket, SocketGID: socketGID,
		StateRoot: sc.State, RunscPath: sc.Runsc, Uplink: world.Uplink,
		Resolve: func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{model.Addr}, nil },
		// The token is not a secret of the deployment any more: a lookup
		// of its ref would be a regression.
		Secrets: func(_, ref string) ([]byte, error) {
			if ref == "paseo/mcp-token" {
				return nil, fmt.Errorf("the supervisor looked up the MCP token ref")
			}
			return []byte("test-key"), nil
		}}
	f.sweepHolders(t)
	f.start(t)

	c := f.dial(t)
	// A malformed token at createSandbox is refused, not echoed, and
	// starts nothing.
	if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts, MCPToken: "tok-zq7 x"}, nil); !isCode(err, rpcerr.Malformed) || strings.Contains(err.Error(), "zq7") {
		t.Fatalf("a malformed token at create: %v", err)
	}
	var none []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &none); err != nil || len(none) != 0 {
		t.Fatalf("a refused create left %v (%v)", none, err)
	}
	var in Info
	if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts, MCPToken: tokA}, &in); err != nil {
		t.Fatalf("createSandbox: %v", err)
	}
	tr := &transcript{}
	attach := func(c *Client, token string) uint64 {
		var att struct{ Epoch uint64 }
		if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor, MCPToken: token}, &att); err != nil {
			t.Fatalf("attach: %v", err)
		}
		return att.Epoch
	}
	call := func(c *Client, epoch uint64, n int) string {
		line := fmt.Sprintf("%d", n)
		if err := c.Call(tctx(t), Request{Op: "write", Sandbox: in.Sandbox, Epoch: epoch, InputID: "in-" + line, Data: []byte(line + "\n")}, nil); err != nil {
			t.Fatal(err)
		}
		from := tr.Stdout.Len()
		if !readUntil(t, c, in.Sandbox, tr, "call="+line+"\n", 30*time.Second) {
			t.Fatalf("call %d never answered: %q", n, tr.Stdout.String())
		}
		return tr.Stdout.String()[from:]
	}

	epoch := attach(c, "")
	if out := call(c, epoch, 1); !strings.Contains(out, "agents-listed") {
		t.Errorf("with the token from createSandbox: %q", out)
	}
	// The daemon restarts: a new run, a new token; the sandbox still
	// runs. Until the daemon reattaches, the proxy has the old token,
	// which the new daemon refuses.
	d.restart(tokB)
	if out := call(c, epoch, 2); strings.Contains(out, "agents-listed") || !strings.Contains(out, "401") {
		t.Errorf("with the old token after the restart: %q", out)
	}
	c.Close()
	c = f.dial(t)
	// A malformed token is refused and not echoed.
	bad := "tok\nsplit"
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor, MCPToken: bad}, nil); !isCode(err, rpcerr.Malformed) || strings.Contains(err.Error(), "split") {
		t.Errorf("a malformed token: %v", err)
	}
	epoch = attach(c, tokB)
	if out := call(c, epoch, 3); !strings.Contains(out, "agents-listed") {
		t.Errorf("after the reattach with the new token: %q", out)
	}
	d.mu.Lock()
	seen := fmt.Sprint(d.seen)
	d.mu.Unlock()
	if want := fmt.Sprintf("[Bearer %s Bearer %s Bearer %s]", tokA, tokA, tokB); seen != want {
		t.Errorf("the daemon saw %s, want %s", seen, want)
	}
	// Neither token is in any file of the state (bundles, records, holder
	// logs) while the sandbox runs.
	_ = filepath.WalkDir(sc.State, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, tok := range []string{tokA, tokB} {
			if strings.Contains(string(b), tok) {
				t.Errorf("%s holds a token", p)
			}
		}
		return nil
	})
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
}
