package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
)

// codexSubscription is a fake ChatGPT subscription on the model host:
// POST /backend-api/codex/responses (answered by the fake model's
// Responses stream) takes only the login's current access token and its
// ChatGPT account id, and /oauth/token refreshes the login form-encoded,
// rotating both tokens, as OpenAI's does.
type codexSubscription struct {
	e       *env
	mu      sync.Mutex
	access  string
	refresh string
	// refreshes counts the token endpoint's successful refreshes.
	refreshes int
	seen      []http.Header
	bodies    [][]byte
	upgrades  int
}

const codexTestAccount = "acct-e2e-5b1d"

func codexAccessToken() string {
	enc := base64.RawURLEncoding.EncodeToString
	payload, _ := json.Marshal(map[string]any{"https://api.openai.com/auth": map[string]string{"chatgpt_account_id": codexTestAccount}, "jti": randomHex("")})
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc(payload) + "." + randomHex("sig")
}

func (s *codexSubscription) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/oauth/token" && r.Method == http.MethodPost {
		ok := r.Header.Get("Content-Type") == "application/x-www-form-urlencoded" && r.ParseForm() == nil
		s.mu.Lock()
		defer s.mu.Unlock()
		if !ok || r.PostForm.Get("grant_type") != "refresh_token" || r.PostForm.Get("refresh_token") != s.refresh || r.PostForm.Get("client_id") == "" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		s.refreshes++
		s.access, s.refresh = codexAccessToken(), randomHex("rt_")
		s.e.mu.Lock()
		s.e.fm.SetAPIKey(s.access)
		s.e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": s.access, "refresh_token": s.refresh, "expires_in": 864000})
		return
	}
	if r.URL.Path != "/backend-api/codex/responses" {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.seen = append(s.seen, r.Header.Clone())
	s.bodies = append(s.bodies, body)
	if r.Header.Get("Upgrade") != "" {
		s.upgrades++
	}
	s.mu.Unlock()
	if r.Header.Get("Chatgpt-Account-Id") != codexTestAccount {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"detail":"account mismatch"}`))
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/v1/responses"
	r2.Body = io.NopCloser(bytes.NewReader(body))
	s.e.mu.Lock()
	fm := s.e.fm
	s.e.mu.Unlock()
	fm.Handler().ServeHTTP(w, r2)
}

// A real Pi 1.6.0 turn on its Codex subscription path (issue 35): the
// sandbox's Pi holds the JWT-shaped placeholder, so it takes it for a
// Codex login; it tries a WebSocket first, which the route refuses, and
// falls back to POST /codex/responses with a zstd body, which the route
// decompresses, checks and forwards uncompressed with the login's access
// token (refreshed first, form-encoded, on the host) and ChatGPT account
// id. The provider sees Pi's originator, beta and session headers and no
// upgrade; no token is in the bundle.
func TestPiModelLoginCodex(t *testing.T) {
	e := newEnv(t, fakemodel.Text("hello from the codex subscription"))
	e.baseURL = strings.TrimSuffix(modelURL, "/v1") + "/backend-api"
	e.models = `{"providers":{"fake":{"baseUrl":"` + e.baseURL + `","api":"openai-codex-responses",
 "apiKey":"$FAKE_LLM_KEY",
 "models":[{"id":"fake-1","input":["text"],"contextWindow":64000,"maxTokens":16384}]}}}`
	sub := &codexSubscription{e: e, access: codexAccessToken(), refresh: randomHex("rt_")}
	e.mu.Lock()
	e.fm.SetAPIKey(sub.access)
	e.upstream = http.HandlerFunc(sub.serve)
	e.mu.Unlock()
	first := []string{sub.access, sub.refresh}
	e.auth = fmt.Sprintf(`{"fake":{"type":"oauth","access":%q,"refresh":%q,"expires":%d,"accountId":%q}}`, sub.access, sub.refresh, time.Now().Add(2*time.Minute).UnixMilli(), codexTestAccount)
	sc := e.scene(t, "pi-session", fmt.Sprintf(`{"model":{"api":"openai-codex-responses"},
 "credential":{"mode":"oauth-broker","env":null,"secretRef":null,"authFile":%q,
  "refreshURLs":["https://llm.example.test:8443/oauth/token"]}}`, filepath.Join(e.host, "srv/paseo/state/pi-agent/auth.json")))
	p := e.launch(t, sc)
	c := ctx(t)
	events := p.turn(t, c, "say hello")
	var raw strings.Builder
	for _, f := range events {
		raw.Write(f.Raw)
	}
	if !strings.Contains(raw.String(), "hello from the codex subscription") {
		s := raw.String()
		t.Fatalf("the turn did not get the model's answer: ...%s", s[max(0, len(s)-1500):])
	}
	res := p.stop(t)

	reqs := e.requests()
	if len(reqs) == 0 {
		t.Fatal("no request reached the provider")
	}
	for _, r := range reqs {
		if !r.Authorized {
			t.Errorf("%s %s reached the provider without the login's current access token", r.Method, r.Path)
		}
	}
	sub.mu.Lock()
	seen, bodies, refreshes, upgrades, access, refresh := sub.seen, sub.bodies, sub.refreshes, sub.upgrades, sub.access, sub.refresh
	sub.mu.Unlock()
	if upgrades != 0 {
		t.Errorf("%d WebSocket upgrades reached the provider", upgrades)
	}
	for i, h := range seen {
		for name, want := range map[string]string{"Chatgpt-Account-Id": codexTestAccount, "Originator": "pi", "Openai-Beta": "responses=experimental", "Content-Encoding": ""} {
			if h.Get(name) != want {
				t.Errorf("request %d: the provider got %s %q, want %q", i, name, h.Get(name), want)
			}
		}
		if h.Get("Session-Id") == "" {
			t.Errorf("request %d: no session-id", i)
		}
		var doc map[string]any
		if err := json.Unmarshal(bodies[i], &doc); err != nil || doc["model"] != "fake-1" || doc["parallel_tool_calls"] != true {
			t.Errorf("request %d: the provider got a body that is not Pi's Codex JSON uncompressed: %.200q", i, bodies[i])
		}
	}
	if refreshes != 1 {
		t.Errorf("%d refreshes at the token endpoint, want 1 (by the route, on the host)", refreshes)
	}
	// Pi's WebSocket was refused (at least once: Pi then keeps to HTTP
	// for the session), and every turn it sent over HTTP was forwarded.
	// Each was sent zstd-compressed, and decompressed by the route.
	if rs := res.Routes["model"]; rs.Refused < 1 || rs.Refused != rs.OutOfScope || rs.Forwarded != int64(len(reqs)) || rs.Decompressed != int64(len(reqs)) {
		t.Errorf("model route %+v, want Pi's WebSocket refused and the provider's %d requests forwarded, each decompressed", rs, len(reqs))
	}

	authPath := filepath.Join(sc.Host, "srv/paseo/state/pi-agent/auth.json")
	data, err := os.ReadFile(authPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]struct {
		Type, Access, Refresh, AccountID string
		Expires                          int64
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if got := doc["fake"]; got.Type != "oauth" || got.Access != access || got.Refresh != refresh || got.AccountID != codexTestAccount || time.Until(time.UnixMilli(got.Expires)) < 239*time.Hour {
		t.Errorf("auth.json after the refresh does not hold the rotated login with its account")
	}
	all := append(first, access, refresh)
	err = filepath.WalkDir(sc.Bundle, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, tok := range all {
			if bytes.Contains(b, []byte(tok)) {
				t.Errorf("%s holds a login token", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
