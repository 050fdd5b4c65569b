package fakemodel

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const testKey = "sk-test-real-secret-0123456789"

// sseEvent is one parsed "data:" event.
type sseEvent struct{ data string }

// readSSE parses an SSE body strictly: every event is "data: <payload>"
// followed by a blank line; anything else fails the test.
func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var pending *sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if pending == nil {
				t.Fatalf("blank line without a preceding data line")
			}
			out = append(out, *pending)
			pending = nil
		case strings.HasPrefix(line, "data: "):
			if pending != nil {
				t.Fatalf("two data lines in one event: %q", line)
			}
			pending = &sseEvent{data: strings.TrimPrefix(line, "data: ")}
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading SSE: %v", err)
	}
	if pending != nil {
		t.Fatalf("stream ended inside an event (no blank line after %q)", pending.data)
	}
	return out
}

// wireChunk mirrors the OpenAI chunk for decoding, keeping raw fields to
// check nulls.
type wireChunk struct {
	ID                string                       `json:"id"`
	Object            string                       `json:"object"`
	Created           int64                        `json:"created"`
	Model             string                       `json:"model"`
	SystemFingerprint string                       `json:"system_fingerprint"`
	Choices           []map[string]json.RawMessage `json:"choices"`
	Usage             json.RawMessage              `json:"usage"`
}

type wireDelta struct {
	Role      string  `json:"role"`
	Content   *string `json:"content"`
	ToolCalls []struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string  `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type assembled struct {
	text         string
	calls        map[int]*assembledCall
	finishReason string
	usage        *Usage
	chunks       []wireChunk
}

type assembledCall struct {
	id, typ, name, args string
}

// assemble decodes a stream the way an OpenAI client does and checks the
// invariants of the format along the way.
func assemble(t *testing.T, events []sseEvent, wantModel string) assembled {
	t.Helper()
	if len(events) < 3 {
		t.Fatalf("stream has %d events, want at least 3", len(events))
	}
	if last := events[len(events)-1].data; last != "[DONE]" {
		t.Fatalf("last event is %q, want [DONE]", last)
	}
	a := assembled{calls: map[int]*assembledCall{}}
	var id string
	sawFinish := false
	for i, ev := range events[:len(events)-1] {
		if ev.data == "[DONE]" {
			t.Fatalf("[DONE] at event %d of %d", i, len(events))
		}
		var c wireChunk
		dec := json.NewDecoder(strings.NewReader(ev.data))
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("event %d is not JSON: %v: %s", i, err, ev.data)
		}
		a.chunks = append(a.chunks, c)
		if c.Object != "chat.completion.chunk" {
			t.Errorf("event %d object = %q", i, c.Object)
		}
		if !strings.HasPrefix(c.ID, "chatcmpl-") {
			t.Errorf("event %d id = %q", i, c.ID)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Errorf("event %d id %q differs from %q", i, c.ID, id)
		}
		if c.Created == 0 {
			t.Errorf("event %d has no created", i)
		}
		if c.Model != wantModel {
			t.Errorf("event %d model = %q, want %q", i, c.Model, wantModel)
		}
		if c.Choices == nil {
			t.Errorf("event %d has no choices array", i)
		}
		if len(c.Choices) == 0 {
			if len(c.Usage) == 0 || string(c.Usage) == "null" {
				t.Errorf("event %d has empty choices but no usage", i)
			}
			var u Usage
			if err := json.Unmarshal(c.Usage, &u); err != nil {
				t.Fatalf("usage: %v", err)
			}
			if i != len(events)-2 {
				t.Errorf("usage chunk at event %d, want it right before [DONE] (%d)", i, len(events)-2)
			}
			a.usage = &u
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("event %d has %d choices", i, len(c.Choices))
		}
		ch := c.Choices[0]
		if string(ch["index"]) != "0" {
			t.Errorf("event %d choice index = %s", i, ch["index"])
		}
		if _, ok := ch["finish_reason"]; !ok {
			t.Errorf("event %d choice lacks finish_reason (must be null until the end)", i)
		}
		var fr *string
		if err := json.Unmarshal(ch["finish_reason"], &fr); err != nil {
			t.Fatalf("finish_reason: %v", err)
		}
		if sawFinish {
			t.Errorf("event %d comes after the finish_reason chunk", i)
		}
		var d wireDelta
		if err := json.Unmarshal(ch["delta"], &d); err != nil {
			t.Fatalf("event %d delta: %v", i, err)
		}
		if i == 0 && d.Role != "assistant" {
			t.Errorf("first chunk role = %q, want assistant", d.Role)
		}
		if d.Content != nil {
			a.text += *d.Content
		}
		for _, tc := range d.ToolCalls {
			if tc.Index == nil {
				t.Fatalf("event %d tool call without index", i)
			}
			call := a.calls[*tc.Index]
			if call == nil {
				if tc.ID == "" || tc.Type != "function" || tc.Function.Name == "" {
					t.Errorf("first delta of tool call %d lacks id/type/name: %+v", *tc.Index, tc)
				}
				call = &assembledCall{id: tc.ID, typ: tc.Type, name: tc.Function.Name}
				a.calls[*tc.Index] = call
			} else if tc.ID != "" || tc.Function.Name != "" {
				t.Errorf("later delta of tool call %d repeats id or name", *tc.Index)
			}
			if tc.Function.Arguments != nil {
				call.args += *tc.Function.Arguments
			}
		}
		if fr != nil {
			sawFinish = true
			a.finishReason = *fr
		}
	}
	if !sawFinish {
		t.Fatalf("no chunk carried finish_reason")
	}
	if a.usage == nil {
		t.Fatalf("no usage chunk")
	}
	return a
}

func newTest(t *testing.T, opts Options) (*Server, *httptest.Server) {
	t.Helper()
	s := New(opts)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return s, hs
}

func chatBody(t *testing.T, stream bool, roles ...string) string {
	t.Helper()
	type msg struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		ToolCallID string `json:"tool_call_id,omitempty"`
	}
	req := map[string]any{
		"model":          DefaultModel,
		"stream":         stream,
		"stream_options": map[string]bool{"include_usage": true},
		"tools": []map[string]any{
			{"type": "function", "function": map[string]any{"name": "write", "parameters": map[string]any{"type": "object"}}},
			{"type": "function", "function": map[string]any{"name": "bash", "parameters": map[string]any{"type": "object"}}},
		},
	}
	var msgs []msg
	for _, r := range roles {
		m := msg{Role: r, Content: "hello"}
		if r == "tool" {
			m.ToolCallID = "call_fake_1"
		}
		msgs = append(msgs, m)
	}
	req["messages"] = msgs
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func post(t *testing.T, ctx context.Context, url, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestTextStream(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{{Content: "Hello from the fake model, streamed in pieces.", Chunks: 5}}})
	resp := post(t, context.Background(), hs.URL, testKey, chatBody(t, true, "system", "user"))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type = %q", ct)
	}
	a := assemble(t, readSSE(t, resp.Body), DefaultModel)
	if a.text != "Hello from the fake model, streamed in pieces." {
		t.Errorf("text = %q", a.text)
	}
	if a.finishReason != "stop" {
		t.Errorf("finish_reason = %q, want stop", a.finishReason)
	}
	if len(a.calls) != 0 {
		t.Errorf("unexpected tool calls %v", a.calls)
	}
	// Role chunk, five content chunks, the finish chunk, the usage chunk.
	if len(a.chunks) != 8 {
		t.Errorf("got %d chunks, want 8", len(a.chunks))
	}
	// include_usage was asked for: non-final chunks carry "usage": null.
	if string(a.chunks[0].Usage) != "null" {
		t.Errorf("first chunk usage = %s, want null", a.chunks[0].Usage)
	}
	if u := a.usage; u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.PromptTokens == 0 || u.CompletionTokens == 0 {
		t.Errorf("usage %+v", u)
	}
	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("recorded %d requests", len(reqs))
	}
	r := reqs[0]
	if !r.Authorized || r.Status != 200 || !r.Completed || r.Aborted || r.Turn != 0 || r.Done {
		t.Errorf("record %+v", r)
	}
	if r.Model != DefaultModel || !r.Stream || r.Messages != 2 || r.LastRole != "user" || strings.Join(r.Tools, ",") != "write,bash" {
		t.Errorf("parsed request %+v", r)
	}
	if !json.Valid(r.Body) {
		t.Errorf("recorded body is not JSON")
	}
}

func TestToolCallStreamReassembles(t *testing.T) {
	content := "line one\nline \"two\" with unicode: héllo ✓\n"
	_, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{
		{Content: "I'll write it.", ToolCalls: []ToolCall{
			{Name: "write", Arguments: map[string]string{"path": "/work/out.txt", "content": content}},
			{ID: "call_custom", Name: "bash", Arguments: map[string]string{"command": "cat /work/out.txt"}},
		}, Chunks: 7},
	}})
	resp := post(t, context.Background(), hs.URL, testKey, chatBody(t, true, "user"))
	defer resp.Body.Close()
	a := assemble(t, readSSE(t, resp.Body), DefaultModel)
	if a.finishReason != "tool_calls" {
		t.Errorf("finish_reason = %q", a.finishReason)
	}
	if a.text != "I'll write it." {
		t.Errorf("text = %q", a.text)
	}
	if len(a.calls) != 2 {
		t.Fatalf("got %d tool calls", len(a.calls))
	}
	w := a.calls[0]
	if w.name != "write" || w.typ != "function" || !strings.HasPrefix(w.id, "call_") {
		t.Errorf("call 0 = %+v", w)
	}
	var args struct{ Path, Content string }
	if err := json.Unmarshal([]byte(w.args), &args); err != nil {
		t.Fatalf("write arguments do not reassemble into JSON: %v: %q", err, w.args)
	}
	if args.Path != "/work/out.txt" || args.Content != content {
		t.Errorf("write arguments = %+v", args)
	}
	b := a.calls[1]
	if b.id != "call_custom" || b.name != "bash" {
		t.Errorf("call 1 = %+v", b)
	}
	var bargs struct{ Command string }
	if err := json.Unmarshal([]byte(b.args), &bargs); err != nil || bargs.Command != "cat /work/out.txt" {
		t.Errorf("bash arguments %q: %v", b.args, err)
	}
	// The arguments really were streamed in several pieces.
	pieces := 0
	for _, c := range a.chunks {
		if len(c.Choices) == 1 && strings.Contains(string(c.Choices[0]["delta"]), `"arguments"`) {
			pieces++
		}
	}
	if pieces < 4 {
		t.Errorf("arguments came in %d deltas, want several", pieces)
	}
}

func TestToolOnlyTurnHasNullContent(t *testing.T) {
	_, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{WriteFile("/w/a", "x")}})
	resp := post(t, context.Background(), hs.URL, testKey, chatBody(t, true, "user"))
	defer resp.Body.Close()
	a := assemble(t, readSSE(t, resp.Body), DefaultModel)
	var d map[string]json.RawMessage
	if err := json.Unmarshal(a.chunks[0].Choices[0]["delta"], &d); err != nil {
		t.Fatal(err)
	}
	if string(d["content"]) != "null" {
		t.Errorf("role chunk content = %s, want null for a tool-only turn", d["content"])
	}
	if a.text != "" || a.calls[0].name != "write" {
		t.Errorf("assembled %+v", a)
	}
}

func TestUnauthorized(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{Text("first")}})
	for _, tc := range []struct {
		name, header string
		wantCode     string
	}{
		{"wrong key", "Bearer placeholder-not-the-key", "invalid_api_key"},
		{"missing", "", ""},
		{"wrong scheme", "Basic " + testKey, "invalid_api_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(chatBody(t, true, "user")))
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
			body, _ := io.ReadAll(resp.Body)
			if strings.Contains(string(body), testKey) || strings.Contains(string(body), "placeholder") {
				t.Errorf("error body echoes a key: %s", body)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("error body is not JSON: %v: %s", err, body)
			}
			if e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
				t.Errorf("error = %+v", e.Error)
			}
			gotCode := ""
			if e.Error.Code != nil {
				gotCode = *e.Error.Code
			}
			if gotCode != tc.wantCode {
				t.Errorf("code = %q, want %q", gotCode, tc.wantCode)
			}
		})
	}
	// GET /models needs the key too.
	resp, err := http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/models without a key: %d", resp.StatusCode)
	}

	reqs := s.Requests()
	if len(reqs) != 4 {
		t.Fatalf("recorded %d requests, want 4", len(reqs))
	}
	for _, r := range reqs {
		if r.Authorized || r.Status != http.StatusUnauthorized || r.Turn != -1 {
			t.Errorf("record %+v", r)
		}
	}
	// Refused requests take no turn: the next good one gets the first.
	resp = post(t, context.Background(), hs.URL, testKey, chatBody(t, true, "user"))
	defer resp.Body.Close()
	if a := assemble(t, readSSE(t, resp.Body), DefaultModel); a.text != "first" {
		t.Errorf("after refusals got %q, want the first turn", a.text)
	}
}

func TestScriptAdvanceAndExhaustion(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{
		WriteFile("/work/a.txt", "A"),
		Bash("ls /work"),
		Text("all written"),
	}})
	type step struct {
		roles    []string
		wantText string
		wantTool string
	}
	steps := []step{
		{[]string{"user"}, "", "write"},
		{[]string{"user", "assistant", "tool"}, "", "bash"},
		{[]string{"user", "assistant", "tool", "assistant", "tool"}, "all written", ""},
		{[]string{"user"}, "done", ""},
		{[]string{"user"}, "done", ""},
	}
	for i, st := range steps {
		resp := post(t, context.Background(), hs.URL, testKey, chatBody(t, true, st.roles...))
		a := assemble(t, readSSE(t, resp.Body), DefaultModel)
		resp.Body.Close()
		if a.text != st.wantText {
			t.Errorf("step %d text = %q, want %q", i, a.text, st.wantText)
		}
		gotTool := ""
		if c := a.calls[0]; c != nil {
			gotTool = c.name
		}
		if gotTool != st.wantTool {
			t.Errorf("step %d tool = %q, want %q", i, gotTool, st.wantTool)
		}
	}
	reqs := s.Requests()
	wantTurns := []int{0, 1, 2, -1, -1}
	for i, r := range reqs {
		if r.Turn != wantTurns[i] || r.Done != (wantTurns[i] < 0) {
			t.Errorf("request %d turn=%d done=%v, want turn %d", i, r.Turn, r.Done, wantTurns[i])
		}
	}
	if reqs[1].LastRole != "tool" {
		t.Errorf("request 1 last role = %q", reqs[1].LastRole)
	}
}

// A prompt that begins with a key of Scripts takes that script's turns;
// other prompts take Script's, so neither takes the other's.
func TestScriptsByPrompt(t *testing.T) {
	_, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{Text("main 1"), Text("main 2")},
		Scripts: map[string][]Turn{"tool:": {WriteFile("/w/a", "A"), Text("tool done")}, "tool:long": {Text("longest key")}}})
	body := func(user string, tail ...string) string {
		msgs := []map[string]any{{"role": "user", "content": []map[string]string{{"type": "text", "text": user}}}}
		for _, r := range tail {
			msgs = append(msgs, map[string]any{"role": r, "content": "x"})
		}
		b, err := json.Marshal(map[string]any{"model": DefaultModel, "stream": true, "messages": msgs})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i, st := range []struct{ body, text, tool string }{
		{body("tool: write it"), "", "write"},
		{body("hello"), "main 1", ""},
		{body("tool: write it", "assistant", "tool"), "tool done", ""},
		{body("tool:long one"), "longest key", ""},
		{body("tool: again"), "done", ""},
		{body("hello"), "main 2", ""},
	} {
		resp := post(t, context.Background(), hs.URL, testKey, st.body)
		a := assemble(t, readSSE(t, resp.Body), DefaultModel)
		resp.Body.Close()
		tool := ""
		if c := a.calls[0]; c != nil {
			tool = c.name
		}
		if a.text != st.text || tool != st.tool {
			t.Errorf("step %d: text %q tool %q, want %q %q", i, a.text, tool, st.text, st.tool)
		}
	}
}

func TestAbortRecorded(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{Slow(strings.Repeat("slow ", 40), 40, 4*time.Second)}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, hs.URL, testKey, chatBody(t, true, "user"))
	br := bufio.NewReader(resp.Body)
	// Read until the first content piece arrives, then hang up.
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading: %v", err)
		}
		if strings.Contains(line, `"content":"slow`) {
			break
		}
	}
	start := time.Now()
	cancel()
	resp.Body.Close()

	wctx, wcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer wcancel()
	err := s.WaitFor(wctx, func(rs []Recorded) bool { return len(rs) == 1 && rs[0].Aborted })
	if err != nil {
		t.Fatalf("abort was not recorded: %v (%+v)", err, s.Requests())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("abort noticed after %v; the stream kept going", d)
	}
	r := s.Requests()[0]
	if r.Completed {
		t.Errorf("aborted stream marked completed: %+v", r)
	}
}

func TestModelsAndRoutes(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Model: "fake-9"})
	get := func(path string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, body := get("/v1/models")
	if resp.StatusCode != 200 {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "fake-9" || list.Data[0].Object != "model" {
		t.Errorf("models = %s", body)
	}
	if resp, _ := get("/v1/models/fake-9"); resp.StatusCode != 200 {
		t.Errorf("model get: %d", resp.StatusCode)
	}
	if resp, _ := get("/v1/models/other"); resp.StatusCode != 404 {
		t.Errorf("unknown model get: %d", resp.StatusCode)
	}
	if resp, _ := get("/v2/chat/completions"); resp.StatusCode != 404 {
		t.Errorf("wrong base: %d", resp.StatusCode)
	}
	if resp, _ := get("/v1/chat/completions"); resp.StatusCode != 405 {
		t.Errorf("GET chat: %d", resp.StatusCode)
	}
	if n := len(s.Requests()); n != 5 {
		t.Errorf("recorded %d requests, want 5", n)
	}

	// The chunk model is the served model id.
	resp2 := post(t, context.Background(), hs.URL, testKey, chatBody(t, true, "user"))
	defer resp2.Body.Close()
	assemble(t, readSSE(t, resp2.Body), "fake-9")
}

func TestNonStreaming(t *testing.T) {
	_, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{Bash("true")}})
	resp := post(t, context.Background(), hs.URL, testKey, chatBody(t, false, "user"))
	defer resp.Body.Close()
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role      string  `json:"role"`
				Content   *string `json:"content"`
				ToolCalls []struct {
					Type     string `json:"type"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage Usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	if c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].FinishReason != "tool_calls" ||
		c.Choices[0].Message.Content != nil || c.Choices[0].Message.ToolCalls[0].Function.Name != "bash" ||
		c.Choices[0].Message.ToolCalls[0].Function.Arguments != `{"command":"true"}` || c.Usage.TotalTokens == 0 {
		t.Errorf("completion = %+v", c)
	}
}

func TestFinishReasonOverrideAndRawArguments(t *testing.T) {
	_, hs := newTest(t, Options{APIKey: testKey, Script: []Turn{{
		ToolCalls:    []ToolCall{{Name: "write", Arguments: json.RawMessage(`{"path":"/x","content":"trunc`)}},
		FinishReason: "length",
	}}})
	resp := post(t, context.Background(), hs.URL, testKey, chatBody(t, true, "user"))
	defer resp.Body.Close()
	a := assemble(t, readSSE(t, resp.Body), DefaultModel)
	if a.finishReason != "length" || a.calls[0].args != `{"path":"/x","content":"trunc` {
		t.Errorf("assembled %+v / %+v", a.finishReason, a.calls[0])
	}
}

func TestServeTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	s := New(Options{APIKey: testKey, Script: []Turn{Text("over tls")}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.ServeTLS(l, cert) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-errc; err != nil {
			t.Errorf("ServeTLS: %v", err)
		}
	})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodPost, "https://"+l.Addr().String()+"/v1/chat/completions", strings.NewReader(chatBody(t, true, "user")))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if a := assemble(t, readSSE(t, resp.Body), DefaultModel); a.text != "over tls" {
		t.Errorf("text %q", a.text)
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fakemodel"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true,

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
