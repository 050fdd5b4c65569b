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

// The pi-messages route (Pi's own message protocol, the Radius gateway's):
// a bearer key, POST <prefix>/messages only, a body policy of Pi's own
// Context. Pi's bodies are recorded from pi-ai 1.6.0's own client
// (testdata/record-pi-messages.mjs; 0.84.2 has no pi-messages) and from
// the real Pi's session (e2e TestPiModelRoutePiMessages, model fake-1).

var piMessagesRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "/v1",
	Upstream: "https://llm.example.test:8443/v1", TokenRef: "alice/k", API: "pi-messages",
	Credential: "authorization-bearer", Model: "radius-large", Requests: []string{"POST /messages"}}

// inContext edits the body's context (Pi's Context: systemPrompt,
// messages, tools).
func inContext(edit func(ctx map[string]any)) func(map[string]any, string) {
	return func(b map[string]any, _ string) {
		ctx, _ := b["context"].(map[string]any)
		if ctx == nil {
			ctx = map[string]any{}
			b["context"] = ctx
		}
		edit(ctx)
	}
}

func decode(v string) any {
	var x any
	if err := json.Unmarshal([]byte(v), &x); err != nil {
		panic(err)
	}
	return x
}

// piUserPart appends a user message holding the part v.
func piUserPart(v string) func(map[string]any, string) {
	return inContext(func(ctx map[string]any) {
		msgs, _ := ctx["messages"].([]any)
		ctx["messages"] = append(msgs, map[string]any{"role": "user", "content": []any{decode(v)}, "timestamp": 5})
	})
}

func piOption(k, v string) func(map[string]any, string) {
	return func(b map[string]any, _ string) {
		o, _ := b["options"].(map[string]any)
		if o == nil {
			o = map[string]any{}
			b["options"] = o
		}
		o[k] = decode(v)
	}
}

var piMessagesInjections = []injection{
	{"other model", setMember("model", `"radius-other-xl"`), "radius-other-xl"},
	{"hosted tool", inContext(func(ctx map[string]any) {
		tools, _ := ctx["tools"].([]any)
		ctx["tools"] = append(tools, decode(`{"type":"web_search","name":"search_loot","description":"d","parameters":{}}`))
	}), "search_loot"},
	{"image by URL", piUserPart(`{"type":"image_url","image_url":"https://exfil.test/p.png"}`), "exfil.test"},
	{"image with a URL", piUserPart(`{"type":"image","url":"https://exfil.test/p.png","mimeType":"image/png"}`), "exfil.test"},
	{"document as an image", piUserPart(`{"type":"image","data":"JVBERi0x","mimeType":"application/pdf"}`), "application/pdf"},
	{"document part", piUserPart(`{"type":"document","source":"https://exfil.test/d.pdf"}`), "exfil.test"},
	{"deferred handle", inContext(func(ctx map[string]any) {
		msgs, _ := ctx["messages"].([]any)
		ctx["messages"] = append(msgs, decode(`{"role":"assistant","content":[],"api":"pi-messages","provider":"radius","model":"radius-large","usage":{},"stopReason":"deferred","timestamp":6,"deferred":{"provider":"radius","modelId":"radius-large","api":"pi-messages","id":"dfr_loot"}}`))
	}), "dfr_loot"},
	{"unknown option", piOption("samplingParams", `{"top_k_loot":1}`), "top_k_loot"},
	{"unknown thinking level", piOption("reasoning", `"max_loot"`), "max_loot"},
	{"unknown member", setMember("gateway", `{"upstream":"https://exfil.test"}`), "exfil.test"},
}

func TestModelRoutePiMessages(t *testing.T) {
	for _, pb := range apiBodies(t, "pi-messages", 10) {
		f, body := pb.name, pb.body
		rt := piMessagesRoute
		rt.Model = pb.model
		rec := &googleRecorder{}
		w := newModelWorldFor(t, rt, rec, nil)
		if resp, out := w.do(t, "POST", "/messages", string(body), nil); resp.StatusCode != 200 {
			t.Fatalf("Pi's %s refused: %d %s", f, resp.StatusCode, out)
		}
		sent := sendInjected(t, w, pb, piMessagesInjections, "/messages", nil, nil)
		// The path scope: Pi's debug query and another path of the gateway
		// are refused before anything reaches it.
		for _, p := range []string{"/messages?debug=1", "/config", "/../messages"} {
			if resp, _ := w.do(t, "POST", p, string(body), nil); resp.StatusCode == 200 {
				t.Errorf("%s at %s: %d", f, p, resp.StatusCode)
			}
		}
		got := rec.all()
		if len(got) != 1 {
			t.Fatalf("%s: the provider saw %d requests of %d sent, want only Pi's own", f, len(got), sent+4)
		}
		if g := got[0]; g.path != "/v1/messages" || g.header.Get("Authorization") != "Bearer "+testModelKey {
			t.Errorf("%s: provider got %s with %v", f, g.path, g.header)
		}
		for _, inj := range piMessagesInjections {
			if strings.Contains(got[0].body, inj.token) {
				t.Errorf("%s: %q reached the provider", f, inj.token)
			}
		}
	}
}

// Control: without the body policy the injections reach the provider.
func TestModelRoutePiMessagesControl(t *testing.T) {
	saved := BodyPolicies
	t.Cleanup(func() { BodyPolicies = saved })
	BodyPolicies = map[string]*BodyPolicy{"pi-messages": {API: "pi-messages", body: free}}
	files, _ := filepath.Glob("testdata/pi-*/pi-messages/*.json")
	if len(files) == 0 {
		t.Fatal("no recorded pi-messages bodies")
	}
	body, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	rec := &googleRecorder{}
	w := newModelWorldFor(t, piMessagesRoute, rec, nil)
	for _, inj := range piMessagesInjections {
		var doc map[string]any
		_ = json.Unmarshal(body, &doc)
		inj.inject(doc, piMessagesRoute.Model)
		b, _ := json.Marshal(doc)
		if resp, out := w.do(t, "POST", "/messages", string(b), nil); resp.StatusCode != http.StatusOK {
			t.Errorf("control %s: %d %s", inj.name, resp.StatusCode, out)
		}
	}
	got := rec.all()
	if len(got) != len(piMessagesInjections) {
		t.Fatalf("control: the provider saw %d of %d", len(got), len(piMessagesInjections))
	}
	for i, r := range got {
		if tok := piMessagesInjections[i].token; !strings.Contains(r.body, tok) {
			t.Errorf("control %s: %q did not arrive", piMessagesInjections[i].name, tok)
		}
	}
}
