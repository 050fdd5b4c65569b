package routeproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/policy/bundle"
)

const testModelKey = "sk-test-provider-key-0123456789"

var modelRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "/v1",
	Upstream: "https://llm.example.test:8443/v1", TokenRef: "alice/fake-llm", API: "openai-completions",
	Credential: "authorization-bearer", Requests: []string{"POST /chat/completions", "GET /models"}, Model: "fake-1"}

// modelWorld is a model route in front of the fake model over TLS, both on
// loopback; the route dials the fake model whatever address it asks for.
type modelWorld struct {
	fm    *fakemodel.Server
	proxy *Proxy
	url   string // the route, as Pi in the sandbox calls it
	key   atomic.Pointer[string]
	dials atomic.Int64
}

func newModelWorld(t testing.TB, upstream http.Handler, mod func(*ModelOptions)) *modelWorld {
	t.Helper()
	return newModelWorldFor(t, modelRoute, upstream, mod)
}

// newModelWorldFor is newModelWorld for another route (another API).
func newModelWorldFor(t testing.TB, route bundle.Route, upstream http.Handler, mod func(*ModelOptions)) *modelWorld {
	t.Helper()
	ca, err := fakemodel.NewTestCA("llm.example.test")
	if err != nil {
		t.Fatal(err)
	}
	w := &modelWorld{fm: fakemodel.New(fakemodel.Options{APIKey: testModelKey, Script: []fakemodel.Turn{fakemodel.Text("hello through the route")}})}
	k := testModelKey
	w.key.Store(&k)
	if upstream == nil {
		upstream = w.fm.Handler()
	}
	ul, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: upstream, TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Cert}}}
	go srv.ServeTLS(ul, "", "")
	t.Cleanup(func() { srv.Close() })
	o := ModelOptions{Roots: ca.Roots,
		Key: func() ([]byte, error) { return []byte(*w.key.Load()), nil },
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			w.dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, ul.Addr().String())
		}}
	if mod != nil {
		mod(&o)
	}
	w.proxy, err = NewModel(route, o)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.proxy.Serve(l)
	t.Cleanup(func() { w.proxy.Close() })
	w.url = "http://" + l.Addr().String() + "/v1"
	return w
}

// do sends one request as Pi would (the placeholder key, JSON) with edits.
func (w *modelWorld) do(t *testing.T, method, path, body string, edit func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, w.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body = http.NoBody
	}
	req.Header.Set("Authorization", "Bearer "+bundle.ModelRoutePlaceholder)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Stainless-Lang", "js")
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

const chatBody = `{"model":"fake-1","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// The route adds the real key, forwards over TLS to the provider's own
// name, rebuilds the headers, and streams the answer back.
func TestModelRouteAddsTheKey(t *testing.T) {
	w := newModelWorld(t, nil, nil)
	resp, body := w.do(t, "POST", "/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "data: [DONE]") || !strings.Contains(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("chat through the route: %d %q\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if resp, body := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 200 || !strings.Contains(body, "fake-1") {
		t.Fatalf("models through the route: %d %s", resp.StatusCode, body)
	}
	reqs := w.fm.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(reqs))
	}
	for _, r := range reqs {
		if !r.Authorized || !r.TLS || r.ServerName != "llm.example.test" {
			t.Errorf("%s %s: authorized %v, TLS %v, SNI %q; want the key, over TLS, to llm.example.test", r.Method, r.Path, r.Authorized, r.TLS, r.ServerName)
		}
		if slices.Contains(r.Headers, "X-Stainless-Lang") {
			t.Errorf("%s %s: the sandbox's own header reached the provider: %v", r.Method, r.Path, r.Headers)
		}
	}
	if got := w.proxy.Stats.Forwarded.Load(); got != 2 {
		t.Errorf("forwarded %d, want 2", got)
	}
}

// An SSE answer reaches the client event by event, not when it ends.
func TestModelRouteStreams(t *testing.T) {
	release := make(chan struct{})
	up := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(rw, "data: first\n\n")
		rw.(http.Flusher).Flush()
		<-release
		io.WriteString(rw, "data: [DONE]\n\n")
	})
	w := newModelWorld(t, up, nil)
	req, _ := http.NewRequest("POST", w.url+"/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+bundle.ModelRoutePlaceholder)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: first\n" {
			t.Errorf("first line %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Error("the first event did not pass before the stream ended")
	}
	close(release)
}

// A credential the sandbox brings is refused, whatever header it is in,
// and nothing reaches the provider.
func TestModelRouteRefusesOwnCredential(t *testing.T) {
	w := newModelWorld(t, nil, nil)
	for name, edit := range map[string]func(*http.Request){
		"real key as bearer":      func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testModelKey) },
		"placeholder and another": func(r *http.Request) { r.Header.Add("Authorization", "Bearer x") },
		"x-api-key":               func(r *http.Request) { r.Header.Set("X-Api-Key", testModelKey) },
		"api-key":                 func(r *http.Request) { r.Header.Set("Api-Key", testModelKey) },
		"goog":                    func(r *http.Request) { r.Header.Set("X-Goog-Api-Key", testModelKey) },
		"cookie":                  func(r *http.Request) { r.Header.Set("Cookie", "session=1") },
		"proxy-authorization":     func(r *http.Request) { r.Header.Set("Proxy-Authorization", "Basic eDp5") },
		"basic":                   func(r *http.Request) { r.Header.Set("Authorization", "Basic eDp5") },
	} {
		if resp, _ := w.do(t, "POST", "/chat/completions", chatBody, edit); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, resp.StatusCode)
		}
	}
	if n := len(w.fm.Requests()); n != 0 || w.dials.Load() != 0 {
		t.Errorf("the provider was contacted (%d requests, %d dials)", n, w.dials.Load())
	}
}

// Only the profile's requests for the API are forwarded: another path on
// the provider's host (files, keys, another account's), another method, a
// query, an escape or a path outside the prefix is refused before any
// connection to the provider.
func TestModelRouteScope(t *testing.T) {
	w := newModelWorld(t, nil, nil)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/files", 404}, {"POST", "/files", 404}, {"DELETE", "/models", 405}, {"POST", "/models", 405},
		{"GET", "/chat/completions", 405}, {"POST", "/chat/completions?api-version=1", 404},
		{"POST", "/chat%2Fcompletions", 404}, {"POST", "/chat/completions/", 404}, {"POST", "/../v2/chat/completions", 404},
		{"GET", "/models/fake-1", 404}, {"POST", "/organization/api_keys", 404},
	} {
		body := chatBody
		if c.method == "GET" || c.method == "DELETE" {
			body = ""
		}
		if resp, _ := w.do(t, c.method, c.path, body, nil); resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
	if n := len(w.fm.Requests()); n != 0 || w.dials.Load() != 0 {
		t.Errorf("the provider was contacted (%d requests, %d dials)", n, w.dials.Load())
	}
	if got := w.proxy.Stats.OutOfScope.Load(); got != 11 {
		t.Errorf("outOfScope %d, want 11", got)
	}
}

// Bodies are one strict JSON object within the bound, re-encoded; a GET
// has none.
func TestModelRouteBodies(t *testing.T) {
	w := newModelWorld(t, nil, func(o *ModelOptions) { o.Limits.MaxBody = 4096 })
	big := `{"model":"fake-1","messages":[{"role":"user","content":"` + strings.Repeat("a", 5000) + `"}]}`
	for name, c := range map[string]struct {
		body string
		edit func(*http.Request)
		want int
	}{
		"too large":       {big, nil, 413},
		"too large chunk": {big, func(r *http.Request) { r.ContentLength = -1 }, 413},
		"not json":        {`{"model":`, nil, 400},
		"duplicate key":   {`{"model":"a","model":"b"}`, nil, 400},
		"an array":        {`[1]`, nil, 400},
		"text/plain":      {chatBody, func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, 415},
		"latin1":          {chatBody, func(r *http.Request) { r.Header.Set("Content-Type", "application/json; charset=latin1") }, 415},
		"gzip":            {chatBody, func(r *http.Request) { r.Header.Set("Content-Encoding", "gzip") }, 415},
	} {
		if resp, _ := w.do(t, "POST", "/chat/completions", c.body, c.edit); resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, c.want)
		}
	}
	if resp, _ := w.do(t, "GET", "/models", "x", nil); resp.StatusCode != 400 {
		t.Errorf("GET with a body: %d, want 400", resp.StatusCode)
	}
	if n := len(w.fm.Requests()); n != 0 {
		t.Errorf("%d requests reached the provider", n)
	}
	// What is forwarded is the decoded value re-encoded: the spacing the
	// sandbox sent does not survive.
	if resp, _ := w.do(t, "POST", "/chat/completions", "{ \"model\" : \"fake-1\", \"stream\": false, \"messages\": [] }", nil); resp.StatusCode != 200 {
		t.Fatalf("plain request: %d", resp.StatusCode)
	}
	if got := string(w.fm.Requests()[0].Body); got != `{"model":"fake-1","stream":false,"messages":[]}` {
		t.Errorf("forwarded body %q, want the canonical re-encoding", got)
	}
}

// A key rotated in the secrets is the one the next request carries;
// nothing restarts.
func TestModelRouteKeyRotation(t *testing.T) {
	w := newModelWorld(t, nil, nil)
	if resp, _ := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 200 {
		t.Fatalf("before rotation: %d", resp.StatusCode)
	}
	rotated := "sk-rotated-provider-key-987654"
	w.fm.SetAPIKey(rotated)
	if resp, _ := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 401 {
		t.Fatalf("the provider rotated, the secret not yet: %d, want the provider's 401", resp.StatusCode)
	}
	w.key.Store(&rotated)
	if resp, _ := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 200 {
		t.Fatalf("after rotation: %d", resp.StatusCode)
	}
	empty := ""
	w.key.Store(&empty)
	if resp, _ := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 503 {
		t.Fatalf("no key: %d, want 503", resp.StatusCode)
	}
}

// The provider's certificate is verified against the route's roots and
// the provider's name: the system store does not hold the test CA, and a
// certificate for another name is refused; either way the key is not
// sent.
func TestModelRouteVerifiesTLS(t *testing.T) {
	w := newModelWorld(t, nil, func(o *ModelOptions) { o.Roots = nil })
	if resp, _ := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 502 {
		t.Errorf("system roots against the test CA: %d, want 502", resp.StatusCode)
	}
	other, err := fakemodel.NewTestCA("other.example.test")
	if err != nil {
		t.Fatal(err)
	}
	w2 := newModelWorld(t, nil, func(o *ModelOptions) { o.Roots = other.Roots })
	if resp, _ := w2.do(t, "GET", "/models", "", nil); resp.StatusCode != 502 {
		t.Errorf("another CA: %d, want 502", resp.StatusCode)
	}
	if len(w.fm.Requests())+len(w2.fm.Requests()) != 0 {
		t.Error("a request reached a provider whose certificate failed")
	}
}

// A redirect is answered to the sandbox, never followed by the route.
func TestModelRouteFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int64
	up := http.NewServeMux()
	up.HandleFunc("/v1/models", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "/v1/files", http.StatusFound)
	})
	up.HandleFunc("/v1/files", func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) })
	w := newModelWorld(t, up, nil)
	if resp, _ := w.do(t, "GET", "/models", "", func(r *http.Request) {}); resp.StatusCode != 404 {
		// The client follows the Location to the route, which refuses it.
		t.Errorf("redirect: %d, want the route's 404 for the followed path", resp.StatusCode)
	}
	if elsewhere.Load() != 0 {
		t.Error("the redirect target was reached")
	}
}

// A key source error names no value and refuses the request.
func TestModelRouteKeyErrors(t *testing.T) {
	w := newModelWorld(t, nil, func(o *ModelOptions) {
		o.Key = func() ([]byte, error) { return nil, errors.New("no such secret") }
	})
	if resp, body := w.do(t, "GET", "/models", "", nil); resp.StatusCode != 503 || strings.Contains(body, "secret") {
		t.Errorf("key error: %d %q", resp.StatusCode, body)
	}
}
