package routeproxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// catalogDaemon answers like Paseo's route: tools/list offers an allowed
// and a disallowed tool, as JSON or (Accept: text/event-stream) as an
// event stream; it records the bearer and body of every request.
type catalogDaemon struct {
	mu     sync.Mutex
	bodies []string
	auths  []string
	sse    bool
}

func (d *catalogDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	d.bodies = append(d.bodies, string(b))
	d.auths = append(d.auths, r.Header.Get("Authorization"))
	sse := d.sse
	d.mu.Unlock()
	var answer func(m map[string]json.RawMessage) any
	answer = func(m map[string]json.RawMessage) any {
		var method string
		_ = json.Unmarshal(m["method"], &method)
		result := any(map[string]any{})
		if method == "tools/list" {
			result = map[string]any{"tools": []any{
				map[string]any{"name": "list_agents", "description": "d"},
				map[string]any{"name": "create_agent", "description": "starts an unsandboxed agent"}},
				"nextCursor": "page2"}
		}
		return map[string]any{"jsonrpc": "2.0", "id": m["id"], "result": result}
	}
	var out any
	var batch []map[string]json.RawMessage
	if json.Unmarshal(b, &batch) == nil {
		var all []any
		for _, m := range batch {
			all = append(all, answer(m))
		}
		out = all
	} else {
		var m map[string]json.RawMessage
		_ = json.Unmarshal(b, &m)
		out = answer(m)
	}
	data, _ := json.Marshal(out)
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, ": comment\nevent: message\nid: 7\ndata: %s\n\n", data)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

func (d *catalogDaemon) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.bodies...)
}

func post(t *testing.T, base, body string) (int, string) {
	return do(t, "POST", base+validPath, map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}, body)
}

// rpcErrors returns the JSON-RPC error codes of an answer (one or a batch).
func rpcErrors(t *testing.T, body string) []int {
	t.Helper()
	var msgs []struct {
		Error *struct{ Code int } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &msgs); err != nil {
		var one struct {
			Error *struct{ Code int } `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &one); err != nil {
			t.Fatalf("not JSON-RPC: %q", body)
		}
		msgs = append(msgs, one)
	}
	var codes []int
	for _, m := range msgs {
		if m.Error != nil {
			codes = append(codes, m.Error.Code)
		}
	}
	return codes
}

func TestScopeRefusesBeforeTheDaemon(t *testing.T) {
	d := &catalogDaemon{}
	p, base := setupWith(t, d, Limits{})
	allowed := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"list_agents","arguments":{}}}`,
		`[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"list_agents"}}]`,
	}
	for _, b := range allowed {
		if code, body := post(t, base, b); code != 200 && code != 202 || len(rpcErrors(t, body)) > 0 {
			t.Errorf("allowed %s: %d %s", b, code, body)
		}
	}
	refused := []struct {
		name, body string
		status     int
		codes      []int
	}{
		{"a method outside", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///"}}`, 200, []int{codeMethod}},
		{"a tool outside", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_agent","arguments":{"cwd":"/"}}}`, 200, []int{codeParams}},
		{"a tool by another case", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"List_agents"}}`, 200, []int{codeParams}},
		{"tools/call without a name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`, 200, []int{codeParams}},
		{"a batch with one bad entry", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_agent"}}]`, 200, []int{codeParams, codeParams}},
		{"a notification outside", `{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`, 400, []int{codeMethod}},
		{"not JSON", `tools/call create_agent`, 400, []int{codeParse}},
		{"trailing garbage", `{"jsonrpc":"2.0","id":1,"method":"ping"} x`, 400, []int{codeParse}},
		{"a duplicate key", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","name":"create_agent"}}`, 400, []int{codeInvalidRequest}},
		{"a duplicate method", `{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}`, 400, []int{codeInvalidRequest}},
		{"no jsonrpc version", `{"id":1,"method":"ping"}`, 400, []int{codeInvalidRequest}},
		{"a response", `{"jsonrpc":"2.0","id":1,"result":{}}`, 200, []int{codeInvalidRequest}},
		{"an empty batch", `[]`, 400, []int{codeInvalidRequest}},
		{"a scalar", `1`, 400, []int{codeInvalidRequest}},
		{"an object id", `{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}`, 400, []int{codeInvalidRequest}},
		{"a batch too long", "[" + strings.Repeat(`{"jsonrpc":"2.0","method":"notifications/initialized"},`, MaxBatch) + `{"jsonrpc":"2.0","id":1,"method":"ping"}]`, 400, []int{codeInvalidRequest}},
	}
	before := len(d.seen())
	for _, tc := range refused {
		code, body := post(t, base, tc.body)
		if code != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, code, tc.status, body)
		}
		if got := rpcErrors(t, body); fmt.Sprint(got) != fmt.Sprint(tc.codes) {
			t.Errorf("%s: JSON-RPC errors %v, want %v (%s)", tc.name, got, tc.codes, body)
		}
	}
	code, _ := do(t, "POST", base+validPath, map[string]string{"Content-Type": "text/plain"}, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	if code != http.StatusUnsupportedMediaType {
		t.Errorf("a text/plain body: status %d", code)
	}
	if got := d.seen()[before:]; len(got) != 0 {
		t.Errorf("refused bodies reached the daemon: %q", got)
	}
	if n := int64(len(refused) + 1); p.Stats.OutOfScope.Load() != n || p.Stats.Refused.Load() != n {
		t.Errorf("out of scope %d, refused %d; want %d each", p.Stats.OutOfScope.Load(), p.Stats.Refused.Load(), n)
	}
}

// tools/list answers offer only the scope's tools, as JSON and as an
// event stream, alone and in a batch; no cursor leads past the filter.
func TestToolsListFiltered(t *testing.T) {
	for _, sse := range []bool{false, true} {
		t.Run(fmt.Sprintf("sse=%v", sse), func(t *testing.T) {
			d := &catalogDaemon{sse: sse}
			p, base := setupWith(t, d, Limits{})
			for _, b := range []string{
				`{"jsonrpc":"2.0","id":5,"method":"tools/list"}`,
				`[{"jsonrpc":"2.0","id":6,"method":"ping"},{"jsonrpc":"2.0","id":"l","method":"tools/list"}]`,
			} {
				code, body := post(t, base, b)
				if code != 200 || !strings.Contains(body, "list_agents") {
					t.Fatalf("%s: %d %q", b, code, body)
				}
				if strings.Contains(body, "create_agent") || strings.Contains(body, "nextCursor") {
					t.Errorf("the answer offers more than the scope: %q", body)
				}
				if sse && (!strings.Contains(body, "event: message\nid: 7\ndata: ") || !strings.HasSuffix(body, "\n\n")) {
					t.Errorf("the event stream lost its framing: %q", body)
				}
			}
			if p.Stats.Filtered.Load() != 2 {
				t.Errorf("filtered %d tools, want 2", p.Stats.Filtered.Load())
			}
		})
	}
}

// An answer to tools/list the proxy cannot read is refused, not passed on
// unfiltered.
func TestToolsListUnfilterableRefused(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"create_agent"}]}}`)
	})
	_, base := setupWith(t, h, Limits{})
	code, body := post(t, base, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if code != http.StatusBadGateway || strings.Contains(body, "create_agent") {
		t.Errorf("an unfilterable answer: %d %q", code, body)
	}
}

// The bearer: the daemon gets the proxy's token, never one from the
// sandbox; no token yet means 503; a new token is used from the next
// request on.
func TestBearerInjectedAndRotated(t *testing.T) {
	d := &catalogDaemon{}
	tok := &Token{}
	p, base := setupToken(t, d, Limits{}, tok)
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	if code, _ := post(t, base, ping); code != http.StatusServiceUnavailable {
		t.Errorf("before any token: status %d", code)
	}
	for _, bad := range []string{"", "two words", "line\nbreak", strings.Repeat("x", MaxTokenBytes+1)} {
		if err := tok.Set([]byte(bad)); err == nil {
			t.Errorf("token %q accepted", bad)
		} else if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("the error echoes the token: %v", err)
		}
	}
	_ = tok.Set([]byte("token-one"))
	post(t, base, ping)
	_ = tok.Set([]byte("token-two"))
	post(t, base, ping)
	d.mu.Lock()
	auths := append([]string(nil), d.auths...)
	d.mu.Unlock()
	if fmt.Sprint(auths) != "[Bearer token-one Bearer token-two]" {
		t.Errorf("the daemon saw %q", auths)
	}
	if p.Stats.Refused.Load() != 1 {
		t.Errorf("refused %d", p.Stats.Refused.Load())
	}
}

// Rotation under load: while requests stream through, the token is
// swapped again and again; every request the daemon sees carries one
// whole token that was set, and after the last Set only the last one.
func TestTokenRotationIsAtomic(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Authorization")]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	tok := &Token{}
	_ = tok.Set([]byte("gen-0"))
	_, base := setupToken(t, h, Limits{}, tok)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				req, _ := http.NewRequest("POST", base+validPath, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	valid := map[string]bool{"Bearer gen-0": true}
	for i := 1; i <= 200; i++ {
		v := fmt.Sprintf("gen-%d", i)
		valid["Bearer "+v] = true
		_ = tok.Set([]byte(v))
	}
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	for a := range seen {
		if !valid[a] {
			t.Errorf("the daemon saw a bearer never set: %q", a)
		}
	}
	mu.Unlock()
	mu.Lock()
	seen = map[string]int{}
	mu.Unlock()
	post(t, base, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen["Bearer gen-200"] != 1 {
		t.Errorf("after the last swap the daemon saw %v", seen)
	}
}

// The daemon re-serializes ids (JavaScript: 1.0 is 1, "\u0061" is "a"):
// an answer whose id reads differently from the request's is filtered all
// the same. And tools/list must be a request: as a notification (no id) it
// is refused, so no answer to it escapes the filter.
func TestToolsListFilteredWhateverTheID(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m struct {
			ID any `json:"id"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &m)
		id, _ := json.Marshal(m.ID) // 1.0 -> 1, "\u0061" -> "a"
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"list_agents"},{"name":"create_agent"}]}}`, id)
	})
	_, base := setupWith(t, h, Limits{})
	for _, id := range []string{`1.0`, `1e0`, `"\u0061"`, `"a"`} {
		code, body := post(t, base, `{"jsonrpc":"2.0","id":`+id+`,"method":"tools/list"}`)
		if code != 200 || !strings.Contains(body, "list_agents") || strings.Contains(body, "create_agent") {
			t.Errorf("id %s: %d %q", id, code, body)
		}
	}
	for _, b := range []string{
		`{"jsonrpc":"2.0","method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"notifications/initialized"}`,
	} {
		if code, body := post(t, base, b); len(rpcErrors(t, body)) != 1 || code == 202 {
			t.Errorf("%s: %d %q", b, code, body)
		}
	}
}
