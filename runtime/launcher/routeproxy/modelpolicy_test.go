package routeproxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// recorder is a provider that records what arrives and answers 200.
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	path   string
	header http.Header
	body   string
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, recorded{r.URL.Path, r.Header.Clone(), string(b)})
	rc.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{}`)
}

func (rc *recorder) all() []recorded {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]recorded(nil), rc.reqs...)
}

// apiRoutes are a route per API, each with the profile's feature headers.
var apiRoutes = map[string]bundle.Route{
	"openai-completions": {Purpose: "model", Listen: "gateway", Port: 18080, Path: "/v1", Upstream: "https://llm.example.test:8443/v1",
		TokenRef: "alice/k", API: "openai-completions", Credential: "authorization-bearer", Model: "m-1",
		Requests: []string{"POST /chat/completions", "GET /models"}},
	"openai-responses": {Purpose: "model", Listen: "gateway", Port: 18080, Path: "/v1", Upstream: "https://llm.example.test:8443/v1",
		TokenRef: "alice/k", API: "openai-responses", Credential: "authorization-bearer", Model: "m-1",
		Requests: []string{"POST /responses", "GET /models"}},
	"anthropic-messages": {Purpose: "model", Listen: "gateway", Port: 18080, Path: "", Upstream: "https://llm.example.test:8443",
		TokenRef: "alice/k", API: "anthropic-messages", Credential: "x-api-key", Model: "m-1",
		Requests: []string{"POST /v1/messages", "GET /v1/models"},
		Headers: []string{"anthropic-version: 2023-06-01", "anthropic-beta: fine-grained-tool-streaming-2025-05-14",
			"anthropic-beta: interleaved-thinking-2025-05-14"}},
}

var apiPaths = map[string]string{"openai-completions": "/chat/completions", "openai-responses": "/responses", "anthropic-messages": "/v1/messages"}

// piHeaders sets the headers Pi's client sends for the API.
func piHeaders(api string) func(*http.Request) {
	return func(r *http.Request) {
		if api == "anthropic-messages" {
			r.Header.Del("Authorization")
			r.Header.Set("X-Api-Key", bundle.ModelRoutePlaceholder)
			r.Header.Set("Anthropic-Version", "2023-06-01")
			r.Header.Set("Anthropic-Dangerous-Direct-Browser-Access", "true")
		}
	}
}

func (w *modelWorld) forAPI(api string) string {
	return strings.TrimSuffix(w.url, "/v1") + apiRoutes[api].Path
}

// Every attack body reaches the route as Pi's client would send it and
// is refused with an error in the API's own shape, counted by reason,
// and nothing reaches the provider; Pi's own bodies pass, as checked.
func TestModelRouteBodyPolicy(t *testing.T) {
	for api := range apiRoutes {
		t.Run(api, func(t *testing.T) {
			rec := &recorder{}
			w := newModelWorldFor(t, apiRoutes[api], rec, nil)
			w.url = w.forAPI(api)
			want := map[string]int64{}
			for _, c := range bodyAttacks {
				if c.api != api {
					continue
				}
				resp, body := w.do(t, "POST", apiPaths[api], c.body, piHeaders(api))
				wantStatus := http.StatusForbidden
				if c.reason == ReasonShape || c.reason == ReasonUnknownMember || c.reason == ReasonProviderState {
					wantStatus = http.StatusBadRequest
				}
				if resp.StatusCode != wantStatus || resp.Header.Get("Content-Type") != "application/json" {
					t.Errorf("%s: %d %s, want %d application/json", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), wantStatus)
				}
				var doc struct {
					Type  string `json:"type"`
					Error struct {
						Type, Message, Code, Param string
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(body), &doc); err != nil || doc.Error.Message == "" {
					t.Errorf("%s: answer %q is not the API's error object", c.name, body)
				}
				if api == "anthropic-messages" && doc.Type != "error" {
					t.Errorf("%s: anthropic error type %q", c.name, doc.Type)
				}
				if api != "anthropic-messages" && (doc.Error.Param != c.path || doc.Error.Code != "paseo_route_"+strings.ReplaceAll(c.reason.String(), "-", "_")) {
					t.Errorf("%s: param %q code %q", c.name, doc.Error.Param, doc.Error.Code)
				}
				want[c.reason.String()]++
			}
			if got := rec.all(); len(got) != 0 {
				t.Fatalf("refused bodies reached the provider: %v", got)
			}
			if got := w.proxy.Stats.Refusals(); !equalCounts(got, want) {
				t.Errorf("refusals by reason %v, want %v", got, want)
			}
			for i, b := range piBodies[api] {
				if resp, body := w.do(t, "POST", apiPaths[api], b, piHeaders(api)); resp.StatusCode != 200 {
					t.Errorf("Pi's body %d: %d %s", i, resp.StatusCode, body)
				}
			}
			got := rec.all()
			if len(got) != len(piBodies[api]) {
				t.Fatalf("provider saw %d of Pi's %d bodies", len(got), len(piBodies[api]))
			}
			for i, r := range got {
				n, _ := decodeStrict([]byte(piBodies[api][i]))
				if r.body != string(n.bytes()) {
					t.Errorf("body %d arrived as %q, want the checked value re-encoded", i, r.body)
				}
			}
		})
	}
}

func equalCounts(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Feature headers pass with the values the route lists and only those;
// any other value, or a feature header the route does not list, is
// refused; other headers are dropped.
func TestModelRouteFeatureHeaders(t *testing.T) {
	rec := &recorder{}
	api := "anthropic-messages"
	w := newModelWorldFor(t, apiRoutes[api], rec, nil)
	w.url = w.forAPI(api)
	body := piBodies[api][0]
	set := func(kv ...string) func(*http.Request) {
		return func(r *http.Request) {
			piHeaders(api)(r)
			for i := 0; i < len(kv); i += 2 {
				r.Header.Add(kv[i], kv[i+1])
			}
		}
	}
	resp, out := w.do(t, "POST", "/v1/messages", body, set("Anthropic-Beta", "interleaved-thinking-2025-05-14, fine-grained-tool-streaming-2025-05-14", "X-Stainless-Os", "Linux", "Openai-Organization", "org-x"))
	if resp.StatusCode != 200 {
		t.Fatalf("Pi's headers refused: %d %s", resp.StatusCode, out)
	}
	h := rec.all()[0].header
	if h.Get("Anthropic-Beta") != "interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14" || h.Get("Anthropic-Version") != "2023-06-01" {
		t.Errorf("feature headers forwarded as %q / %q", h.Get("Anthropic-Beta"), h.Get("Anthropic-Version"))
	}
	for _, name := range []string{"X-Stainless-Os", "Openai-Organization", "Anthropic-Dangerous-Direct-Browser-Access"} {
		if h.Get(name) != "" {
			t.Errorf("%s reached the provider", name)
		}
	}
	for name, edit := range map[string]func(*http.Request){
		"mcp client beta":     set("Anthropic-Beta", "mcp-client-2025-04-04"),
		"listed and unlisted": set("Anthropic-Beta", "interleaved-thinking-2025-05-14,code-execution-2025-08-25"),
		"second header line":  set("Anthropic-Beta", "interleaved-thinking-2025-05-14", "Anthropic-Beta", "files-api-2025-04-14"),
		"other version":       func(r *http.Request) { piHeaders(api)(r); r.Header.Set("Anthropic-Version", "2099-01-01") },
		"openai beta":         set("OpenAI-Beta", "assistants=v2"),
		"empty item":          set("Anthropic-Beta", ","),
	} {
		if resp, out := w.do(t, "POST", "/v1/messages", body, edit); resp.StatusCode != http.StatusForbidden || !strings.Contains(out, "feature-header") {
			t.Errorf("%s: %d %s, want 403 feature-header", name, resp.StatusCode, out)
		}
	}
	if n := len(rec.all()); n != 1 {
		t.Errorf("provider saw %d requests, want only the first", n)
	}
	if got := w.proxy.Stats.ByReason[ReasonFeatureHeader].Load(); got != 6 {
		t.Errorf("feature-header refusals %d, want 6", got)
	}
	// Control: the provider takes the headers as sent where nothing
	// stands in front of it.
	direct := &recorder{}
	req, _ := http.NewRequest("POST", "/v1/messages", strings.NewReader(body))
	set("Anthropic-Beta", "mcp-client-2025-04-04")(req)
	direct.ServeHTTP(&httpRecorder{header: http.Header{}}, req)
	if got := direct.all()[0].header.Get("Anthropic-Beta"); got != "mcp-client-2025-04-04" {
		t.Errorf("control: the provider got Anthropic-Beta %q", got)
	}
}
