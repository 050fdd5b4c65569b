package routeproxy

import (
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// The azure-openai-responses route: the key in api-key, the Responses
// body policy, ?api-version=v1 as listed and no other query. Pi's bodies
// are recorded from pi-ai's own client (testdata/record-azure.mjs) for Pi
// 0.84.2 and 1.6.0.

var azureRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "/openai/v1",
	Upstream: "https://llm.example.test:8443/openai/v1", TokenRef: "alice/k", API: "azure-openai-responses",
	Credential: "api-key", Model: "gpt-5.4", Requests: []string{"POST /responses?api-version=v1"}}

const azurePath = "/responses?api-version=v1"

// azureHeaders are the headers the AzureOpenAI client sends with Pi's request.
func azureHeaders(r *http.Request) {
	r.Header.Del("Authorization")
	r.Header.Set("Api-Key", bundle.ModelRoutePlaceholder)
	r.Header.Set("Accept", "application/json")
}

func azureWorld(t *testing.T, rt bundle.Route, rec http.Handler) *modelWorld {
	w := newModelWorldFor(t, rt, rec, nil)
	w.url = strings.TrimSuffix(w.url, "/v1") + "/openai/v1"
	return w
}

func TestModelRouteAzure(t *testing.T) {
	// pi-ai's client's bodies and the real Pi's (e2e
	// TestPiModelRouteAzure, model fake-1), each with its model.
	for _, pb := range apiBodies(t, "azure-openai-responses", 6) {
		rt := azureRoute
		rt.Model = pb.model
		rec := &googleRecorder{}
		w := azureWorld(t, rt, rec)
		if resp, out := w.do(t, "POST", azurePath, string(pb.body), azureHeaders); resp.StatusCode != 200 {
			t.Fatalf("Pi's %s refused: %d %s", pb.name, resp.StatusCode, out)
		}
		sent := sendInjected(t, w, pb, injections["openai-responses"], azurePath, azureHeaders, nil)
		got := rec.all()
		if len(got) != 1 {
			t.Fatalf("%s: the provider saw %d requests of %d sent, want only Pi's own", pb.name, len(got), sent+1)
		}
		g := got[0]
		if g.path != "/openai/v1"+azurePath || g.header.Get("Api-Key") != testModelKey || len(g.header.Values("Api-Key")) != 1 || g.header.Get("Authorization") != "" {
			t.Errorf("%s: provider got %s with %v", pb.name, g.path, g.header)
		}
		for _, inj := range injections["openai-responses"] {
			if strings.Contains(g.body, inj.token) {
				t.Errorf("%s: %q reached the provider", pb.name, inj.token)
			}
		}
	}
}

// Other queries (another api-version, none), other paths and another
// credential never reach the provider; a key the sandbox puts in api-key
// is refused. Control: Pi's own request passes.
func TestModelRouteAzureScope(t *testing.T) {
	rec := &googleRecorder{}
	w := azureWorld(t, azureRoute, rec)
	body := `{"model":"gpt-5.4","input":"hi","stream":true,"store":false}`
	for _, c := range []struct {
		name, path string
		edit       func(*http.Request)
		want       int
	}{
		{"other api-version", "/responses?api-version=2025-04-01-preview", azureHeaders, 404},
		{"no api-version", "/responses", azureHeaders, 404},
		{"deployments path", "/deployments/gpt-5.4/chat/completions?api-version=v1", azureHeaders, 404},
		{"files", "/files?api-version=v1", azureHeaders, 404},
		{"real key", azurePath, func(r *http.Request) { azureHeaders(r); r.Header.Set("Api-Key", "0123456789abcdef0123456789abcdef") }, 403},
		{"bearer", azurePath, func(r *http.Request) { azureHeaders(r); r.Header.Set("Authorization", "Bearer loot") }, 403},
		{"other model", azurePath, azureHeaders, 0},
	} {
		b := body
		if c.want == 0 {
			b, c.want = strings.Replace(body, "gpt-5.4", "gpt-other", 1), 403
		}
		if resp, out := w.do(t, "POST", c.path, b, c.edit); resp.StatusCode != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, out, c.want)
		}
	}
	if n := len(rec.all()); n != 0 {
		t.Fatalf("the provider saw %d requests", n)
	}
	if resp, out := w.do(t, "POST", azurePath, body, azureHeaders); resp.StatusCode != 200 || len(rec.all()) != 1 {
		t.Fatalf("control: %d %s", resp.StatusCode, out)
	}
}

// An upstream that echoes the api-key it got (a header, the body, base64)
// hands the sandbox none of it. Control: the echo holds the key.
func TestModelRouteAzureScrubsTheKey(t *testing.T) {
	const key = "0123456789abcdef0123456789abcdef"
	up := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Api-Key")
		rw.Header().Set("Content-Type", "application/json")
		rw.Header().Set("X-Echo", got)
		rw.WriteHeader(http.StatusUnauthorized)
		io.WriteString(rw, `{"error":{"code":"401","message":"Access denied due to invalid subscription key `+got+` (`+base64.StdEncoding.EncodeToString([]byte(got))+`)"}}`)
	})
	w := azureWorld(t, azureRoute, up)
	k := key
	w.key.Store(&k)
	resp, out := w.do(t, "POST", azurePath, `{"model":"gpt-5.4","input":"hi","stream":true,"store":false}`, azureHeaders)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(out, "Access denied") {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	b64 := base64.StdEncoding.EncodeToString([]byte(key))
	if strings.Contains(out, key) || strings.Contains(out, b64[:len(b64)-4]) || strings.Contains(resp.Header.Get("X-Echo"), key[4:]) {
		t.Errorf("the key reached the sandbox: %s %v", out, resp.Header)
	}
	rec := &httpRecorder{header: http.Header{}}
	req, _ := http.NewRequest("POST", "/", nil)
	req.Header.Set("Api-Key", key)
	up.ServeHTTP(rec, req)
	if !strings.Contains(rec.body.String(), key) {
		t.Fatal("control: the echoing provider does not echo the key")
	}
}
