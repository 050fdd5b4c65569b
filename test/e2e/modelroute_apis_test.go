package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// The image's Pi's first request on the Responses and Anthropic APIs
// passes the model route's body policy (issue 31 on the Pi of issue 34):
// a reasoning model at thinking high, a prompt with an image, Pi's tools.
// The fake model speaks only Chat Completions, so the model host answers
// these with the API's own error after taking the body; what matters is
// that the route forwarded Pi's body, with the key in the API's header,
// and refused nothing. The bodies are routeproxy's recorded corpus
// (testdata/pi-<Pi version>/<api>/first.json): PASEO_UPDATE=1 rewrites it.
func TestPiModelRouteFirstRequestPerAPI(t *testing.T) {
	fake := func(api string) string {
		return `{"providers":{"fake":{"baseUrl":"` + modelURL + `","api":"` + api + `","apiKey":"$FAKE_LLM_KEY",
 "models":[{"id":"fake-1","reasoning":true,"input":["text","image"],"contextWindow":128000,"maxTokens":16384}]}}}`
	}
	for _, c := range []struct {
		name, api string
		// the path and query Pi posts to
		uri string
		// the daemon's models.json and the facts' model
		models, model string
		// members the body must hold, so the request exercised them
		want []string
	}{
		{"openai-responses", "openai-responses", "/v1/responses", fake("openai-responses"),
			`{"api":"openai-responses","thinking":"high"}`,
			[]string{`"reasoning":{`, `"effort":"high"`, `"tools":[`, `"type":"input_image"`, `"image_url":"data:image/png;base64,`}},
		// The scene's model.baseURL is modelURL, to which the Anthropic
		// client adds its own /v1/messages (beta, ?beta=true).
		{"anthropic-messages", "anthropic-messages", "/v1/v1/messages?beta=true", fake("anthropic-messages"),
			`{"api":"anthropic-messages","thinking":"high"}`,
			[]string{`"thinking":{`, `"tools":[`, `"type":"image"`, `"media_type":"image/png"`}},
		// A stock model of Pi's catalogue whose compat names fallback
		// models (checked below in the image's own catalogue): the API from
		// the catalogue, and the compiled models.json's compat keeps Pi
		// from sending the fallbacks the route refuses. Without that compat
		// (the compiler's line taken out by hand) the route refuses the
		// turn: feature-header, the server-side-fallback beta.
		{"anthropic-stock-fallbacks", "anthropic-messages", "/v1/v1/messages?beta=true",
			`{"providers":{"anthropic":{"baseUrl":"` + modelURL + `"}}}`,
			`{"provider":"anthropic","id":"claude-fable-5","api":null,"thinking":"high"}`,
			[]string{`"thinking":{`, `"tools":[`, `"type":"image"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			var (
				mu     sync.Mutex
				bodies [][]byte
				other  []string
			)
			e.upstream = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
				mu.Lock()
				defer mu.Unlock()
				keyed := r.Header.Get("Authorization") == "Bearer "+apiKey
				if c.api == "anthropic-messages" {
					keyed = r.Header.Get("X-Api-Key") == apiKey && r.Header.Get("Authorization") == ""
				}
				if r.Method != http.MethodPost || r.URL.RequestURI() != c.uri || !keyed {
					other = append(other, fmt.Sprintf("%s %s keyed=%v", r.Method, r.URL.RequestURI(), keyed))
				} else {
					bodies = append(bodies, b)
				}
				// The API's own shape of a refused request, which Pi does
				// not retry.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				if c.api == "anthropic-messages" {
					io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"the e2e upstream takes the body only"}}`)
				} else {
					io.WriteString(w, `{"error":{"message":"the e2e upstream takes the body only","type":"invalid_request_error","param":null,"code":null}}`)
				}
			})
			e.models = c.models
			sc := e.scene(t, "pi-session", `{"model":`+c.model+`}`)
			p := e.launch(t, sc)
			ctx := ctx(t)
			p.call(t, ctx, map[string]any{"type": "prompt", "message": "what is in this picture?",
				"images": []map[string]string{{"type": "image", "mimeType": "image/png",
					"data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="}}})
			if _, _, err := p.Until(ctx, piproto.Event("agent_settled")); err != nil {
				t.Fatalf("the prompt did not settle: %v\nstderr: %s", err, p.stderr.String())
			}
			res := p.stop(t)
			mu.Lock()
			defer mu.Unlock()
			if len(other) != 0 {
				t.Errorf("the model host saw requests other than keyed POST %s: %v", c.uri, other)
			}
			rs := res.Routes["model"]
			if len(bodies) == 0 || rs.Refused != 0 || len(rs.ByReason) != 0 || rs.Forwarded != int64(len(bodies)+len(other)) {
				t.Fatalf("model route %+v, %d bodies reached the model host: want Pi's requests forwarded, none refused\nstderr: %s", rs, len(bodies), p.stderr.String())
			}
			for i, b := range bodies {
				if !bytes.Equal(b, bodies[0]) {
					t.Errorf("request %d differs from the first (a retry changed the body)", i)
				}
			}
			var m struct{ ID string }
			json.Unmarshal([]byte(c.model), &m)
			if m.ID == "" {
				m.ID = "fake-1"
			}
			for _, want := range append(c.want, `"model":"`+m.ID+`"`) {
				if !bytes.Contains(bodies[0], []byte(want)) {
					t.Errorf("Pi's %s request never held %s: the turn did not exercise it\n%.2000s", c.api, want, bodies[0])
				}
			}
			for _, never := range []string{`"fallbacks"`, `"thread"`} {
				if bytes.Contains(bodies[0], []byte(never)) {
					t.Errorf("Pi's %s request held %s", c.api, never)
				}
			}
			if c.name == "anthropic-stock-fallbacks" {
				// What the compiled compat turned off: the image's catalogue
				// gives this model fallback models.
				cat, err := os.ReadFile(filepath.Join(e.image.Rootfs, "opt/pi/node_modules/@earendil-works/pi-ai/dist/providers/data/anthropic.json"))
				if err != nil {
					t.Fatal(err)
				}
				var doc map[string]map[string]struct {
					Compat struct{ AllowedFallbackModels []any }
				}
				if err := json.Unmarshal(cat, &doc); err != nil {
					t.Fatal(err)
				}
				if len(doc["anthropic-messages"]["chat:claude-fable-5"].Compat.AllowedFallbackModels) == 0 {
					t.Errorf("the image's catalogue gives claude-fable-5 no fallback models: this case proves nothing")
				}
				return // the corpus has its fake model's body
			}
			if os.Getenv("PASEO_UPDATE") == "1" {
				dir := testbundle.Repo(t, filepath.Join("runtime/launcher/routeproxy/testdata", e.image.piDir(), c.api))
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "first.json"), corpusBody(t, e, bodies[0]), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// piDir is the corpus directory of the image's Pi: pi-<Pi's version>.
func (im imageInfo) piDir() string { return "pi-" + im.Pi }
