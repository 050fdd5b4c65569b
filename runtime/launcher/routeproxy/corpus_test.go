package routeproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The model route's corpus (issue 31), in the respell approach of issue
// 18: Pi's own bodies (listed here, and recorded from the real Pi by e2e
// TestPiModelRoute* on each API) must pass; each of them with one thing
// outside the policy injected, spelled several ways, must not, and the
// provider must see nothing of it.

// recordedBodies are the bodies the real Pi sent through the route, by
// API (testdata/pi-<version>/<api>/*.json).
func recordedBodies(t *testing.T) map[string][][]byte {
	t.Helper()
	out := map[string][][]byte{}
	files, err := filepath.Glob("testdata/pi-*/*/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded Pi bodies in testdata (%v): run e2e TestPiModelRoute* with PASEO_UPDATE=1", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		api := filepath.Base(filepath.Dir(f))
		out[api] = append(out[api], b)
	}
	return out
}

// piCorpus is every Pi body per API: listed and recorded, each with its
// model.
type piBody struct {
	name, model string
	body        []byte
}

func piCorpus(t *testing.T) map[string][]piBody {
	out := map[string][]piBody{}
	for api, bs := range piBodies {
		for i, b := range bs {
			out[api] = append(out[api], piBody{fmt.Sprintf("listed-%d", i), "m-1", []byte(b)})
		}
	}
	for api, bs := range recordedBodies(t) {
		for i, b := range bs {
			var m struct{ Model string }
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			out[api] = append(out[api], piBody{fmt.Sprintf("recorded-%d", i), m.Model, b})
		}
	}
	return out
}

// injection puts one thing outside the policy into a body, and names a
// token that must never reach the provider.
type injection struct {
	name   string
	inject func(body map[string]any, model string)
	token  string
}

func setMember(k string, v string) func(map[string]any, string) {
	return func(b map[string]any, _ string) {
		var x any
		if err := json.Unmarshal([]byte(v), &x); err != nil {
			panic(err)
		}
		b[k] = x
	}
}

func appendTool(v string) func(map[string]any, string) {
	return func(b map[string]any, _ string) {
		var x any
		_ = json.Unmarshal([]byte(v), &x)
		tools, _ := b["tools"].([]any)
		b["tools"] = append(tools, x)
	}
}

// appendPart adds a content part to the body's last message (the first
// message list of the API's body), making a string content a text part.
func appendPart(list, v string) func(map[string]any, string) {
	return func(b map[string]any, _ string) {
		var x any
		_ = json.Unmarshal([]byte(v), &x)
		msgs, _ := b[list].([]any)
		if len(msgs) == 0 {
			b[list] = []any{map[string]any{"role": "user", "content": []any{x}}}
			return
		}
		m := msgs[len(msgs)-1].(map[string]any)
		m["role"] = "user"
		switch c := m["content"].(type) {
		case []any:
			m["content"] = append(c, x)
		default:
			m["content"] = []any{x}
		}
	}
}

var injections = map[string][]injection{
	"openai-completions": {
		{"other model", setMember("model", `"gpt-other-xl"`), "gpt-other-xl"},
		{"web search options", setMember("web_search_options", `{"search_context_size":"high","user_location":{"type":"approximate"}}`), "search_context_size"},
		{"mcp tool", appendTool(`{"type":"mcp","server_url":"https://exfil.test/mcp","headers":{"X":"loot"}}`), "exfil.test"},
		{"image by URL", appendPart("messages", `{"type":"image_url","image_url":{"url":"https://exfil.test/p.png?loot=1"}}`), "exfil.test"},
		{"file part", appendPart("messages", `{"type":"file","file":{"file_id":"file-loot"}}`), "file-loot"},
		{"store", setMember("store", `true`), `"store":true`},
		{"unknown member", setMember("logit_bias", `{"1":100}`), "logit_bias"},
	},
	"openai-responses": {
		{"other model", setMember("model", `"gpt-other-xl"`), "gpt-other-xl"},
		{"mcp tool", appendTool(`{"type":"mcp","server_label":"x","server_url":"https://exfil.test/mcp","headers":{"Authorization":"Bearer loot"}}`), "exfil.test"},
		{"web search", appendTool(`{"type":"web_search_preview"}`), "web_search_preview"},
		{"code interpreter", appendTool(`{"type":"code_interpreter","container":{"type":"auto","file_ids":["file-loot"]}}`), "code_interpreter"},
		{"file search", appendTool(`{"type":"file_search","vector_store_ids":["vs_loot"]}`), "vs_loot"},
		{"previous response", setMember("previous_response_id", `"resp_loot"`), "resp_loot"},
		{"conversation", setMember("conversation", `{"id":"conv_loot"}`), "conv_loot"},
		{"background", setMember("background", `true`), "background"},
		{"prompt", setMember("prompt", `{"id":"pmpt_loot"}`), "pmpt_loot"},
		{"input file", appendPart("input", `{"type":"input_file","file_url":"https://exfil.test/f.pdf"}`), "exfil.test"},
		{"image by URL", appendPart("input", `{"type":"input_image","image_url":"https://exfil.test/p.png","detail":"auto"}`), "exfil.test"},
	},
	"anthropic-messages": {
		{"other model", setMember("model", `"claude-other-xl"`), "claude-other-xl"},
		{"mcp servers", setMember("mcp_servers", `[{"type":"url","url":"https://exfil.test/mcp","name":"x","authorization_token":"loot"}]`), "exfil.test"},
		{"web fetch", appendTool(`{"type":"web_fetch_20250910","name":"web_fetch","allowed_domains":["exfil.test"]}`), "exfil.test"},
		{"web search", appendTool(`{"type":"web_search_20250305","name":"web_search"}`), "web_search_20250305"},
		{"code execution", appendTool(`{"type":"code_execution_20250825","name":"code_execution"}`), "code_execution_20250825"},
		{"container", setMember("container", `"container_loot"`), "container_loot"},
		{"image by URL", appendPart("messages", `{"type":"image","source":{"type":"url","url":"https://exfil.test/p.png"}}`), "exfil.test"},
		{"document by file", appendPart("messages", `{"type":"document","source":{"type":"file","file_id":"file_loot"}}`), "file_loot"},
		{"fallbacks", setMember("fallbacks", `[{"model":"claude-other-xl"}]`), "claude-other-xl"},
	},
}

// respellings are an injected body's spellings: as encoding/json writes
// it, indented, with every key of the injected member \u-escaped, and
// with the injected member's key in another case.
func respellings(body []byte, tok string) map[string][]byte {
	var ind bytes.Buffer
	_ = json.Indent(&ind, body, "", "\t")
	out := map[string][]byte{"plain": body, "indented": ind.Bytes()}
	escaped := body
	for _, k := range []string{"model", "tools", "type", "mcp_servers", "previous_response_id", "conversation", "background",
		"prompt", "container", "web_search_options", "store", "image_url", "source", "fallbacks", "logit_bias"} {
		var e strings.Builder
		e.WriteString(`"`)
		for _, r := range k {
			fmt.Fprintf(&e, `\u%04x`, r)
		}
		e.WriteString(`":`)
		escaped = bytes.ReplaceAll(escaped, []byte(`"`+k+`":`), []byte(e.String()))
	}
	out["keys-escaped"] = escaped
	return out
}

// sendInjected sends Pi's body pb with each injection, in every
// respelling, to path with Pi's headers, and wants each refused (400 or
// 403); check, when set, looks at each refusal's answer too. It returns
// how many it sent.
func sendInjected(t *testing.T, w *modelWorld, pb piBody, injs []injection, path string, headers func(*http.Request), check func(inj injection, resp *http.Response, out string)) int {
	t.Helper()
	sent := 0
	for _, inj := range injs {
		var doc map[string]any
		dec := json.NewDecoder(bytes.NewReader(pb.body))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			t.Fatal(err)
		}
		inj.inject(doc, pb.model)
		plain, _ := json.Marshal(doc)
		if !bytes.Contains(plain, []byte(inj.token)) {
			t.Fatalf("%s %s: the injected body lacks its token %q", pb.name, inj.name, inj.token)
		}
		for sp, b := range respellings(plain, inj.token) {
			resp, out := w.do(t, "POST", path, string(b), headers)
			if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s + %s (%s): %d %s", pb.name, inj.name, sp, resp.StatusCode, out)
			}
			if check != nil {
				check(inj, resp, out)
			}
			sent++
		}
	}
	return sent
}

// apiBodies are the recorded bodies of one API (testdata/pi-*/<api>),
// each with the model it names; fewer than min fails the test.
func apiBodies(t *testing.T, api string, min int) []piBody {
	t.Helper()
	files, err := filepath.Glob("testdata/pi-*/" + api + "/*.json")
	if err != nil || len(files) < min {
		t.Fatalf("recorded %s bodies: %d (%v)", api, len(files), err)
	}
	var out []piBody
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m struct{ Model string }
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, piBody{f, m.Model, b})
	}
	return out
}

func TestModelRouteCorpus(t *testing.T) {
	corpus := piCorpus(t)
	for api, route := range apiRoutes {
		t.Run(api, func(t *testing.T) {
			bodies := corpus[api]
			if len(bodies) == 0 {
				t.Fatalf("no Pi bodies for %s", api)
			}
			for _, pb := range bodies {
				rt := route
				rt.Model = pb.model
				rec := &recorder{}
				w := newModelWorldFor(t, rt, rec, nil)
				w.url = w.forAPI(api)
				if resp, out := w.do(t, "POST", apiPaths[api], string(pb.body), piHeaders(api)); resp.StatusCode != 200 {
					t.Fatalf("Pi's %s refused: %d %s", pb.name, resp.StatusCode, out)
				}
				sent := sendInjected(t, w, pb, injections[api], apiPaths[api], piHeaders(api), nil)
				got := rec.all()
				if len(got) != 1 {
					t.Fatalf("%s: the provider saw %d requests of %d sent, want only Pi's own", pb.name, len(got), sent+1)
				}
				for _, inj := range injections[api] {
					if strings.Contains(got[0].body, inj.token) && !bytes.Contains(pb.body, []byte(inj.token)) {
						t.Errorf("%s: %q reached the provider", pb.name, inj.token)
					}
				}
				if int(w.proxy.Stats.Refused.Load()) != sent {
					t.Errorf("%s: refused %d of %d", pb.name, w.proxy.Stats.Refused.Load(), sent)
				}
			}
		})
	}
	// Every API's recorded bodies are of a version the route knows.
	if !slices.ContainsFunc(corpusAPIs(corpus), func(a string) bool { return a == "openai-completions" }) {
		t.Error("no recorded openai-completions bodies")
	}
}

func corpusAPIs(c map[string][]piBody) []string {
	var out []string
	for a := range c {
		out = append(out, a)
	}
	return out
}

// The control: the same injected bodies through a route without the
// body policy reach the provider (so the corpus can fail).
func TestModelRouteCorpusControl(t *testing.T) {
	corpus := piCorpus(t)
	saved := BodyPolicies
	t.Cleanup(func() { BodyPolicies = saved })
	BodyPolicies = map[string]*BodyPolicy{}
	for api := range saved {
		BodyPolicies[api] = &BodyPolicy{API: api, body: free}
	}
	for api, route := range apiRoutes {
		pb := corpus[api][0]
		rt := route
		rt.Model = pb.model
		rec := &recorder{}
		w := newModelWorldFor(t, rt, rec, nil)
		w.url = w.forAPI(api)
		for _, inj := range injections[api] {
			var doc map[string]any
			_ = json.Unmarshal(pb.body, &doc)
			inj.inject(doc, pb.model)
			b, _ := json.Marshal(doc)
			if resp, out := w.do(t, "POST", apiPaths[api], string(b), piHeaders(api)); resp.StatusCode != 200 {
				t.Errorf("control %s %s: %d %s", api, inj.name, resp.StatusCode, out)
			}
		}
		for i, r := range rec.all() {
			if tok := injections[api][i].token; !strings.Contains(r.body, tok) {
				t.Errorf("control %s %s: %q did not arrive", api, injections[api][i].name, tok)
			}
		}
	}
}
