package gateway

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
)

const (
	testKey   = "sk-gateway-test-key-0123456789"
	testToken = "mcp-bearer-0123456789abcdef"
	chatBody  = `{"model":"fake-1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
)

// compileBundle compiles the reference facts (testdata/base) with JSON
// merge patches, beneath a host tree of the test's own, as `paseo-policy
// compile --resolve-root` does, and returns the bundle's directory.
func compileBundle(t *testing.T, factsPatch, registryPatch string) string {
	t.Helper()
	base := filepath.Join("..", "..", "testdata", "base")
	read := func(name, patch string) []byte {
		data, err := os.ReadFile(filepath.Join(base, name))
		if err != nil {
			t.Fatal(err)
		}
		if patch != "" {
			if data, err = testtree.MergePatch(data, []byte(patch)); err != nil {
				t.Fatal(err)
			}
		}
		return data
	}
	host := filepath.Join(t.TempDir(), "host")
	cleanup, err := testtree.Build(host, string(read("tree.txt", "")))
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	res, diags := compiler.Compile(compiler.Inputs{
		Facts:    schema.Input{Name: "facts.json", Data: read("facts.json", factsPatch)},
		Registry: schema.Input{Name: "registry.json", Data: read("registry.json", registryPatch)},
	}, compiler.Options{Resolver: pathsafe.Resolver{Base: host}})
	if len(diags) > 0 {
		t.Fatalf("compile: %v", diags)
	}
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := res.Files.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// secretFile writes a credential file with mode.
func secretFile(t *testing.T, value string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// loopbackIP is an address of 127/8 of this test's own, so the routes'
// fixed ports collide with no other test listening on 127.0.0.1.
func loopbackIP(t *testing.T) netip.Addr {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	v := n.Int64()
	return netip.AddrFrom4([4]byte{127, 37, byte(v >> 8), byte(v) | 1})
}

// world is a gateway in front of the fake model (TLS, a test CA, on
// loopback) and a stand-in of the daemon's MCP endpoint.
type world struct {
	fm      *fakemodel.Server
	modelLn net.Listener
	ca      *fakemodel.TestCA
	daemon  *daemon
	bundle  string
	gw      *Gateway
	opts    Options
}

// daemon records what reached the daemon's MCP endpoint.
type daemon struct {
	mu   sync.Mutex
	seen []seenCall
	url  string
}

// seenCall is one request the daemon got: its bearer, caller and body.
type seenCall struct{ auth, caller, body string }

func (d *daemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	d.seen = append(d.seen, seenCall{r.Header.Get("Authorization"), r.URL.Query().Get("callerAgentId"), string(b)})
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`)
}

func (d *daemon) requests() []seenCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]seenCall(nil), d.seen...)
}

// newWorld starts the fake model and the daemon stand-in, compiles the
// reference bundle with the MCP route pointed at the stand-in, and
// returns the options a gateway for it takes (not yet started).
func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{daemon: &daemon{}}
	var err error
	if w.ca, err = fakemodel.NewTestCA("llm.example.test"); err != nil {
		t.Fatal(err)
	}
	w.fm = fakemodel.New(fakemodel.Options{APIKey: testKey, Script: []fakemodel.Turn{fakemodel.Text("hello through the gateway")}})
	if w.modelLn, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go w.fm.ServeTLS(w.modelLn, w.ca.Cert)
	t.Cleanup(func() { w.fm.Close() })

	dl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: w.daemon}
	go srv.Serve(dl)
	t.Cleanup(func() { srv.Close() })
	w.daemon.url = "http://" + dl.Addr().String() + "/mcp/agents"
	w.bundle = compileBundle(t, `{"mcp":{"agentsURL":"`+w.daemon.url+`"}}`, "")
	w.opts = Options{Bundle: w.bundle, Listen: loopbackIP(t), ModelRoots: w.ca.Roots,
		ModelKeyFile: secretFile(t, testKey, 0o400), MCPTokenFile: secretFile(t, testToken, 0o440),
		Dial: w.dialModel}
	return w
}

// dialModel reaches the fake model for the provider's own name only.
func (w *world) dialModel(ctx context.Context, network, addr string) (net.Conn, error) {
	if addr != "llm.example.test:8443" {
		return nil, fmt.Errorf("dial %s: not the provider", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, w.modelLn.Addr().String())
}

func (w *world) start(t *testing.T) {
	t.Helper()
	gw, err := Start(w.opts)
	if err != nil {
		t.Fatal(err)
	}
	w.gw = gw
	t.Cleanup(func() {
		if err := gw.Close(); err != nil {
			t.Error(err)
		}
	})
}

// route is the URL the agent's Pod calls for a route.
func (w *world) route(t *testing.T, purpose string) string {
	t.Helper()
	for _, r := range w.gw.Routes {
		if r.Route.Purpose == purpose {
			return "http://" + r.Addr.String() + r.Route.Path
		}
	}
	t.Fatalf("no %s route served", purpose)
	return ""
}

// do sends one request as Pi in the Pod does (the placeholder key).
func do(t *testing.T, method, u, body string, edit func(*http.Request)) (*http.Response, string) {
	t.Helper()
	var rd io.Reader = http.NoBody
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bundle.ModelRoutePlaceholder)
	req.Header.Set("Content-Type", "application/json")
	if edit != nil {
		edit(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

// The gateway serves the bundle's model route: the Pod's request, with
// the placeholder, reaches the provider with the key added, over TLS
// verified against the provider's name, and the answer streams back.
func TestModelRouteAddsTheKey(t *testing.T) {
	w := newWorld(t)
	w.start(t)
	resp, body := do(t, "POST", w.route(t, "model")+"/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `"content":"hello thr"`) || !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("chat through the gateway: %d\n%s", resp.StatusCode, body)
	}
	reqs := w.fm.Requests()
	if len(reqs) != 1 || !reqs[0].Authorized || !reqs[0].TLS || reqs[0].ServerName != "llm.example.test" {
		t.Fatalf("the provider saw %+v; want one authorized TLS request for llm.example.test", reqs)
	}
	if strings.Contains(body, testKey) {
		t.Error("the answer carries the key")
	}
}

// Attacks from the Pod on the model route, each with its control: a
// plain reverse proxy that adds the key and has no scope (what a gateway
// without routeproxy would be) forwards the same request to the provider
// with the key.
func TestModelRouteAttacks(t *testing.T) {
	w := newWorld(t)
	w.start(t)
	u, _ := url.Parse("https://llm.example.test:8443")
	naive := httputil.NewSingleHostReverseProxy(u)
	naive.Transport = &http.Transport{DialContext: w.dialModel, TLSClientConfig: &tls.Config{RootCAs: w.ca.Roots, ServerName: "llm.example.test"}}
	director := naive.Director
	naive.Director = func(r *http.Request) {
		director(r)
		r.Host = u.Host
		r.Header.Set("Authorization", "Bearer "+testKey)
	}
	nl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nsrv := &http.Server{Handler: naive}
	go nsrv.Serve(nl)
	t.Cleanup(func() { nsrv.Close() })

	gateway := w.route(t, "model")
	control := "http://" + nl.Addr().String() + "/v1"
	for _, c := range []struct {
		name, method, path, body string
		edit                     func(*http.Request)
	}{
		{"another path on the provider", "GET", "/files", "", nil},
		{"another API's path", "POST", "/responses", `{"model":"fake-1","input":"hi"}`, nil},
		{"escape the prefix", "POST", "/../v2/chat/completions", chatBody, nil},
		{"another model", "POST", "/chat/completions", strings.Replace(chatBody, "fake-1", "gpt-expensive", 1), nil},
		{"its own key", "POST", "/chat/completions", chatBody, func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk-planted") }},
		{"another host", "POST", "/chat/completions", chatBody, func(r *http.Request) { r.Host = "metadata.google.internal" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(w.fm.Requests())
			resp, body := do(t, c.method, gateway+c.path, c.body, c.edit)
			if c.name == "another host" {
				// The Host header names nothing the route uses: it goes to
				// the route's provider or nowhere, never to the Host named.
				if resp.StatusCode == 200 {
					if reqs := w.fm.Requests(); len(reqs) != before+1 || reqs[len(reqs)-1].ServerName != "llm.example.test" {
						t.Fatalf("forwarded elsewhere than the provider: %+v", reqs[before:])
					}
					return
				}
			}
			if resp.StatusCode < 400 {
				t.Fatalf("gateway: %d, want a refusal\n%s", resp.StatusCode, body)
			}
			if n := len(w.fm.Requests()); n != before {
				t.Fatalf("the provider saw %d requests through the gateway", n-before)
			}
			if strings.Contains(body, testKey) {
				t.Fatal("the refusal carries the key")
			}
			if c.name == "another host" || c.name == "its own key" || c.name == "escape the prefix" {
				return // the control's proxy would pass these on as well; the ones below show it
			}
			do(t, c.method, control+c.path, c.body, c.edit)
			reqs := w.fm.Requests()
			if len(reqs) != before+1 || !reqs[len(reqs)-1].Authorized {
				t.Fatalf("control: the unscoped proxy did not forward the request with the key: %+v", reqs[before:])
			}
		})
	}
}

// The MCP route: the daemon gets the tools in scope as the agent's own
// caller, with the bearer the gateway added; a tool outside the scope,
// another caller, or a bearer of the Pod's own never reach it. Control:
// the same calls through a proxy without the scope reach the daemon.
func TestMCPRouteScope(t *testing.T) {
	w := newWorld(t)
	w.start(t)
	mcp := w.route(t, "mcp")
	call := func(tool string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":{}}}`
	}
	noBearer := func(r *http.Request) { r.Header.Del("Authorization") }
	if resp, body := do(t, "POST", mcp+"?callerAgentId=agent-7f3c", call("list_agents"), noBearer); resp.StatusCode != 200 {
		t.Fatalf("a tool in scope: %d %s", resp.StatusCode, body)
	}
	seen := w.daemon.requests()
	if len(seen) != 1 || seen[0].auth != "Bearer "+testToken || seen[0].caller != "agent-7f3c" || !strings.Contains(seen[0].body, "list_agents") {
		t.Fatalf("the daemon saw %d requests, want one with the bearer for agent-7f3c", len(seen))
	}
	for name, c := range map[string]struct {
		query, body string
		edit        func(*http.Request)
	}{
		"a tool outside the scope": {"?callerAgentId=agent-7f3c", call("create_agent"), noBearer},
		"another agent's caller":   {"?callerAgentId=agent-other", call("list_agents"), noBearer},
		"a bearer of its own":      {"?callerAgentId=agent-7f3c", call("list_agents"), func(r *http.Request) { r.Header.Set("Authorization", "Bearer planted") }},
	} {
		resp, body := do(t, "POST", mcp+c.query, c.body, c.edit)
		if resp.StatusCode == 200 && !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want a refusal", name, resp.StatusCode, body)
		}
	}
	if seen := w.daemon.requests(); len(seen) != 1 {
		t.Fatalf("refused calls reached the daemon: %d requests", len(seen))
	}
	// Control: an unscoped proxy passes the out-of-scope tool on.
	du, _ := url.Parse(w.daemon.url)
	naive := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: du.Host})
	nl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nsrv := &http.Server{Handler: naive}
	go nsrv.Serve(nl)
	t.Cleanup(func() { nsrv.Close() })
	do(t, "POST", "http://"+nl.Addr().String()+"/mcp/agents?callerAgentId=agent-7f3c", call("create_agent"), noBearer)
	if seen := w.daemon.requests(); len(seen) != 2 || !strings.Contains(seen[1].body, "create_agent") {
		t.Fatal("control: the unscoped proxy did not pass the out-of-scope tool on")
	}
}

// listening reports whether anything accepts on the route ports.
func listening(ip netip.Addr, ports ...int) bool {
	for _, p := range ports {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, uint16(p)).String(), time.Second)
		if err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// Every refusal at start has its code and path, carries no credential,
// and leaves nothing listening.
func TestRefusals(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(w.opts.ModelKeyFile, link); err != nil {
		t.Fatal(err)
	}
	linkedDir := filepath.Join(dir, "linked")
	if err := os.Symlink(filepath.Dir(w.opts.ModelKeyFile), linkedDir); err != nil {
		t.Fatal(err)
	}
	tampered := compileBundle(t, `{"mcp":{"agentsURL":"`+w.daemon.url+`"}}`, "")
	eg := filepath.Join(tampered, bundle.EgressFile)
	data, err := os.ReadFile(eg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(eg, []byte(strings.Replace(string(data), `"tools/call"`, `"tools/call", "resources/read"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	noNet := compileBundle(t, "", `{"network":{"mode":"none"}}`)
	noMCP := compileBundle(t, `{"mcp":null,"launch":{"mcpConfig":null}}`, "")
	busy, err := net.Listen("tcp", netip.AddrPortFrom(w.opts.Listen, 18080).String())
	if err != nil {
		t.Fatal(err)
	}
	busyIP := w.opts.Listen
	defer busy.Close()

	for name, c := range map[string]struct {
		edit func(*Options)
		code diag.Code
		path string
	}{
		"a tampered bundle":             {func(o *Options) { o.Bundle = tampered }, diag.GatewayBundle, "bundle"},
		"no bundle":                     {func(o *Options) { o.Bundle = filepath.Join(dir, "none") }, diag.GatewayBundle, "bundle"},
		"a bundle without routes":       {func(o *Options) { o.Bundle = noNet; o.ModelKeyFile, o.MCPTokenFile = "", "" }, diag.GatewayBundle, "egress.routes"},
		"no model key":                  {func(o *Options) { o.ModelKeyFile = "" }, diag.GatewaySecret, "options.modelKeyFile"},
		"no MCP token":                  {func(o *Options) { o.MCPTokenFile = "" }, diag.GatewaySecret, "options.mcpTokenFile"},
		"a token for no route":          {func(o *Options) { o.Bundle = noMCP }, diag.GatewaySecret, "options.mcpTokenFile"},
		"a key file that is a link":     {func(o *Options) { o.ModelKeyFile = link }, diag.GatewaySecret, "options.modelKeyFile"},
		"a key file behind a link":      {func(o *Options) { o.ModelKeyFile = filepath.Join(linkedDir, "secret") }, diag.GatewaySecret, "options.modelKeyFile"},
		"a world-readable key file":     {func(o *Options) { o.ModelKeyFile = secretFile(t, testKey, 0o444) }, diag.GatewaySecret, "options.modelKeyFile"},
		"a group-writable token file":   {func(o *Options) { o.MCPTokenFile = secretFile(t, testToken, 0o460) }, diag.GatewaySecret, "options.mcpTokenFile"},
		"a key file that is a dir":      {func(o *Options) { o.ModelKeyFile = dir }, diag.GatewaySecret, "options.modelKeyFile"},
		"a relative key file":           {func(o *Options) { o.ModelKeyFile = "secret" }, diag.GatewaySecret, "options.modelKeyFile"},
		"a key that is no token":        {func(o *Options) { o.ModelKeyFile = secretFile(t, "sk key with spaces", 0o400) }, diag.GatewaySecret, "options.modelKeyFile"},
		"a key over a token's size":     {func(o *Options) { o.ModelKeyFile = secretFile(t, strings.Repeat("k", 5000), 0o400) }, diag.GatewaySecret, "options.modelKeyFile"},
		"a provider on loopback":        {func(o *Options) { o.Dial = nil; o.Resolve = resolveTo("127.0.0.1") }, diag.GatewayResolve, "egress.routes.model.upstream"},
		"a provider on the metadata IP": {func(o *Options) { o.Dial = nil; o.Resolve = resolveTo("169.254.169.254") }, diag.GatewayResolve, "egress.routes.model.upstream"},
		"no listen address":             {func(o *Options) { o.Listen = netip.Addr{} }, diag.GatewayListen, "options.listen"},
		"a route port in use":           {func(o *Options) { o.Listen = busyIP }, diag.GatewayListen, "egress.routes.model.port"},
	} {
		t.Run(name, func(t *testing.T) {
			o := w.opts
			o.Listen = loopbackIP(t)
			c.edit(&o)
			gw, err := Start(o)
			if err == nil {
				gw.Close()
				t.Fatal("started")
			}
			var ge *Error
			if !errors.As(err, &ge) || !errors.Is(err, c.code) || ge.Path != c.path {
				t.Fatalf("error %v (%T), want %s at %s", err, err, c.code, c.path)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), "kkkk") {
				t.Fatalf("the refusal carries a credential: %v", err)
			}
			if o.Listen != busyIP && o.Listen.IsValid() && listening(o.Listen, 18080, mcpPort(t, w.daemon.url)) {
				t.Fatal("a route is listening after a refused start")
			}
		})
	}
	// Control: the same options, unedited, start.
	o := w.opts
	o.Listen = loopbackIP(t)
	gw, err := Start(o)
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
}

func resolveTo(a string) func(context.Context, string) ([]netip.Addr, error) {
	return func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr(a)}, nil }
}

func mcpPort(t *testing.T, u string) int {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(p.Port(), &n)
	return n
}

// docs/kubernetes.md's gateway code table is diag/codes.go's PP-GATEWAY-
// codes, each once.
func TestGatewayCodesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../diag/codes.go")
	if err != nil {
		t.Fatal(err)
	}
	codes := []diag.Code{diag.GatewayBundle, diag.GatewaySecret, diag.GatewayResolve, diag.GatewayListen}
	if n := strings.Count(string(src), `Code = "PP-GATEWAY-`); n != len(codes) {
		t.Errorf("diag/codes.go defines %d PP-GATEWAY- codes, this test knows %d", n, len(codes))
	}
	for _, c := range codes {
		if n := strings.Count(string(doc), "| `"+string(c)+"` |"); n != 1 {
			t.Errorf("docs/kubernetes.md has %d table rows for %s, want 1", n, c)
		}
	}
}
