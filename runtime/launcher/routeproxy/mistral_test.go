package routeproxy

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// The mistral-conversations route: a bearer key, POST /v1/chat/completions
// only, Mistral's chat body policy. Pi's bodies are recorded from pi-ai's
// own client (testdata/record-mistral.mjs) for Pi 0.84.2 and 1.6.0.

var mistralRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "",
	Upstream: "https://llm.example.test:8443", TokenRef: "alice/k", API: "mistral-conversations",
	Credential: "authorization-bearer", Model: "mistral-medium-3.5", Requests: []string{"POST /v1/chat/completions"}}

var mistralInjections = []injection{
	{"other model", setMember("model", `"mistral-other-xl"`), "mistral-other-xl"},
	{"web search", appendTool(`{"type":"web_search"}`), "web_search"},
	{"code interpreter", appendTool(`{"type":"code_interpreter"}`), "code_interpreter"},
	{"mcp tool", appendTool(`{"type":"mcp","server_url":"https://exfil.test/mcp"}`), "exfil.test"},
	{"image by URL", appendPart("messages", `{"type":"image_url","image_url":"https://exfil.test/p.png"}`), "exfil.test"},
	{"document by URL", appendPart("messages", `{"type":"document_url","document_url":"https://exfil.test/d.pdf"}`), "exfil.test"},
	{"agent", setMember("agent_id", `"ag_loot"`), "ag_loot"},
	{"unknown member", setMember("response_format", `{"type":"json_object"}`), "response_format"},
	{"safe prompt off", setMember("safe_prompt", `false`), "safe_prompt"},
}

func TestModelRouteMistral(t *testing.T) {
	// pi-ai's client's bodies and the real Pi's (e2e
	// TestPiModelRouteMistral, model fake-1), each with its model.
	for _, pb := range apiBodies(t, "mistral-conversations", 6) {
		f, body := pb.name, pb.body
		rt := mistralRoute
		rt.Model = pb.model
		rec := &googleRecorder{}
		w := newModelWorldFor(t, rt, rec, nil)
		w.url = strings.TrimSuffix(w.url, "/v1")
		if resp, out := w.do(t, "POST", "/v1/chat/completions", string(body), nil); resp.StatusCode != 200 {
			t.Fatalf("Pi's %s refused: %d %s", f, resp.StatusCode, out)
		}
		sent := sendInjected(t, w, pb, mistralInjections, "/v1/chat/completions", nil, nil)
		// An assistant prefix (a continuation Pi never asks for) is refused.
		if strings.Contains(string(body), `"prefix": false`) {
			if resp, _ := w.do(t, "POST", "/v1/chat/completions", strings.Replace(string(body), `"prefix": false`, `"prefix": true`, 1), nil); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s with prefix true: %d", f, resp.StatusCode)
			}
		}
		got := rec.all()
		if len(got) != 1 {
			t.Fatalf("%s: the provider saw %d requests of %d sent, want only Pi's own", f, len(got), sent+1)
		}
		if g := got[0]; g.path != "/v1/chat/completions" || g.header.Get("Authorization") != "Bearer "+testModelKey {
			t.Errorf("%s: provider got %s with %v", f, g.path, g.header)
		}
		for _, inj := range mistralInjections {
			if strings.Contains(got[0].body, inj.token) {
				t.Errorf("%s: %q reached the provider", f, inj.token)
			}
		}
	}
}

// Control: without the body policy the injections reach the provider.
func TestModelRouteMistralControl(t *testing.T) {
	saved := BodyPolicies
	t.Cleanup(func() { BodyPolicies = saved })
	BodyPolicies = map[string]*BodyPolicy{"mistral-conversations": {API: "mistral-conversations", body: free}}
	files, _ := filepath.Glob("testdata/pi-*/mistral-conversations/*.json")
	body, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	rec := &googleRecorder{}
	w := newModelWorldFor(t, mistralRoute, rec, nil)
	w.url = strings.TrimSuffix(w.url, "/v1")
	for _, inj := range mistralInjections {
		var doc map[string]any
		_ = json.Unmarshal(body, &doc)
		inj.inject(doc, mistralRoute.Model)
		b, _ := json.Marshal(doc)
		if resp, out := w.do(t, "POST", "/v1/chat/completions", string(b), nil); resp.StatusCode != 200 {
			t.Errorf("control %s: %d %s", inj.name, resp.StatusCode, out)
		}
	}
	for i, r := range rec.all() {
		if tok := mistralInjections[i].token; !strings.Contains(r.body, tok) {
			t.Errorf("control %s: %q did not arrive", mistralInjections[i].name, tok)
		}
	}
}
