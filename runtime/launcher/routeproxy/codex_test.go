package routeproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// codexJWT is an access token shaped as OpenAI's: an unsigned JWT whose
// claim names account, with a random id so each is a new token.
func codexJWT(account string) string {
	enc := base64.RawURLEncoding.EncodeToString
	payload, _ := json.Marshal(map[string]any{codexClaim: map[string]string{"chatgpt_account_id": account}, "jti": randomToken("")})
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc(payload) + "." + randomToken("sig")
}

// Pi 1.6.0's Codex body (pi-ai api/openai-codex-responses.js
// buildRequestBody) for one user message.
const codexLoginBody = `{"model":"gpt-x","store":false,"stream":true,"input":[{"role":"developer","content":"You are Pi."},{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"text":{"verbosity":"low"},"include":["reasoning.encrypted_content"],"prompt_cache_key":"0199d5c2-5c1e-7000-8000-000000000001","tools":[{"type":"function","name":"read","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}}},"strict":null}],"tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"effort":"none"}}`

var codexRoute = bundle.Route{Purpose: "model", Listen: "gateway", Port: 18080, Path: "/backend-api",
	Upstream: "https://llm.example.test:8443/backend-api", API: codexAPI, Credential: grant.ModelLoginCredential,
	Requests: []string{"POST /codex/responses"}, Model: "gpt-x",
	Headers:    []string{"openai-beta: responses=experimental"},
	LoginEntry: "openai-codex", LoginRefresh: "https://llm.example.test:8443/oauth/token"}

type codexWorld struct {
	*modelWorld
	authFile string
	mu       sync.Mutex
	access   string
	refresh  string
	refreshN atomic.Int64
	// seen: the last turn's headers and body as the provider got them.
	seen   http.Header
	body   []byte
	length int64
	turns  atomic.Int64
}

const codexAccountID = "acct-0f3c9a7e-real"

func newCodexWorld(t *testing.T, expiresIn time.Duration) *codexWorld {
	t.Helper()
	w := &codexWorld{access: codexJWT(codexAccountID), refresh: randomToken("rt_")}
	w.authFile = filepath.Join(t.TempDir(), "auth.json")
	doc := map[string]any{"openai-codex": map[string]any{"type": "oauth", "access": w.access, "refresh": w.refresh,
		"expires": time.Now().Add(expiresIn).UnixMilli(), "accountId": codexAccountID}}
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(w.authFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth/token", func(rw http.ResponseWriter, r *http.Request) {
		ok := r.Header.Get("Content-Type") == "application/x-www-form-urlencoded" && r.ParseForm() == nil
		w.mu.Lock()
		defer w.mu.Unlock()
		if !ok || r.PostForm.Get("grant_type") != "refresh_token" || r.PostForm.Get("client_id") != codexClientID || r.PostForm.Get("refresh_token") != w.refresh {
			rw.WriteHeader(http.StatusBadRequest)
			_, _ = rw.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		w.refreshN.Add(1)
		w.access, w.refresh = codexJWT(codexAccountID), randomToken("rt_")
		_ = json.NewEncoder(rw).Encode(map[string]any{"access_token": w.access, "refresh_token": w.refresh, "expires_in": 864000})
	})
	mux.HandleFunc("/backend-api/codex/responses", func(rw http.ResponseWriter, r *http.Request) {
		w.turns.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		ok := r.Header.Get("Authorization") == "Bearer "+w.access
		w.seen, w.body, w.length = r.Header.Clone(), body, r.ContentLength
		w.mu.Unlock()
		if !ok || r.Method != http.MethodPost {
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte("event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n"))
	})
	r := codexRoute
	r.LoginFile = w.authFile
	w.modelWorld = newModelWorldFor(t, r, mux, func(o *ModelOptions) {
		l, err := OpenLogin(r, o.Dial, o.Roots)
		if err != nil {
			t.Fatal(err)
		}
		o.Key, o.Login = l.Key(), l
	})
	return w
}

// send is Pi's Codex turn over HTTP (buildSSEHeaders), its body zstd
// compressed as Pi compresses it.
func (w *codexWorld) send(t *testing.T, method string, body []byte, edit func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, strings.TrimSuffix(w.url, "/v1")+"/backend-api/codex/responses", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bundle.ModelCodexLoginPlaceholder)
	req.Header.Set("Chatgpt-Account-Id", bundle.ModelCodexAccount)
	req.Header.Set("Originator", "pi")
	req.Header.Set("OpenAI-Beta", "responses=experimental")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Session-Id", "0199d5c2-5c1e-7000-8000-000000000001")
	req.Header.Set("X-Client-Request-Id", "0199d5c2-5c1e-7000-8000-000000000001")
	req.Header.Set("Content-Encoding", "zstd")
	if edit != nil {
		edit(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

func zstdOf(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// The placeholder is what Pi 1.6.0 takes for a Codex login: a JWT whose
// claim names the public stand-in account (pi-ai extractAccountId).
func TestCodexPlaceholder(t *testing.T) {
	if got := codexAccount([]byte(bundle.ModelCodexLoginPlaceholder)); got != bundle.ModelCodexAccount {
		t.Fatalf("the placeholder's account claim is %q, want %q", got, bundle.ModelCodexAccount)
	}
	if codexAccount([]byte("a.b.c")) != "" || codexAccount([]byte(codexJWT("bad id with spaces"))) != "" {
		t.Fatal("a token without a plain account claim named one")
	}
}

// A Codex turn as Pi sends it over HTTP: the route refreshes the login
// (form-encoded, Pi's client id) and writes it back with its account,
// decompresses the zstd body, checks it and forwards the checked JSON
// uncompressed with its own length, with the login's bearer and account
// and Pi's originator, beta and session headers.
func TestCodexLoginRoute(t *testing.T) {
	w := newCodexWorld(t, 2*time.Minute) // within Pi's margin: refreshed
	resp, body := w.send(t, http.MethodPost, zstdOf(t, []byte(codexLoginBody)), nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "response.completed") {
		t.Fatalf("turn: %d %s", resp.StatusCode, body)
	}
	if n := w.refreshN.Load(); n != 1 {
		t.Errorf("%d refreshes, want 1", n)
	}
	if n := w.proxy.Stats.Decompressed.Load(); n != 1 {
		t.Errorf("%d bodies decompressed, want 1", n)
	}
	w.mu.Lock()
	seen, got, length, access := w.seen, w.body, w.length, w.access
	w.mu.Unlock()
	var want, sent any
	_ = json.Unmarshal([]byte(codexLoginBody), &want)
	if err := json.Unmarshal(got, &sent); err != nil || !jsonEqual(want, sent) {
		t.Errorf("the provider got body %q, want Pi's body decompressed", got)
	}
	if length != int64(len(got)) || seen.Get("Content-Encoding") != "" {
		t.Errorf("forwarded with Content-Length %d (body %d) and Content-Encoding %q: want the uncompressed body's own length and none", length, len(got), seen.Get("Content-Encoding"))
	}
	for name, v := range map[string]string{"Authorization": "Bearer " + access, "Chatgpt-Account-Id": codexAccountID, "Originator": "pi",
		"Openai-Beta": "responses=experimental", "Session-Id": "0199d5c2-5c1e-7000-8000-000000000001", "X-Client-Request-Id": "0199d5c2-5c1e-7000-8000-000000000001"} {
		if seen.Get(name) != v {
			t.Errorf("the provider got %s %q, want %q", name, seen.Get(name), v)
		}
	}
	data, _ := os.ReadFile(w.authFile)
	var doc map[string]map[string]any
	_ = json.Unmarshal(data, &doc)
	if e := doc["openai-codex"]; e["access"] != access || e["accountId"] != codexAccountID || time.Until(time.UnixMilli(int64(e["expires"].(float64)))) < 239*time.Hour {
		t.Errorf("auth.json after the refresh: access current %v, accountId %v, expires %v", e["access"] == access, e["accountId"], e["expires"])
	}
	// Uncompressed, as Pi sends it when its Node has no zstd: the same.
	if resp, body := w.send(t, http.MethodPost, []byte(codexLoginBody), func(r *http.Request) { r.Header.Del("Content-Encoding") }); resp.StatusCode != http.StatusOK {
		t.Errorf("uncompressed turn: %d %s", resp.StatusCode, body)
	}
	// The body policy holds on the decompressed body.
	bad := strings.Replace(codexLoginBody, `"store":false`, `"store":false,"previous_response_id":"resp_1"`, 1)
	before := w.turns.Load()
	if resp, body := w.send(t, http.MethodPost, zstdOf(t, []byte(bad)), nil); resp.StatusCode == http.StatusOK || !strings.Contains(body, "previous_response_id") {
		t.Errorf("a compressed body with provider-side state: %d %s", resp.StatusCode, body)
	}
	if w.turns.Load() != before {
		t.Error("the refused body reached the provider")
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// Pi tries a WebSocket first (GET with Upgrade to the same path): the
// route refuses the upgrade, so the turn never travels in frames it does
// not read; and a WebSocket through the route is refused whether or not
// the route lists a GET of that path (TestModelRouteUpgradeRefused).
func TestCodexWebSocketRefused(t *testing.T) {
	w := newCodexWorld(t, time.Hour)
	upgrade := func(r *http.Request) {
		r.Header.Del("Content-Encoding")
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	resp, body := w.send(t, http.MethodGet, nil, upgrade)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "does not upgrade") {
		t.Fatalf("WebSocket upgrade: %d %s, want 403", resp.StatusCode, body)
	}
	resp, _ = w.send(t, http.MethodPost, []byte(codexLoginBody), upgrade)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with Upgrade: %d, want 403", resp.StatusCode)
	}
	if n := w.turns.Load(); n != 0 {
		t.Errorf("%d upgrade attempts reached the provider", n)
	}
	if n := w.proxy.Stats.Refused.Load(); n != 2 {
		t.Errorf("refused %d, want 2", n)
	}
}

// A zstd bomb (a small body that expands past the route's 32 MiB limit)
// is refused with 413 before it expands, whether its frame declares its
// size or not, and nothing reaches the provider. Control: an unbounded
// decoder expands the same bytes past the limit.
func TestCodexZstdBomb(t *testing.T) {
	w := newCodexWorld(t, time.Hour)
	big := make([]byte, 64<<20) // twice the limit
	copy(big, codexLoginBody)
	declared := zstdOf(t, big)
	// The same content streamed: the frame header declares no size.
	var streamed bytes.Buffer
	enc, _ := zstd.NewWriter(&streamed, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(1<<20))
	_, _ = enc.Write(big)
	_ = enc.Close()
	for name, bomb := range map[string][]byte{"declared": declared, "streamed": streamed.Bytes()} {
		if len(bomb) > 1<<20 {
			t.Fatalf("%s bomb is %d bytes: not a bomb", name, len(bomb))
		}
		// Control: nothing bounding it, it expands to all 64 MiB.
		dec, _ := zstd.NewReader(bytes.NewReader(bomb), zstd.WithDecoderMaxMemory(1<<30))
		n, _ := io.Copy(io.Discard, dec)
		dec.Close()
		if n != int64(len(big)) {
			t.Fatalf("control: %s bomb expands to %d bytes, want %d", name, n, len(big))
		}
		resp, body := w.send(t, http.MethodPost, bomb, nil)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("%s bomb (%d bytes): %d %s, want 413", name, len(bomb), resp.StatusCode, body)
		}
	}
	// Not zstd at all, and zstd on a route of another API.
	if resp, _ := w.send(t, http.MethodPost, []byte(codexLoginBody), nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a body labelled zstd that is not: %d, want 400", resp.StatusCode)
	}
	if n := w.turns.Load(); n != 0 {
		t.Errorf("%d bombs reached the provider", n)
	}
	if _, err := unzstd(declared, 32<<20); err != errZstdTooLarge {
		t.Errorf("unzstd of the declared bomb: %v", err)
	}
	lw := newLoginWorld(t, time.Hour)
	resp, _ := lw.send(t, func(r *http.Request) {
		r.Header.Set("Content-Encoding", "zstd")
		r.Body = io.NopCloser(bytes.NewReader(zstdOf(t, []byte(anthropicLoginBody))))
		r.ContentLength = -1
	})
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("zstd on the Anthropic login route: %d, want 415 (Pi sends it to Codex only)", resp.StatusCode)
	}
}

// A sandbox's own bearer, or the Anthropic placeholder, is refused on the
// Codex route; the account header from the sandbox is replaced, never
// passed.
func TestCodexOwnCredentialRefused(t *testing.T) {
	w := newCodexWorld(t, time.Hour)
	for name, tok := range map[string]string{"own": codexJWT("acct-other"), "anthropic": bundle.ModelLoginPlaceholder} {
		resp, _ := w.send(t, http.MethodPost, zstdOf(t, []byte(codexLoginBody)), func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) })
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s bearer: %d, want 403", name, resp.StatusCode)
		}
	}
	resp, _ := w.send(t, http.MethodPost, zstdOf(t, []byte(codexLoginBody)), func(r *http.Request) { r.Header.Set("Chatgpt-Account-Id", "acct-other") })
	w.mu.Lock()
	got := w.seen.Get("Chatgpt-Account-Id")
	w.mu.Unlock()
	if resp.StatusCode != http.StatusOK || got != codexAccountID {
		t.Errorf("account from the sandbox: %d, provider got %q, want the login's", resp.StatusCode, got)
	}
}

// An upgrade on a request the route lists (an api-key route's GET
// /models) is refused too, and nothing reaches the provider. Control: a
// reverse proxy without the guard, the route's own forwarding, hands the
// provider's 101 back and the connection switches protocols.
func TestModelRouteUpgradeRefused(t *testing.T) {
	var upgraded atomic.Int64
	upstream := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			rw.Header().Set("Content-Type", "application/json")
			_, _ = rw.Write([]byte(`{"data":[]}`))
			return
		}
		upgraded.Add(1)
		conn, buf, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		_ = buf.Flush()
	})
	w := newModelWorld(t, upstream, nil)
	upgrade := func(r *http.Request) {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	if resp, body := w.do(t, http.MethodGet, "/models", "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /models without an upgrade: %d %s", resp.StatusCode, body)
	}
	if resp, body := w.do(t, http.MethodGet, "/models", "", upgrade); resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET /models with an upgrade: %d %s, want 403", resp.StatusCode, body)
	}
	if n := upgraded.Load(); n != 0 {
		t.Errorf("%d upgrades reached the provider through the route", n)
	}
	// Control: the same forwarding without the guard.
	ca, err := fakemodel.NewTestCA("llm.example.test")
	if err != nil {
		t.Fatal(err)
	}
	ul, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: upstream, TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Cert}}}
	go srv.ServeTLS(ul, "", "")
	t.Cleanup(func() { srv.Close() })
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", "llm.example.test:8443", "llm.example.test:8443"
		},
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Roots, ServerName: "llm.example.test"},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, ul.Addr().String())
			}},
	}
	plain := httptest.NewServer(rp)
	t.Cleanup(plain.Close)
	req, _ := http.NewRequest(http.MethodGet, plain.URL+"/v1/models", nil)
	upgrade(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols || upgraded.Load() != 1 {
		t.Fatalf("control: a plain reverse proxy answered %d (%d upgrades), want 101: the attack needs the guard", resp.StatusCode, upgraded.Load())
	}
}
