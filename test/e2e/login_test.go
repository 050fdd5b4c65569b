package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// subscription is a fake subscription provider on the model host: the
// fake model's Anthropic messages API, which takes only the login's
// current access token as a bearer, and the login's token endpoint, which
// rotates both tokens at each refresh as Anthropic's does. It records the
// OAuth headers of every messages request.
type subscription struct {
	e       *env
	mu      sync.Mutex
	access  string
	refresh string
	revoked bool
	// refreshes counts the token endpoint's successful refreshes.
	refreshes int
	seen      []http.Header
}

func randomHex(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newSubscription makes the env's model host the subscription provider
// and writes the daemon's auth.json holding its login for provider
// "fake", expiring in expiresIn.
func newSubscription(e *env, expiresIn time.Duration) *subscription {
	s := &subscription{e: e, access: randomHex("sk-ant-oat01-"), refresh: randomHex("sk-ant-ort01-")}
	e.mu.Lock()
	e.fm.SetAPIKey(s.access)
	e.upstream = http.HandlerFunc(s.serve)
	e.mu.Unlock()
	e.auth = s.authJSON(s.access, s.refresh, expiresIn)
	return s
}

func (s *subscription) authJSON(access, refresh string, expiresIn time.Duration) string {
	return fmt.Sprintf(`{"fake":{"type":"oauth","access":%q,"refresh":%q,"expires":%d}}`, access, refresh, time.Now().Add(expiresIn).UnixMilli())
}

func (s *subscription) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/oauth/token" && r.Method == http.MethodPost {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.revoked || body["grant_type"] != "refresh_token" || body["refresh_token"] != s.refresh || body["client_id"] == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant","error_description":"Refresh token not found or invalid"}`))
			return
		}
		s.refreshes++
		s.access, s.refresh = randomHex("sk-ant-oat01-"), randomHex("sk-ant-ort01-")
		s.e.mu.Lock()
		s.e.fm.SetAPIKey(s.access)
		s.e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": s.access, "refresh_token": s.refresh, "expires_in": 28800, "token_type": "Bearer"})
		return
	}
	s.mu.Lock()
	s.seen = append(s.seen, r.Header.Clone())
	s.mu.Unlock()
	s.e.mu.Lock()
	fm := s.e.fm
	s.e.mu.Unlock()
	fm.Handler().ServeHTTP(w, r)
}

// tokens are every token the login has had.
func (s *subscription) tokens(extra ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string{s.access, s.refresh}, extra...)
}

// A real Pi 1.6.0 turn with a brokered subscription login (issue 35): the
// sandbox's Pi holds the OAuth-shaped placeholder, so it takes its OAuth
// code path (a bearer, the Claude Code and OAuth betas, the claude-cli
// identity); the route swaps in the login's access token, which it first
// refreshes at the token endpoint (the login expires within Pi's margin),
// writing the rotated tokens back to the daemon's auth.json (owner and
// mode kept, Pi's lock released). The provider sees only the real access
// token, and no token is in the bundle.
func TestPiModelLoginAnthropic(t *testing.T) {
	e := newEnv(t, fakemodel.Text("hello from the subscription"))
	e.baseURL = strings.TrimSuffix(modelURL, "/v1")
	e.models = `{"providers":{"fake":{"baseUrl":"` + e.baseURL + `","api":"anthropic-messages",
 "apiKey":"$FAKE_LLM_KEY",
 "models":[{"id":"fake-1","input":["text"],"contextWindow":64000,"maxTokens":16384}]}}}`
	sub := newSubscription(e, 2*time.Minute) // within Pi's five-minute margin: the route refreshes
	first := sub.tokens()
	sc := e.scene(t, "pi-session", fmt.Sprintf(`{"model":{"api":"anthropic-messages"},
 "credential":{"mode":"oauth-broker","env":null,"secretRef":null,"authFile":%q,
  "refreshURLs":["https://llm.example.test:8443/v1/oauth/token"]}}`, filepath.Join(e.host, "srv/paseo/state/pi-agent/auth.json")))
	p := e.launch(t, sc)
	c := ctx(t)
	events := p.turn(t, c, "say hello")
	var raw strings.Builder
	for _, f := range events {
		raw.Write(f.Raw)
	}
	if !strings.Contains(raw.String(), "hello from the subscription") {
		t.Fatalf("the turn did not get the model's answer: %.600s\nstderr: %s", raw.String(), p.stderr.String())
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
	seen, refreshes := sub.seen, sub.refreshes
	sub.mu.Unlock()
	for _, h := range seen {
		beta := h.Get("Anthropic-Beta")
		if !strings.Contains(beta, "claude-code-20250219") || !strings.Contains(beta, "oauth-2025-04-20") {
			t.Errorf("the provider got anthropic-beta %q: not Pi's OAuth betas", beta)
		}
		if ua := h.Get("User-Agent"); !strings.HasPrefix(ua, "claude-cli/") || h.Get("X-App") != "cli" {
			t.Errorf("the provider got user-agent %q, x-app %q: not Pi's Claude Code identity", ua, h.Get("X-App"))
		}
	}
	for _, r := range reqs {
		if r.Body != nil && !bytes.Contains(r.Body, []byte("You are Claude Code")) {
			t.Errorf("%s %s: Pi was not on its OAuth path (no Claude Code system prompt)", r.Method, r.Path)
		}
	}
	if refreshes != 1 {
		t.Errorf("%d refreshes at the token endpoint, want 1 (by the route, on the host)", refreshes)
	}
	if rs := res.Routes["model"]; rs.Refused != 0 || rs.Forwarded != int64(len(reqs)) {
		t.Errorf("model route %+v, want the provider's %d requests forwarded and none refused", rs, len(reqs))
	}

	// The daemon's auth.json holds the rotated login, as the host's Pi
	// would have written it, still the daemon's and 0600; no lock is left.
	authPath := filepath.Join(sc.Host, "srv/paseo/state/pi-agent/auth.json")
	data, err := os.ReadFile(authPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]struct {
		Type, Access, Refresh string
		Expires               int64
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	now := sub.tokens()
	if got := doc["fake"]; got.Type != "oauth" || got.Access != now[0] || got.Refresh != now[1] || time.Until(time.UnixMilli(got.Expires)) < 7*time.Hour {
		t.Errorf("auth.json after the refresh does not hold the rotated login")
	}
	st, err := os.Stat(authPath)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 1000 || sys.Gid != 1000 || st.Mode().Perm() != 0o600 {
		t.Errorf("auth.json is %d:%d %v after the route's write, want the daemon's 1000:1000 0600", sys.Uid, sys.Gid, st.Mode().Perm())
	}
	if _, err := os.Stat(authPath + ".lock"); !os.IsNotExist(err) {
		t.Errorf("auth.json.lock left behind: %v", err)
	}

	// No token, old or new, in the bundle (what the sandbox is made of).
	all := append(first, now...)
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

// A revoked login (issue 35): the token endpoint answers invalid_grant,
// so the route ends Pi's request with a 401 whose message names the
// re-login, which Pi shows; a new login written to the daemon's auth.json
// is used from the next turn, with the sandbox still running.
func TestPiModelLoginRevokedAndRelogin(t *testing.T) {
	e := newEnv(t, fakemodel.Text("before the revocation"), fakemodel.Text("after the new login"))
	e.baseURL = strings.TrimSuffix(modelURL, "/v1")
	e.models = `{"providers":{"fake":{"baseUrl":"` + e.baseURL + `","api":"anthropic-messages",
 "apiKey":"$FAKE_LLM_KEY",
 "models":[{"id":"fake-1","input":["text"],"contextWindow":64000,"maxTokens":16384}]}}}`
	sub := newSubscription(e, 8*time.Hour)
	authPath := filepath.Join(e.host, "srv/paseo/state/pi-agent/auth.json")
	sc := e.scene(t, "pi-session", fmt.Sprintf(`{"model":{"api":"anthropic-messages"},
 "credential":{"mode":"oauth-broker","env":null,"secretRef":null,"authFile":%q,
  "refreshURLs":["https://llm.example.test:8443/v1/oauth/token"]}}`, authPath))
	p := e.launch(t, sc)
	c := ctx(t)
	text := func(events []piproto.Frame) string {
		var raw strings.Builder
		for _, f := range events {
			raw.Write(f.Raw)
		}
		return raw.String()
	}
	if got := text(p.turn(t, c, "first")); !strings.Contains(got, "before the revocation") {
		t.Fatalf("the first turn: %.600s", got)
	}
	// The login expires and the provider revokes it: the route's refresh
	// is refused.
	sub.mu.Lock()
	sub.revoked = true
	access, refresh := sub.access, sub.refresh
	sub.mu.Unlock()
	writeAuth := func(s string) {
		if err := os.WriteFile(authPath, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeAuth(sub.authJSON(access, refresh, -time.Minute))
	got := text(p.turn(t, c, "second"))
	if !strings.Contains(got, `"stopReason":"error"`) || !strings.Contains(got, "log in again on the host") {
		t.Fatalf("the turn with a revoked login did not end in the route's error naming the re-login: %.800s", got)
	}
	if strings.Contains(got, access) || strings.Contains(got, refresh) {
		t.Error("Pi's events carry a login token")
	}
	// The operator logs in again on the host: a new login in auth.json.
	sub.mu.Lock()
	sub.revoked = false
	sub.access, sub.refresh = randomHex("sk-ant-oat01-"), randomHex("sk-ant-ort01-")
	na, nr := sub.access, sub.refresh
	sub.mu.Unlock()
	e.mu.Lock()
	e.fm.SetAPIKey(na)
	e.mu.Unlock()
	writeAuth(sub.authJSON(na, nr, 8*time.Hour))
	if got := text(p.turn(t, c, "third")); !strings.Contains(got, "after the new login") {
		t.Fatalf("the turn after the new login: %.800s", got)
	}
	res := p.stop(t)
	if rs := res.Routes["model"]; rs.Refused < 1 {
		t.Errorf("model route %+v: the revoked login's request is not counted refused", rs)
	}
}

// The login through the supervisor (issue 35): the holder's route reads
// the deployment's auth.json itself (no key is handed over), a turn
// refreshes the login on the host, and a login replaced while the sandbox
// sleeps is the woken route's, with no token in the checkpoint.
func TestPiModelLoginThroughSupervisor(t *testing.T) {
	e := newEnv(t, fakemodel.Text("reply 0."), fakemodel.Text("reply 1."))
	e.baseURL = strings.TrimSuffix(modelURL, "/v1")
	e.models = `{"providers":{"fake":{"baseUrl":"` + e.baseURL + `","api":"anthropic-messages",
 "apiKey":"$FAKE_LLM_KEY",
 "models":[{"id":"fake-1","input":["text"],"contextWindow":64000,"maxTokens":16384}]}}}`
	sub := newSubscription(e, time.Minute) // the first turn refreshes
	authPath := filepath.Join(e.host, "srv/paseo/state/pi-agent/auth.json")
	sc := e.scene(t, "pi-session", fmt.Sprintf(`{"model":{"api":"anthropic-messages"},
 "credential":{"mode":"oauth-broker","env":null,"secretRef":null,"authFile":%q,
  "refreshURLs":["https://llm.example.test:8443/v1/oauth/token"]}}`, authPath))
	h := e.hibernateHarness(t, sc.Registry, sc.State, sc.Runsc)
	h.create(t, sc.Facts)
	h.turn(t, 0)
	sub.mu.Lock()
	refreshes, refreshed := sub.refreshes, []string{sub.access, sub.refresh}
	sub.mu.Unlock()
	if refreshes != 1 {
		t.Errorf("%d refreshes by the holder's route, want 1", refreshes)
	}
	h.hibernate(t)
	img := filepath.Join(statedir.HibernateDir(sc.State, h.id), "image")
	ents, err := os.ReadDir(img)
	if err != nil || len(ents) == 0 {
		t.Fatalf("checkpoint image: %v", err)
	}
	for _, ent := range ents {
		data, err := os.ReadFile(filepath.Join(img, ent.Name()))
		if err != nil {
			continue
		}
		for _, tok := range refreshed {
			if bytes.Contains(data, []byte(tok)) {
				t.Errorf("checkpoint file %s holds a login token", ent.Name())
			}
		}
	}
	// A new login on the host while the sandbox sleeps.
	sub.mu.Lock()
	sub.access, sub.refresh = randomHex("sk-ant-oat01-"), randomHex("sk-ant-ort01-")
	na, nr := sub.access, sub.refresh
	sub.mu.Unlock()
	e.mu.Lock()
	e.fm.SetAPIKey(na)
	e.mu.Unlock()
	if err := os.WriteFile(authPath, []byte(sub.authJSON(na, nr, 8*time.Hour)), 0o600); err != nil {
		t.Fatal(err)
	}
	h.turn(t, 1) // wakes it
	for _, r := range e.requests() {
		if !r.Authorized {
			t.Errorf("%s %s reached the provider without the login's current access token", r.Method, r.Path)
		}
	}
	if err := h.cl.Call(ctx(t), supervisor.Request{Op: "delete", Sandbox: h.id}, nil); err != nil {
		t.Fatal(err)
	}
}
