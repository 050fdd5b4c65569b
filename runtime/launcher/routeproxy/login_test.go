package routeproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// A login route's world: a subscription provider (the messages API and
// its token endpoint, on one TLS host as the fake model is) and the route
// in front of it, brokering the login in a temporary auth.json.
type loginWorld struct {
	*modelWorld
	authFile string
	login    *Login
	mu       sync.Mutex
	access   string // the access token the provider accepts now
	refresh  string // the refresh token the token endpoint accepts now
	revoked  bool
	refreshN atomic.Int64
	// seen: the headers of the last messages request.
	seen http.Header
}

func randomToken(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

const anthropicLoginBody = `{"model":"claude-x","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

var loginRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "",
	Upstream: "https://llm.example.test:8443", API: "anthropic-messages", Credential: grant.ModelLoginCredential,
	Requests: []string{"POST /v1/messages?beta=true"}, Model: "claude-x",
	Headers:    []string{"anthropic-version: 2023-06-01", "anthropic-beta: claude-code-20250219", "anthropic-beta: oauth-2025-04-20"},
	LoginEntry: "anthropic", LoginRefresh: "https://llm.example.test:8443/v1/oauth/token"}

// newLoginWorld writes auth.json with an access token that expires in
// expiresIn (negative: already expired).
func newLoginWorld(t *testing.T, expiresIn time.Duration) *loginWorld {
	t.Helper()
	w := &loginWorld{access: randomToken("sk-ant-oat01-"), refresh: randomToken("sk-ant-ort01-")}
	dir := t.TempDir()
	w.authFile = filepath.Join(dir, "auth.json")
	w.writeLogin(t, w.access, w.refresh, expiresIn)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/oauth/token", func(rw http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.revoked || body["grant_type"] != "refresh_token" || body["client_id"] != anthropicClientID || body["refresh_token"] != w.refresh {
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusBadRequest)
			_, _ = rw.Write([]byte(`{"error":"invalid_grant","error_description":"Refresh token not found or invalid"}`))
			return
		}
		w.refreshN.Add(1)
		w.access, w.refresh = randomToken("sk-ant-oat01-"), randomToken("sk-ant-ort01-")
		_ = json.NewEncoder(rw).Encode(map[string]any{"access_token": w.access, "refresh_token": w.refresh, "expires_in": 28800, "token_type": "Bearer"})
	})
	mux.HandleFunc("POST /v1/messages", func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		ok := r.Header.Get("Authorization") == "Bearer "+w.access
		w.seen = r.Header.Clone()
		w.mu.Unlock()
		if !ok {
			rw.WriteHeader(http.StatusUnauthorized)
			_, _ = rw.Write([]byte(`{"type":"error","error":{"type":"authentication_error","message":"invalid bearer"}}`))
			return
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	})
	r := loginRoute
	r.LoginFile = w.authFile
	w.modelWorld = newModelWorldFor(t, r, mux, func(o *ModelOptions) {
		l, err := OpenLogin(r, o.Dial, o.Roots)
		if err != nil {
			t.Fatal(err)
		}
		w.login = l
		o.Key, o.Login = l.Key(), l
	})
	return w
}

func (w *loginWorld) writeLogin(t *testing.T, access, refresh string, expiresIn time.Duration) {
	t.Helper()
	doc := map[string]any{"anthropic": map[string]any{"type": "oauth", "access": access, "refresh": refresh,
		"expires": time.Now().Add(expiresIn).UnixMilli()}, "other": map[string]any{"type": "oauth", "access": "x", "refresh": "y", "expires": 1}}
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(w.authFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// send is Pi on its OAuth path: the placeholder as a bearer, the
// subscription's betas and the Claude Code identity.
func (w *loginWorld) send(t *testing.T, edit func(*http.Request)) (*http.Response, string) {
	return w.do(t, "POST", "/messages?beta=true", anthropicLoginBody, func(r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+bundle.ModelLoginPlaceholder)
		r.Header.Set("Anthropic-Version", "2023-06-01")
		r.Header.Set("Anthropic-Beta", "claude-code-20250219,oauth-2025-04-20")
		r.Header.Set("User-Agent", "claude-cli/2.1.322")
		r.Header.Set("X-App", "cli")
		if edit != nil {
			edit(r)
		}
	})
}

func (w *loginWorld) stored(t *testing.T) (access, refresh string, expires int64) {
	t.Helper()
	data, err := os.ReadFile(w.authFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("auth.json after the route: %v", err)
	}
	if doc["other"] == nil {
		t.Error("the route's write lost another provider's entry")
	}
	e := doc["anthropic"]
	a, _ := e["access"].(string)
	r, _ := e["refresh"].(string)
	x, _ := e["expires"].(float64)
	return a, r, int64(x)
}

// A fresh login: the route swaps the placeholder for the access token and
// passes the subscription's headers as Pi sent them; nothing refreshes.
func TestLoginRouteAddsTheAccessToken(t *testing.T) {
	w := newLoginWorld(t, time.Hour)
	resp, body := w.send(t, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "message_stop") {
		t.Fatalf("routed request: %d %s", resp.StatusCode, body)
	}
	w.mu.Lock()
	seen := w.seen
	w.mu.Unlock()
	for h, want := range map[string]string{"User-Agent": "claude-cli/2.1.322", "X-App": "cli", "Anthropic-Beta": "claude-code-20250219,oauth-2025-04-20", "Anthropic-Version": "2023-06-01"} {
		if got := seen.Get(h); got != want {
			t.Errorf("the provider got %s %q, want %q", h, got, want)
		}
	}
	if n := w.refreshN.Load(); n != 0 {
		t.Errorf("%d refreshes of a login valid for an hour", n)
	}
	// Another identity is not passed on: the route's own.
	w.send(t, func(r *http.Request) { r.Header.Set("User-Agent", "curl/8"); r.Header.Set("X-App", "other") })
	w.mu.Lock()
	if ua, app := w.seen.Get("User-Agent"), w.seen.Get("X-App"); ua != "paseo-policy-model-route" || app != "" {
		t.Errorf("a foreign identity reached the provider: %q %q", ua, app)
	}
	w.mu.Unlock()
}

// The sandbox's own credential, the API-key placeholder, or the real
// token itself are refused; so is the token endpoint's path.
func TestLoginRouteRefusesOtherCredentials(t *testing.T) {
	w := newLoginWorld(t, time.Hour)
	w.mu.Lock()
	real := w.access
	w.mu.Unlock()
	for name, edit := range map[string]func(*http.Request){
		"api-key placeholder": func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+bundle.ModelRoutePlaceholder) },
		"the real token":      func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+real) },
		"x-api-key":           func(r *http.Request) { r.Header.Set("X-Api-Key", bundle.ModelLoginPlaceholder) },
	} {
		if resp, _ := w.send(t, edit); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, resp.StatusCode)
		}
	}
	resp, _ := w.do(t, "POST", "/oauth/token", `{"grant_type":"refresh_token"}`, nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the token endpoint through the route: %d, want 404", resp.StatusCode)
	}
	if n := w.refreshN.Load(); n != 0 {
		t.Errorf("%d refreshes reached the token endpoint", n)
	}
}

// A login about to expire is refreshed on the host, once, and the new
// tokens are written back to auth.json (its mode kept, other entries
// kept), so the host's own Pi reads them; the request carries the new
// access token.
func TestLoginRouteRefreshes(t *testing.T) {
	w := newLoginWorld(t, 2*time.Minute) // inside Pi's five-minute margin
	_, oldRefresh, _ := w.stored(t)
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := w.send(t, nil)
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Errorf("request %d: %d", i, c)
		}
	}
	if n := w.refreshN.Load(); n != 1 {
		t.Errorf("%d refreshes for concurrent requests, want 1", n)
	}
	access, refresh, expires := w.stored(t)
	w.mu.Lock()
	wantA, wantR := w.access, w.refresh
	w.mu.Unlock()
	if access != wantA || refresh != wantR || refresh == oldRefresh {
		t.Error("auth.json does not hold the refreshed tokens")
	}
	if d := time.Until(time.UnixMilli(expires)); d < 7*time.Hour || d > 8*time.Hour {
		t.Errorf("expires in %s, want expires_in less Pi's five minutes", d)
	}
	st, err := os.Stat(w.authFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("auth.json after the write: %v %v", st.Mode(), err)
	}
	if _, err := os.Stat(w.authFile + ".lock"); !os.IsNotExist(err) {
		t.Errorf("the lock was left behind: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Dir(w.authFile))
	if len(ents) != 1 {
		t.Errorf("the directory holds %d entries after the write, want auth.json only", len(ents))
	}
}

// Two routes of one deployment (two sandboxes) share one refresh: the
// second finds the login refreshed under the lock and does not spend the
// rotated refresh token again.
func TestLoginRouteTwoSandboxesShareOneRefresh(t *testing.T) {
	w := newLoginWorld(t, time.Minute)
	r := loginRoute
	r.LoginFile = w.authFile
	second, err := OpenLogin(r, func(ctx context.Context, network, _ string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if resp, _ := w.send(t, nil); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	// The second cannot reach the token endpoint at all: it must not need to.
	k, err := second.Access(context.Background())
	w.mu.Lock()
	want := w.access
	w.mu.Unlock()
	if err != nil || string(k) != want {
		t.Errorf("the second route did not take the refreshed login: %v", err)
	}
	if n := w.refreshN.Load(); n != 1 || second.Refreshes.Load() != 0 {
		t.Errorf("%d refreshes, the second's %d; want 1 and 0", n, second.Refreshes.Load())
	}
}

// Pi's lock is respected: while another holder (the host's Pi) holds
// auth.json.lock the route waits, and uses what that holder wrote; a
// lock older than Pi's stale time is a dead holder's and taken over.
func TestLoginRouteRespectsPiLock(t *testing.T) {
	w := newLoginWorld(t, time.Minute)
	lock := w.authFile + ".lock"
	if err := os.Mkdir(lock, 0o755); err != nil {
		t.Fatal(err)
	}
	fresh := randomToken("sk-ant-oat01-")
	go func() {
		time.Sleep(500 * time.Millisecond)
		// The host's Pi refreshed meanwhile and releases its lock.
		w.mu.Lock()
		w.access = fresh
		w.mu.Unlock()
		w.writeLogin(t, fresh, randomToken("sk-ant-ort01-"), 8*time.Hour)
		os.Remove(lock)
	}()
	start := time.Now()
	resp, _ := w.send(t, nil)
	if resp.StatusCode != 200 || time.Since(start) < 400*time.Millisecond {
		t.Errorf("with Pi's lock held: %d after %s; want 200 after the holder released it", resp.StatusCode, time.Since(start))
	}
	if n := w.refreshN.Load(); n != 0 {
		t.Errorf("the route refreshed %d times though Pi had", n)
	}
	// A dead holder's lock.
	w.writeLogin(t, fresh, w.refresh, time.Minute)
	if err := os.Mkdir(lock, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	os.Chtimes(lock, old, old)
	w.mu.Lock()
	w.refresh = func() string { _, r, _ := w.stored(t); return r }()
	w.mu.Unlock()
	if resp, _ := w.send(t, nil); resp.StatusCode != 200 || w.refreshN.Load() != 1 {
		t.Errorf("with a stale lock: %d, %d refreshes; want 200 and 1", resp.StatusCode, w.refreshN.Load())
	}
}

// A revoked login ends routed requests with a 401 in Anthropic's shape
// that names the re-login; a new login written to auth.json is used from
// the next request, with nothing restarted. No token is in the answer.
func TestLoginRouteRevokedAndRelogin(t *testing.T) {
	w := newLoginWorld(t, time.Minute)
	w.mu.Lock()
	w.revoked = true
	w.mu.Unlock()
	resp, body := w.send(t, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "authentication_error") || !strings.Contains(body, "log in again on the host") {
		t.Fatalf("revoked login: %d %s", resp.StatusCode, body)
	}
	data, _ := os.ReadFile(w.authFile)
	var doc map[string]map[string]any
	_ = json.Unmarshal(data, &doc)
	for _, tok := range []any{doc["anthropic"]["access"], doc["anthropic"]["refresh"]} {
		if s, _ := tok.(string); s != "" && strings.Contains(body, s) {
			t.Error("the refusal carries a token")
		}
	}
	// The operator logs in again on the host.
	a, r := randomToken("sk-ant-oat01-"), randomToken("sk-ant-ort01-")
	w.mu.Lock()
	w.access, w.refresh, w.revoked = a, r, false
	w.mu.Unlock()
	w.writeLogin(t, a, r, 8*time.Hour)
	if resp, body := w.send(t, nil); resp.StatusCode != 200 {
		t.Errorf("after a new login: %d %s", resp.StatusCode, body)
	}
}

// A read that meets Pi's in-place write half done is decided again under
// Pi's lock, once the writer released it: the request succeeds, nothing
// refreshes.
func TestLoginRouteReadsAgainUnderTheLock(t *testing.T) {
	w := newLoginWorld(t, time.Hour)
	lock := w.authFile + ".lock"
	data, err := os.ReadFile(w.authFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(lock, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.authFile, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = os.WriteFile(w.authFile, data, 0o600)
		_ = os.Remove(lock)
	}()
	if resp, body := w.send(t, nil); resp.StatusCode != 200 {
		t.Errorf("during Pi's write: %d %s", resp.StatusCode, body)
	}
	if n := w.refreshN.Load(); n != 0 {
		t.Errorf("%d refreshes", n)
	}
}
