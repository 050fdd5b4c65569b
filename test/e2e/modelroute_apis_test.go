package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
	for _, c := range []struct {
		api, baseURL, path string
		// members the body must hold, so the request exercised them
		want []string
	}{
		{"openai-responses", modelURL, "/v1/responses",
			[]string{`"reasoning":{`, `"effort":"high"`, `"tools":[`, `"type":"input_image"`, `"image_url":"data:image/png;base64,`}},
		// The scene's model.baseURL is modelURL, to which the Anthropic
		// client adds its own /v1/messages.
		{"anthropic-messages", modelURL, "/v1/v1/messages",
			[]string{`"thinking":{`, `"tools":[`, `"type":"image"`, `"media_type":"image/png"`}},
	} {
		t.Run(c.api, func(t *testing.T) {
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
				if r.Method != http.MethodPost || r.URL.Path != c.path || !keyed {
					other = append(other, fmt.Sprintf("%s %s keyed=%v", r.Method, r.URL.Path, keyed))
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
			e.models = `{"providers":{"fake":{"baseUrl":"` + c.baseURL + `","api":"` + c.api + `","apiKey":"$FAKE_LLM_KEY",
 "models":[{"id":"fake-1","reasoning":true,"input":["text","image"],"contextWindow":128000,"maxTokens":16384}]}}}`
			sc := e.scene(t, "pi-session", fmt.Sprintf(`{"model":{"baseURL":%q,"api":%q,"thinking":"high"}}`, c.baseURL, c.api))
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
				t.Errorf("the model host saw requests other than keyed POST %s: %v", c.path, other)
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
			for _, want := range append(c.want, `"model":"fake-1"`) {
				if !bytes.Contains(bodies[0], []byte(want)) {
					t.Errorf("Pi's %s request never held %s: the turn did not exercise it\n%.2000s", c.api, want, bodies[0])
				}
			}
			if os.Getenv("PASEO_UPDATE") == "1" {
				dir := testbundle.Repo(t, filepath.Join("runtime/launcher/routeproxy/testdata", e.image.piDir(), c.api))
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				var v any
				if err := json.Unmarshal(bodies[0], &v); err != nil {
					t.Fatal(err)
				}
				out, _ := json.MarshalIndent(v, "", " ")
				out = bytes.ReplaceAll(out, []byte(e.host), nil)
				if err := os.WriteFile(filepath.Join(dir, "first.json"), append(out, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// piDir is the corpus directory of the image's Pi: pi-<Pi's version>.
func (im imageInfo) piDir() string {
	v := strings.TrimPrefix(im.Version, "pi-")
	if i := strings.LastIndex(v, "-"); i > 0 {
		v = v[:i]
	}
	return "pi-" + v
}
