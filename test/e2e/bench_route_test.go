package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// BenchmarkPiModelRoute (make bench-pi, section 7; issue 24) is the model
// route's cost on a turn: the real sandboxed Pi, warm, sends a prompt and
// the fake model streams a reply of routeChunks pieces. Two sub-benchmarks
// in one run, each one launch of b.N turns (after one untimed turn):
//
//   - route: api-key, the product's launch: Pi -> http -> the route proxy
//     on the gateway (key added, request checked and rebuilt) -> TLS ->
//     the fake model;
//   - direct: the launch before the route, Pi -> http -> the fake model,
//     through the egress filter (credential mode none and a plain-http
//     base URL: Pi in the sandbox does not trust the test CA, so the
//     direct side has no TLS, which a real direct connection would pay
//     inside gVisor).
//
// Metrics: first-token-ms (prompt written -> first text delta) and
// reply-ms (prompt written -> agent_settled), medians over the turns.
func BenchmarkPiModelRoute(b *testing.B) {
	for _, direct := range []bool{false, true} {
		name := "route"
		if direct {
			name = "direct"
		}
		b.Run(name, func(b *testing.B) { benchRoute(b, direct) })
	}
}

const routeChunks = 60

func benchRoute(b *testing.B, direct bool) {
	e := newEnv(b)
	reply := fakemodel.Turn{Content: strings.Repeat("streamed ", 120), Chunks: routeChunks}
	script := make([]fakemodel.Turn, b.N+1)
	for i := range script {
		script[i] = reply
	}
	e.mu.Lock()
	e.fm = fakemodel.New(fakemodel.Options{Script: script, APIKey: apiKey})
	if direct {
		// The direct side sends its own key (the model checks none).
		e.fm = fakemodel.New(fakemodel.Options{Script: script})
	}
	e.mu.Unlock()
	sc := e.scene(b, "pi-session", "")
	if direct {
		sc = e.directScene(b)
	}
	p := e.launch(b, sc)
	c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, _, err := p.Call(c, map[string]any{"type": "prompt", "message": "warm up"}); err != nil {
		b.Fatalf("warm-up prompt: %v; stderr: %s", err, p.stderr.String())
	}
	if _, _, err := p.Until(c, piproto.Event("agent_settled")); err != nil {
		b.Fatal(err)
	}
	var first, whole []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, _, err := p.Call(c, map[string]any{"type": "prompt", "message": fmt.Sprintf("turn %d", i)}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := p.Until(c, textDelta); err != nil {
			b.Fatal(err)
		}
		first = append(first, time.Since(start))
		if _, _, err := p.Until(c, piproto.Event("agent_settled")); err != nil {
			b.Fatal(err)
		}
		whole = append(whole, time.Since(start))
	}
	b.StopTimer()
	b.ReportMetric(ms(median(first)), "first-token-ms")
	b.ReportMetric(ms(median(whole)), "reply-ms")
	res := p.stop(b)
	if !direct && res.Routes["model"].Forwarded < int64(b.N) {
		b.Fatalf("the route forwarded %+v, want every turn", res.Routes["model"])
	}
}

// textDelta is the first streamed piece of the assistant's text.
func textDelta(f piproto.Frame) bool {
	return f.Type == "message_update" && strings.Contains(string(f.Raw), `"text_delta"`)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// directScene is the e2e scene as it launched before the model route: no
// key (credential mode none), the model a plain egress destination on
// plain HTTP (port 8080, served here too), the daemon's models.json bound
// as it is.
func (e *env) directScene(b *testing.B) *testbundle.Scene {
	const direct = "http://llm.example.test:8080/v1"
	l, err := e.model.Listen("tcp4", netip.AddrPortFrom(e.model.Addr, 8080).String())
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		fm := e.fm
		e.mu.Unlock()
		fm.Handler().ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
	facts := fmt.Sprintf(`{"model":{"baseURL":%q},"credential":{"mode":"none","env":null,"secretRef":null},"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, direct, e.daemon.port)
	erofs, err := json.Marshal(e.image.Erofs)
	if err != nil {
		b.Fatal(err)
	}
	models := `{"providers":{"fake":{"baseUrl":"` + direct + `","api":"openai-completions","apiKey":"direct-bench","compat":{"supportsDeveloperRole":false},"models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}`
	sc := testbundle.New(b, testbundle.Options{Host: e.host, Rootfs: e.image.Rootfs, Profile: "pi-session",
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"erofs":%s},"deployments":{"host-alice":{"peers":{"uids":[0],"gids":[1000]}}}}`, e.image.Version, e.image.Digest, erofs),
		FactsPatch:    facts,
		Prepare: func(t testing.TB, host string) {
			agent := filepath.Join(host, "srv/paseo/state/pi-agent")
			writeAgentFiles(t, agent)
			write(t, filepath.Join(agent, "models.json"), models)
		}})
	e.prepareState(b, sc)
	write(b, filepath.Join(sc.Host, "srv/paseo/state/pi-agent/models.json"), models)
	return sc
}
