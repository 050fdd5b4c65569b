package fakemodel

import (
	"bufio"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// The Google stream: SSE data lines of GenerateContentResponse, thinking
// parts (thought), text, a function call, and the finish reason with the
// usage on the last; the prompt is the last user content with text (a
// functionResponse-only content is the tool's answer). The key counts in
// x-goog-api-key on Google's path only; another model is not found and
// the non-SSE form is refused. (Pi's own client, pi-ai 0.84.2 and 1.6.0,
// reads this stream: the e2e turn and routeproxy's recorded corpus.)
func TestGoogleStream(t *testing.T) {
	fm := New(Options{APIKey: testKey, Model: "gemini-test", BasePath: "/v1beta", Script: []Turn{apiTurn}})
	hs := httptest.NewServer(fm.Handler())
	defer hs.Close()
	const path = "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
	body := `{"contents":[{"role":"user","parts":[{"text":"go"}]},{"role":"model","parts":[{"functionCall":{"name":"read","args":{}}}]},{"role":"user","parts":[{"functionResponse":{"name":"read","response":{"output":"x"}}}]}],"tools":[{"functionDeclarations":[{"name":"read"}]}]}`
	for _, c := range []struct {
		name, path, header, value string
		want                      int
	}{
		{"bearer on google's path", path, "Authorization", "Bearer " + testKey, 401},
		{"wrong key", path, "X-Goog-Api-Key", "wrong", 401},
		{"other model", "/v1beta/models/gemini-other:streamGenerateContent?alt=sse", "X-Goog-Api-Key", testKey, 404},
		{"not sse", "/v1beta/models/gemini-test:streamGenerateContent", "X-Goog-Api-Key", testKey, 400},
		{"google's header elsewhere", "/v1beta/chat/completions", "X-Goog-Api-Key", testKey, 401},
	} {
		if resp := postAPI(t, hs.URL, c.path, c.header, c.value, body); resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
	resp := postAPI(t, hs.URL, path, "X-Goog-Api-Key", testKey, body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	type part struct {
		Text             *string
		Thought          bool
		ThoughtSignature string
		FunctionCall     *struct {
			Name string
			Args map[string]string
		}
	}
	var (
		thinking, text string
		calls          []string
		finish         string
		usage          int
		n              int
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		n++
		var doc struct {
			Candidates []struct {
				Content struct {
					Role  string
					Parts []part
				}
				FinishReason string
			}
			UsageMetadata struct{ TotalTokenCount int }
		}
		if err := json.Unmarshal([]byte(line), &doc); err != nil || len(doc.Candidates) != 1 || doc.Candidates[0].Content.Role != "model" {
			t.Fatalf("chunk %q: %v", line, err)
		}
		if finish != "" {
			t.Fatalf("a chunk after the finish reason: %s", line)
		}
		for _, p := range doc.Candidates[0].Content.Parts {
			switch {
			case p.FunctionCall != nil:
				calls = append(calls, p.FunctionCall.Name+":"+p.FunctionCall.Args["path"])
			case p.Thought:
				thinking += *p.Text
			case p.Text != nil:
				text += *p.Text
			}
		}
		finish, usage = doc.Candidates[0].FinishReason, doc.UsageMetadata.TotalTokenCount
	}
	if thinking != "think" || text != "hi" || strings.Join(calls, ",") != "read:a" || finish != "STOP" || usage == 0 || n < 4 {
		t.Errorf("thinking %q text %q calls %v finish %q usage %d chunks %d", thinking, text, calls, finish, usage, n)
	}
	recs := fm.Requests()
	last := recs[len(recs)-1]
	if last.Model != "gemini-test" || last.Messages != 3 || last.LastRole != "user" || last.Turn != 0 || !last.Completed || strings.Join(last.Tools, ",") != "read" {
		t.Errorf("recorded %+v", last)
	}
}

// Azure OpenAI's api-key counts on the Responses path only.
func TestAzureKey(t *testing.T) {
	fm := New(Options{APIKey: testKey, Script: []Turn{apiTurn}})
	hs := httptest.NewServer(fm.Handler())
	defer hs.Close()
	body := `{"model":"fake-1","stream":true,"input":"go"}`
	for _, c := range []struct {
		path, value string
		want        int
	}{
		{"/v1/responses?api-version=v1", testKey, 200},
		{"/v1/responses?api-version=v1", "wrong", 401},
		{"/v1/chat/completions", testKey, 401},
	} {
		resp := postAPI(t, hs.URL, c.path, "Api-Key", c.value, body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s with %q: %d, want %d", c.path, c.value, resp.StatusCode, c.want)
		}
	}
}
