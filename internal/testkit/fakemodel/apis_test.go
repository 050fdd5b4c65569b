package fakemodel

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// namedEvents reads an SSE body of "event: <name>" and "data: <json>"
// pairs and returns the names, and the data of each, in order.
func namedEvents(t *testing.T, resp *http.Response) ([]string, []map[string]any) {
	t.Helper()
	defer resp.Body.Close()
	var names []string
	var datas []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			names = append(names, strings.TrimPrefix(line, "event: "))
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("data is not JSON: %q", line)
			}
			if d["type"] != names[len(names)-1] {
				t.Errorf("event %s carries type %v", names[len(names)-1], d["type"])
			}
			datas = append(datas, d)
		case line != "":
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return names, datas
}

func postAPI(t *testing.T, url, path, header, value, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(header, value)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

var apiTurn = Turn{Chunks: 1, Reasoning: "think", Content: "hi", ToolCalls: []ToolCall{{Name: "read", Arguments: map[string]string{"path": "a"}}}}

// The Responses stream holds a reasoning item, a message and a function
// call, each added, streamed and done, then response.completed; the
// prompt is the last user item's input_text (a function_call_output
// after it is not a prompt).
func TestResponsesStream(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Scripts: map[string][]Turn{"go:": {apiTurn}}})
	body := `{"model":"fake-1","stream":true,"tools":[{"type":"function","name":"read"}],"input":[
 {"role":"user","content":[{"type":"input_text","text":"go: now"}]},
 {"type":"function_call_output","call_id":"c","output":"x"}]}`
	names, datas := namedEvents(t, postAPI(t, hs.URL, "/v1/responses", "Authorization", "Bearer "+testKey, body))
	got := strings.Join(names, " ")
	want := "response.created response.output_item.added response.reasoning_summary_text.delta response.output_item.done " +
		"response.output_item.added response.output_text.delta response.output_item.done " +
		"response.output_item.added response.function_call_arguments.delta response.function_call_arguments.done response.output_item.done response.completed"
	if got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	if out := datas[len(datas)-1]["response"].(map[string]any)["output"].([]any); len(out) != 3 {
		t.Errorf("response.completed lists %d output items, want 3", len(out))
	}
	r := s.Requests()[0]
	if r.Turn != 0 || !r.Completed || r.Tools[0] != "read" || r.LastRole != "function_call_output" {
		t.Errorf("recorded %+v", r)
	}
	if resp := postAPI(t, hs.URL, "/v1/responses", "Authorization", "Bearer wrong", body); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong key got %d", resp.StatusCode)
	}
}

// The Messages stream holds a signed thinking block, a text block and a
// tool_use block, then message_delta (tool_use) and message_stop; the key
// comes in x-api-key, and a user message of tool results only is not
// the prompt.
func TestMessagesStream(t *testing.T) {
	s, hs := newTest(t, Options{APIKey: testKey, Scripts: map[string][]Turn{"go:": {apiTurn}}})
	body := `{"model":"fake-1","stream":true,"max_tokens":10,"tools":[{"name":"read","input_schema":{}}],"messages":[
 {"role":"user","content":"go: now"},{"role":"assistant","content":"x"},
 {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"y"}]}]}`
	names, datas := namedEvents(t, postAPI(t, hs.URL, "/v1/messages", "X-Api-Key", testKey, body))
	got := strings.Join(names, " ")
	want := "message_start content_block_start content_block_delta content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop message_delta message_stop"
	if got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	if d := datas[len(datas)-2]["delta"].(map[string]any); d["stop_reason"] != "tool_use" {
		t.Errorf("message_delta %v", d)
	}
	if r := s.Requests()[0]; r.Turn != 0 || !r.Completed || !r.Authorized {
		t.Errorf("recorded %+v", r)
	}
	// x-api-key counts on Anthropic's path only.
	if resp := postAPI(t, hs.URL, "/v1/responses", "X-Api-Key", testKey, `{"stream":true}`); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("x-api-key on the Responses path got %d", resp.StatusCode)
	}
}
