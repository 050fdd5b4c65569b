package routeproxy

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// The google-generative-ai route: the key in x-goog-api-key, the model
// in the path (the route's own and no other), ?alt=sse as listed, and
// the body policy of apis.go. Pi's bodies are recorded from pi-ai's own
// client (testdata/record-google.mjs) for Pi 0.84.2 and 1.6.0.

var googleRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "/v1beta",
	Upstream: "https://llm.example.test:8443/v1beta", TokenRef: "alice/k", API: "google-generative-ai",
	Credential: "x-goog-api-key", Model: "gemini-2.5-flash",
	Requests: []string{"POST /models/{model}:streamGenerateContent?alt=sse"}}

// googleRecorder records what reaches the provider, query included.
type googleRecorder struct {
	mu   sync.Mutex
	reqs []recorded
}

func (rc *googleRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, recorded{r.URL.RequestURI(), r.Header.Clone(), string(b)})
	rc.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"hi\"}]},\"finishReason\":\"STOP\"}]}\r\n\r\n")
}

func (rc *googleRecorder) all() []recorded {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]recorded(nil), rc.reqs...)
}

// googleHeaders are the headers @google/genai sends with Pi's request.
func googleHeaders(r *http.Request) {
	r.Header.Del("Authorization")
	r.Header.Del("X-Stainless-Lang")
	r.Header.Set("X-Goog-Api-Key", bundle.ModelRoutePlaceholder)
	r.Header.Set("X-Goog-Api-Client", "google-genai-sdk/2.32.0 gl-node/v22")
	r.Header.Set("Accept", "*/*")
}

// googleBodies are Pi's recorded bodies, by the model in their file name.
func googleBodies(t *testing.T) []piBody {
	t.Helper()
	files, err := filepath.Glob("testdata/pi-*/google-generative-ai/*.json")
	if err != nil || len(files) < 8 {
		t.Fatalf("recorded google bodies: %d (%v)", len(files), err)
	}
	var out []piBody
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// <model>.turn-N.json from pi-ai's client; turn-N.json from the
		// real Pi's session in e2e TestPiModelRouteGoogle (model fake-1).
		model, _, ok := strings.Cut(filepath.Base(f), ".turn-")
		if !ok {
			model = "fake-1"
		}
		out = append(out, piBody{f, model, b})
	}
	return out
}

func googlePath(model string) string { return "/models/" + model + ":streamGenerateContent?alt=sse" }

// googleInjections: one thing outside the policy each, with a token that
// must not reach the provider.
var googleInjections = []injection{
	{"model in body", setMember("model", `"gemini-other-ultra"`), "gemini-other-ultra"},
	{"google search", appendTool(`{"googleSearch":{}}`), "googleSearch"},
	{"code execution", appendTool(`{"codeExecution":{}}`), "codeExecution"},
	{"url context", appendTool(`{"urlContext":{}}`), "urlContext"},
	{"search retrieval", appendTool(`{"googleSearchRetrieval":{"dynamicRetrievalConfig":{"mode":"MODE_DYNAMIC"}}}`), "googleSearchRetrieval"},
	{"file search", appendTool(`{"fileSearch":{"fileSearchStoreNames":["fileSearchStores/loot"]}}`), "fileSearchStores/loot"},
	{"mcp servers", appendTool(`{"mcpServers":[{"name":"x","streamableHttpTransport":{"url":"https://exfil.test/mcp","headers":{"A":"loot"}}}]}`), "exfil.test"},
	{"file by uri", googlePart(`{"fileData":{"mimeType":"image/png","fileUri":"https://exfil.test/p.png"}}`), "exfil.test"},
	{"executable code", googlePart(`{"executableCode":{"language":"PYTHON","code":"print(open('/etc/passwd').read())"}}`), "executableCode"},
	{"cached content", setMember("cachedContent", `"cachedContents/loot"`), "cachedContents/loot"},
	{"unknown member", setMember("safetySettings", `[{"category":"HARM_CATEGORY_HARASSMENT","threshold":"BLOCK_NONE"}]`), "safetySettings"},
	{"unknown generation member", func(b map[string]any, _ string) {
		gc, _ := b["generationConfig"].(map[string]any)
		if gc == nil {
			gc = map[string]any{}
			b["generationConfig"] = gc
		}
		gc["responseModalities"] = []any{"AUDIO"}
	}, "responseModalities"},
}

// googlePart adds a part to the last content.
func googlePart(v string) func(map[string]any, string) {
	return func(b map[string]any, _ string) {
		var x any
		_ = json.Unmarshal([]byte(v), &x)
		cs, _ := b["contents"].([]any)
		c := cs[len(cs)-1].(map[string]any)
		c["parts"] = append(c["parts"].([]any), x)
	}
}

func TestModelRouteGoogle(t *testing.T) {
	for _, pb := range googleBodies(t) {
		rt := googleRoute
		rt.Model = pb.model
		rec := &googleRecorder{}
		w := newModelWorldFor(t, rt, rec, nil)
		w.url = strings.TrimSuffix(w.url, "/v1") + "/v1beta"
		resp, out := w.do(t, "POST", googlePath(pb.model), string(pb.body), googleHeaders)
		if resp.StatusCode != 200 || !strings.Contains(out, `"finishReason":"STOP"`) {
			t.Fatalf("Pi's %s refused: %d %s", pb.name, resp.StatusCode, out)
		}
		sent := sendInjected(t, w, pb, googleInjections, googlePath(pb.model), googleHeaders, func(inj injection, resp *http.Response, out string) {
			var e struct {
				Error struct {
					Code    int
					Message string
					Status  string
				}
			}
			if json.Unmarshal([]byte(out), &e) != nil || e.Error.Code != resp.StatusCode || e.Error.Status == "" || !strings.Contains(e.Error.Message, "model route refused") {
				t.Errorf("%s + %s: not a Google error: %s", pb.name, inj.name, out)
			}
		})
		got := rec.all()
		if len(got) != 1 {
			t.Fatalf("%s: the provider saw %d requests of %d sent, want only Pi's own", pb.name, len(got), sent+1)
		}
		g := got[0]
		switch {
		case g.path != "/v1beta"+googlePath(pb.model):
			t.Errorf("%s: provider got %s", pb.name, g.path)
		case g.header.Get("X-Goog-Api-Key") != testModelKey || len(g.header.Values("X-Goog-Api-Key")) != 1:
			t.Errorf("%s: provider's x-goog-api-key %q", pb.name, g.header.Values("X-Goog-Api-Key"))
		case g.header.Get("Authorization") != "" || g.header.Get("X-Goog-Api-Client") != "":
			t.Errorf("%s: headers from the sandbox passed: %v", pb.name, g.header)
		}
		for _, inj := range googleInjections {
			if strings.Contains(g.body, inj.token) {
				t.Errorf("%s: %q reached the provider", pb.name, inj.token)
			}
		}
		if int(w.proxy.Stats.Refused.Load()) != sent {
			t.Errorf("%s: refused %d of %d", pb.name, w.proxy.Stats.Refused.Load(), sent)
		}
	}
}

// The control: the same injections through a route without the body
// policy reach the provider.
func TestModelRouteGoogleControl(t *testing.T) {
	saved := BodyPolicies
	t.Cleanup(func() { BodyPolicies = saved })
	BodyPolicies = map[string]*BodyPolicy{"google-generative-ai": {API: "google-generative-ai", body: free}}
	pb := googleBodies(t)[0]
	rt := googleRoute
	rt.Model = pb.model
	rec := &googleRecorder{}
	w := newModelWorldFor(t, rt, rec, nil)
	w.url = strings.TrimSuffix(w.url, "/v1") + "/v1beta"
	for _, inj := range googleInjections {
		var doc map[string]any
		_ = json.Unmarshal(pb.body, &doc)
		inj.inject(doc, pb.model)
		b, _ := json.Marshal(doc)
		if resp, out := w.do(t, "POST", googlePath(pb.model), string(b), googleHeaders); resp.StatusCode != 200 {
			t.Errorf("control %s: %d %s", inj.name, resp.StatusCode, out)
		}
	}
	for i, r := range rec.all() {
		if tok := googleInjections[i].token; !strings.Contains(r.body, tok) {
			t.Errorf("control %s: %q did not arrive", googleInjections[i].name, tok)
		}
	}
}

// The path's model is the route's: another model there is refused as a
// foreign model, other paths and queries (a ?key=, the non-streaming
// method, the model list) are out of scope, and a credential from the
// sandbox is refused; none reaches the provider. Control: the route's
// own model on the same path passes.
func TestModelRouteGooglePathScope(t *testing.T) {
	rec := &googleRecorder{}
	w := newModelWorldFor(t, googleRoute, rec, nil)
	w.url = strings.TrimSuffix(w.url, "/v1") + "/v1beta"
	body := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	for _, c := range []struct {
		name, path string
		edit       func(*http.Request)
		want       int
	}{
		{"other model", googlePath("gemini-2.5-pro"), googleHeaders, 403},
		{"other model, dotted", "/models/..:streamGenerateContent?alt=sse", googleHeaders, 403},
		{"model with a slash", "/models/tunedModels/loot:streamGenerateContent?alt=sse", googleHeaders, 404},
		{"key in query", "/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key=AIzaLoot", googleHeaders, 404},
		{"no alt", "/models/gemini-2.5-flash:streamGenerateContent", googleHeaders, 404},
		{"generateContent", "/models/gemini-2.5-flash:generateContent", googleHeaders, 404},
		{"model list", "/models", googleHeaders, 404},
		{"files", "/files", googleHeaders, 404},
		{"real key", googlePath("gemini-2.5-flash"), func(r *http.Request) { googleHeaders(r); r.Header.Set("X-Goog-Api-Key", "AIzaSyLoot") }, 403},
		{"bearer", googlePath("gemini-2.5-flash"), func(r *http.Request) { googleHeaders(r); r.Header.Set("Authorization", "Bearer ya29.loot") }, 403},
	} {
		resp, out := w.do(t, "POST", c.path, body, c.edit)
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, out, c.want)
		}
	}
	if n := len(rec.all()); n != 0 {
		t.Fatalf("the provider saw %d requests", n)
	}
	if w.proxy.Stats.Refusals()["foreign-model"] != 2 {
		t.Errorf("refusals %v", w.proxy.Stats.Refusals())
	}
	if resp, out := w.do(t, "POST", googlePath("gemini-2.5-flash"), body, googleHeaders); resp.StatusCode != 200 || len(rec.all()) != 1 {
		t.Fatalf("control: %d %s", resp.StatusCode, out)
	}
}

// Granted web_search admits Google's googleSearch (only the members
// Google documents for it); ungranted, it is refused.
func TestModelRouteGoogleSearchGrant(t *testing.T) {
	body := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"googleSearch":{"excludeDomains":["a.test"]}}]}`
	for _, granted := range []bool{false, true} {
		rt := googleRoute
		if granted {
			rt.HostedTools = []string{"web_search"}
		}
		rec := &googleRecorder{}
		w := newModelWorldFor(t, rt, rec, nil)
		w.url = strings.TrimSuffix(w.url, "/v1") + "/v1beta"
		resp, out := w.do(t, "POST", googlePath(rt.Model), body, googleHeaders)
		want, reached := 403, 0
		if granted {
			want, reached = 200, 1
		}
		if resp.StatusCode != want || len(rec.all()) != reached {
			t.Errorf("granted %t: %d %s, provider saw %d", granted, resp.StatusCode, out, len(rec.all()))
		}
		if granted {
			bad := strings.Replace(body, `"excludeDomains":["a.test"]`, `"dynamicThreshold":1`, 1)
			if resp, out := w.do(t, "POST", googlePath(rt.Model), bad, googleHeaders); resp.StatusCode != 400 {
				t.Errorf("granted search with an unknown member: %d %s", resp.StatusCode, out)
			}
		}
	}
}

// An upstream that echoes the x-goog-api-key it got (in a header, an
// SSE stream, base64) hands the sandbox none of it. Control: the echo
// holds the key.
func TestModelRouteGoogleScrubsTheKey(t *testing.T) {
	const key = "AIzaSyTestKey0123456789abcdefghijklmno"
	up := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("X-Goog-Api-Key")
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.Header().Set("X-Echo", got)
		rw.WriteHeader(http.StatusBadRequest)
		doc := `data: {"error":{"code":400,"message":"API key not valid: ` + got + ` (` + base64.StdEncoding.EncodeToString([]byte(got)) + `)","status":"INVALID_ARGUMENT"}}` + "\r\n\r\n"
		for i := 0; i < len(doc); i += 5 {
			io.WriteString(rw, doc[i:min(i+5, len(doc))])
			rw.(http.Flusher).Flush()
		}
	})
	w := newModelWorldFor(t, googleRoute, up, nil)
	k := key
	w.key.Store(&k)
	w.url = strings.TrimSuffix(w.url, "/v1") + "/v1beta"
	resp, out := w.do(t, "POST", googlePath("gemini-2.5-flash"), `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`, googleHeaders)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(out, "API key not valid") {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	b64 := base64.StdEncoding.EncodeToString([]byte(key))
	if strings.Contains(out, key) || strings.Contains(out, b64[:len(b64)-4]) || strings.Contains(resp.Header.Get("X-Echo"), key[8:]) {
		t.Errorf("the key reached the sandbox: %s %v", out, resp.Header)
	}
	rec := &httpRecorder{header: http.Header{}}
	req, _ := http.NewRequest("POST", "/", nil)
	req.Header.Set("X-Goog-Api-Key", key)
	up.ServeHTTP(rec, req)
	if !strings.Contains(rec.body.String(), key) {
		t.Fatal("control: the echoing provider does not echo the key")
	}
}
