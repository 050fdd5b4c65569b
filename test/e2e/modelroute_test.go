package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// The provider key rotated while Pi runs (issue 24): the key changes at
// the provider and in the deployment's secrets between two turns; the
// second turn carries the new one, with nothing restarted, because the
// model route reads the key at every request and the sandbox never had
// it.
func TestPiModelKeyRotation(t *testing.T) {
	e := newEnv(t, fakemodel.Text("before the rotation"), fakemodel.Text("after the rotation"))
	var key atomic.Pointer[string]
	k := apiKey
	key.Store(&k)
	e.secrets = func(deployment, ref string) ([]byte, error) {
		if ref == "alice/fake-llm" {
			return []byte(*key.Load()), nil
		}
		return secrets(deployment, ref)
	}
	sc := e.scene(t, "pi-session", "")
	p := e.launch(t, sc)
	c := ctx(t)
	p.turn(t, c, "first")
	rotated := "sk-e2e-rotated-5e19b2"
	e.mu.Lock()
	e.fm.SetAPIKey(rotated)
	e.mu.Unlock()
	key.Store(&rotated)
	events := p.turn(t, c, "second")
	res := p.stop(t)
	var raw strings.Builder
	for _, f := range events {
		raw.Write(f.Raw)
	}
	if !strings.Contains(raw.String(), "after the rotation") {
		t.Errorf("the turn after the rotation did not get the model's answer: %.400s", raw.String())
	}
	chats := 0
	for _, r := range e.requests() {
		if !r.Authorized {
			t.Errorf("%s %s reached the model without the current key", r.Method, r.Path)
		}
		if strings.HasSuffix(r.Path, "/chat/completions") {
			chats++
		}
	}
	if chats != 2 {
		t.Errorf("%d chat requests, want 2", chats)
	}
	if rs, n := res.Routes["model"], len(e.requests()); rs.Forwarded != int64(n) || rs.Refused != 0 {
		t.Errorf("model route %+v, want the model's %d requests forwarded and none refused", rs, n)
	}
}

// Pi's own requests pass the model route's body policy (issue 31), on
// each API the profile routes: a session with a reasoning model at
// thinking high, whose turns think, call tools and send the thinking back;
// a second prompt with an image; a third whose answer reports a context
// near the model's window, so Pi compacts the session (its summarization
// request goes through the route too); and a prompt on the compacted
// session. The route refuses none, and every request reaches the model
// and is answered in full. The inference bodies Pi sent are routeproxy's
// recorded corpus (testdata/pi-<image's Pi>/<api>): PASEO_UPDATE=1
// rewrites it.
func TestPiModelRouteBodyPolicy(t *testing.T) {
	piRouteSession(t, "openai-completions", "/chat/completions",
		`"reasoning_content":"It holds alpha."`, `"tool_calls":[`, `"role":"tool"`, `"reasoning_effort":"high"`, `"tools":[`, `"image_url":{"url":"data:image/png;base64,`)
}

func TestPiModelRouteResponses(t *testing.T) {
	piRouteSession(t, "openai-responses", "/responses",
		`"type":"reasoning"`, `"encrypted_content":"enc-fake-`, `"type":"function_call"`, `"type":"function_call_output"`,
		`"reasoning":{"effort":"high"`, `"tools":[`, `"type":"input_image"`, `"image_url":"data:image/png;base64,`)
}

func TestPiModelRouteAnthropic(t *testing.T) {
	piRouteSession(t, "anthropic-messages", "/messages",
		`"type":"thinking"`, `"signature":"sig-fake-`, `"type":"tool_use"`, `"type":"tool_result"`,
		`"thinking":{`, `"tools":[`, `"type":"image"`, `"media_type":"image/png"`)
}

// Google's stream: the key in x-goog-api-key, the model in the path
// (the route's {model}), thinking parts with their signature sent back.
func TestPiModelRouteGoogle(t *testing.T) {
	piRouteSession(t, "google-generative-ai", "/models/fake-1:streamGenerateContent",
		`"thought":true`, `"thoughtSignature":"c2lnLWZha2U="`, `"functionCall":`, `"functionResponse":`,
		`"thinkingConfig":`, `"functionDeclarations":`, `"inlineData":`, `"mimeType":"image/png"`)
}

// Azure OpenAI's Responses: the key in api-key, ?api-version=v1, the
// deployment name (model.id) in the body.
func TestPiModelRouteAzure(t *testing.T) {
	piRouteSession(t, "azure-openai-responses", "/responses",
		`"type":"reasoning"`, `"encrypted_content":"enc-fake-`, `"type":"function_call"`, `"type":"function_call_output"`,
		`"reasoning":{"effort":"high"`, `"tools":[`, `"type":"input_image"`, `"image_url":"data:image/png;base64,`)
}

// Pi's own Mistral client: a bearer key, /v1/chat/completions, thinking
// sent back as Mistral's thinking chunks.
func TestPiModelRouteMistral(t *testing.T) {
	piRouteSession(t, "mistral-conversations", "/chat/completions",
		`"tool_calls":[`, `"role":"tool"`, `"tools":[`, `"type":"image_url"`, `"image_url":"data:image/png;base64,`)
}

// Pi's own message protocol (the Radius gateway's): a bearer key,
// <baseUrl>/messages, Pi's Context as the body (thinking with its
// signature, tool calls and results, images inline, the tools in the
// system message's toolsAdded).
func TestPiModelRoutePiMessages(t *testing.T) {
	piRouteSession(t, "pi-messages", "/messages",
		`"type":"thinking"`, `"thinkingSignature":"sig-fake-`, `"type":"toolCall"`, `"role":"toolResult"`,
		`"reasoning":"high"`, `"toolsAdded":[`, `"type":"image"`, `"mimeType":"image/png"`)
}

// pngPixel is a 1x1 PNG, as a client's paste.
const pngPixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

func piRouteSession(t *testing.T, api, path string, wants ...string) {
	e := newEnv(t)
	think := func(r, content string, calls ...fakemodel.ToolCall) fakemodel.Turn {
		return fakemodel.Turn{Reasoning: r, Content: content, ToolCalls: calls}
	}
	// Each prompt has its own script, so the compaction's request (whose
	// prompt is the conversation) takes the unkeyed one.
	e.mu.Lock()
	e.fm = fakemodel.New(fakemodel.Options{APIKey: apiKey,
		Scripts: map[string][]fakemodel.Turn{
			"write a.txt": {
				think("The user wants a file; I will write it.", "", fakemodel.ToolCall{Name: "write", Arguments: map[string]string{"path": "a.txt", "content": "alpha\n"}}),
				think("Now read it back.", "", fakemodel.ToolCall{Name: "read", Arguments: map[string]string{"path": "a.txt"}}),
				think("It holds alpha.", "a.txt holds alpha"),
			},
			"anything else": {think("A second prompt.", "still here")},
			// The answer reports a context past the window less Pi's
			// reserve (64000 - 16384): Pi compacts after the turn.
			"go on":            {{Reasoning: "A long session.", Content: "going on", PromptTokens: 50000}},
			"after compacting": {think("The session was compacted.", "compacted and still here")},
		},
		Script: []fakemodel.Turn{fakemodel.Text("## Goal\nThe user had a.txt written and read back, and showed a picture.")},
	})
	e.mu.Unlock()
	base := modelURL
	if api == "anthropic-messages" || api == "mistral-conversations" {
		// Anthropic's and Mistral's clients call <baseUrl>/v1/....
		base = strings.TrimSuffix(modelURL, "/v1")
		e.baseURL = base
	}
	e.models = `{"providers":{"fake":{"baseUrl":"` + base + `","api":"` + api + `",
 "apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},
 "models":[{"id":"fake-1","reasoning":true,"input":["text","image"],"contextWindow":64000,"maxTokens":16384}]}}}`
	// Keep little of the session at a compaction, so there is something
	// to summarize.
	e.settings = `{"packages":["/opt/pi/node_modules/pi-mcp-adapter"],"compaction":{"enabled":true,"keepRecentTokens":200}}`
	sc := e.scene(t, "pi-session", `{"model":{"thinking":"high","api":"`+api+`"}}`)
	p := e.launch(t, sc)
	c := ctx(t)
	// A request the route refused ends Pi's turn in an error: say so now,
	// not after waiting for what would have followed.
	ok := func(what string, events []piproto.Frame) []piproto.Frame {
		for _, f := range events {
			if bytes.Contains(f.Raw, []byte(`"stopReason":"error"`)) {
				t.Fatalf("%s: Pi's turn ended in an error (%d requests reached the model): %.600s", what, len(e.requests()), f.Raw)
			}
		}
		return events
	}
	ok("the first prompt", p.turn(t, c, "write a.txt and read it back"))
	p.call(t, c, map[string]any{"type": "prompt", "message": "anything else in this picture?",
		"images": []map[string]string{{"type": "image", "mimeType": "image/png", "data": pngPixel}}})
	_, events, err := p.Until(c, piproto.Event("agent_settled"))
	if err != nil {
		t.Fatalf("the prompt with an image did not settle: %v\nstderr: %s", err, p.stderr.String())
	}
	ok("the prompt with an image", events)
	events = ok("the long session's prompt", p.turn(t, c, "go on"))
	compacted := func(f piproto.Frame) bool { return f.Type == "compaction_end" }
	if !slices.ContainsFunc(events, compacted) {
		f, _, err := p.Until(c, compacted)
		if err != nil {
			t.Fatalf("Pi did not compact the session: %v\nstderr: %s", err, p.stderr.String())
		}
		events = append(events, f)
	}
	end := events[slices.IndexFunc(events, compacted)]
	if bytes.Contains(end.Raw, []byte(`"errorMessage"`)) || bytes.Contains(end.Raw, []byte(`"aborted":true`)) || !bytes.Contains(end.Raw, []byte(`"reason":"threshold"`)) {
		t.Fatalf("the compaction failed: %s", end.Raw)
	}
	ok("the prompt after the compaction", p.turn(t, c, "after compacting, what is left?"))
	res := p.stop(t)

	rs := res.Routes["model"]
	reqs := e.requests()
	if rs.Refused != 0 || len(rs.ByReason) != 0 || rs.Forwarded != int64(len(reqs)) {
		t.Errorf("model route %+v: want all of the model's %d requests forwarded, none refused", rs, len(reqs))
	}
	var bodies [][]byte
	var headers []string
	summaries := 0
	for _, r := range reqs {
		if !r.Authorized || r.Status != 200 || !r.Completed {
			t.Errorf("%s %s: authorized %v, status %d, completed %v", r.Method, r.Path, r.Authorized, r.Status, r.Completed)
		}
		if strings.HasSuffix(r.Path, path) {
			bodies = append(bodies, r.Body)
			headers = append(headers, r.Headers...)
			if r.Model != "fake-1" {
				t.Errorf("a request named model %q", r.Model)
			}
			if bytes.Contains(r.Body, []byte(`\u003cconversation\u003e`)) || bytes.Contains(r.Body, []byte(`<conversation>`)) {
				summaries++
			}
		}
	}
	// Three turns of the first prompt, one each of the others, and the
	// compaction's summary.
	if len(bodies) != 7 || summaries != 1 {
		t.Fatalf("%d inference requests reached the model (%d of them the compaction's), want 7 (1)", len(bodies), summaries)
	}
	// Pi's feature headers pass with the values the profile lists.
	if api == "anthropic-messages" && (!slices.Contains(headers, "Anthropic-Version") || !slices.Contains(headers, "Anthropic-Beta")) {
		t.Errorf("Pi's anthropic-version and anthropic-beta did not reach the model: %v", headers)
	}
	all := string(bytes.Join(bodies, nil))
	for _, want := range wants {
		if !strings.Contains(all, want) {
			t.Errorf("Pi's requests never held %s: the session did not exercise it", want)
		}
	}
	if os.Getenv("PASEO_UPDATE") == "1" {
		// By the image's Pi, so a new Pi's bodies join the corpus beside
		// the old one's.
		if e.image.Pi == "" {
			t.Fatal("the image names no Pi version")
		}
		dir := testbundle.Repo(t, "runtime/launcher/routeproxy/testdata/pi-"+e.image.Pi+"/"+api)
		// This run's turns only: bodies recorded otherwise (Google's, from
		// pi-ai's client, testdata/record-google.mjs) stay.
		old, _ := filepath.Glob(filepath.Join(dir, "turn-*.json"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range bodies {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("turn-%d.json", i+1)), corpusBody(t, e, b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// corpusBody is a request body Pi sent as routeproxy's corpus keeps it:
// indented, with what changes from run to run made fixed, so a
// re-recording differs only where Pi does.
func corpusBody(t *testing.T, e *env, b []byte) []byte {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	// The session id Pi sends as its cache key is new at every run.
	if m, ok := v.(map[string]any); ok && m["prompt_cache_key"] != nil {
		m["prompt_cache_key"] = "pi-session-id"
	}
	// pi-messages sends it as options.sessionId.
	if m, ok := v.(map[string]any); ok {
		if o, ok := m["options"].(map[string]any); ok && o["sessionId"] != nil {
			o["sessionId"] = "pi-session-id"
		}
	}
	out, _ := json.MarshalIndent(v, "", " ")
	// The host paths Pi saw (its cwd, in the system prompt) as the daemon
	// names them.
	return append(bytes.ReplaceAll(out, []byte(e.host), nil), '\n')
}
