package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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

// Pi's own requests pass the model route's body policy (issue 31): a
// session with a reasoning model at thinking high, whose turns think,
// call tools and send the thinking back, a second prompt on the same
// session with an image; the route refuses none, and every request reaches the model.
// The chat bodies Pi sent are routeproxy's recorded corpus
// (testdata/pi-<Pi version>/openai-completions): PASEO_UPDATE=1 rewrites it.
func TestPiModelRouteBodyPolicy(t *testing.T) {
	e := newEnv(t,
		fakemodel.Turn{Reasoning: "The user wants a file; I will write it.",
			ToolCalls: []fakemodel.ToolCall{{Name: "write", Arguments: map[string]string{"path": "a.txt", "content": "alpha\n"}}}},
		fakemodel.Turn{Reasoning: "Now read it back.", ToolCalls: []fakemodel.ToolCall{{Name: "read", Arguments: map[string]string{"path": "a.txt"}}}},
		fakemodel.Turn{Reasoning: "It holds alpha.", Content: "a.txt holds alpha"},
		fakemodel.Turn{Reasoning: "A second prompt.", Content: "still here"},
	)
	e.models = `{"providers":{"fake":{"baseUrl":"` + modelURL + `","api":"openai-completions",
 "apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},
 "models":[{"id":"fake-1","reasoning":true,"input":["text","image"],"contextWindow":128000,"maxTokens":16384}]}}}`
	sc := e.scene(t, "pi-session", `{"model":{"thinking":"high"}}`)
	p := e.launch(t, sc)
	c := ctx(t)
	p.turn(t, c, "write a.txt and read it back")
	// The second prompt brings an image (a 1x1 PNG), as a client's paste.
	p.call(t, c, map[string]any{"type": "prompt", "message": "anything else in this picture?",
		"images": []map[string]string{{"type": "image", "mimeType": "image/png",
			"data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="}}})
	if _, _, err := p.Until(c, piproto.Event("agent_settled")); err != nil {
		t.Fatalf("the prompt with an image did not settle: %v\nstderr: %s", err, p.stderr.String())
	}
	res := p.stop(t)
	rs := res.Routes["model"]
	if rs.Refused != 0 || len(rs.ByReason) != 0 || rs.Forwarded != int64(len(e.requests())) {
		t.Errorf("model route %+v: want all of the model's %d requests forwarded, none refused", rs, len(e.requests()))
	}
	var bodies [][]byte
	for _, r := range e.requests() {
		if strings.HasSuffix(r.Path, "/chat/completions") {
			bodies = append(bodies, r.Body)
		}
	}
	if len(bodies) != 4 {
		t.Fatalf("%d chat requests reached the model, want 4", len(bodies))
	}
	all := string(bytes.Join(bodies, nil))
	for _, want := range []string{`"reasoning_content":"It holds alpha."`, `"tool_calls":[`, `"role":"tool"`, `"reasoning_effort":"high"`, `"tools":[`, `"image_url":{"url":"data:image/png;base64,`} {
		if !strings.Contains(all, want) {
			t.Errorf("Pi's requests never held %s: the turn did not exercise it", want)
		}
	}
	if os.Getenv("PASEO_UPDATE") == "1" {
		dir := testbundle.Repo(t, filepath.Join("runtime/launcher/routeproxy/testdata", e.image.piDir(), "openai-completions"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range bodies {
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			out, _ := json.MarshalIndent(v, "", " ")
			// The host paths Pi saw (its cwd, in the system prompt) as the
			// daemon names them, so a re-recording differs only where Pi does.
			out = bytes.ReplaceAll(out, []byte(e.host), nil)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("turn-%d.json", i+1)), append(out, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
