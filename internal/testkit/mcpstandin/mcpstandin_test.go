package mcpstandin

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"
)

// bearer adds the daemon's bearer, as the route proxy does.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// The stand-in answers as Paseo's endpoint does: only its bearer, a
// session opened by initialize, the caller from the query, tools listed
// and run (recorded, not done).
func TestStandInIsPaseosEndpoint(t *testing.T) {
	s := Start(t, "tok-1")
	url := s.URL + "?callerAgentId=agent-1"
	post := func(c *http.Client, body string) int {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", Accept)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(&http.Client{Transport: bearer{"tok-2"}}, Initialize); code != http.StatusUnauthorized {
		t.Errorf("another bearer: status %d", code)
	}
	if code := post(http.DefaultClient, Initialize); code != http.StatusUnauthorized {
		t.Errorf("no bearer: status %d", code)
	}
	c := &http.Client{Transport: bearer{"tok-1"}, Timeout: 30 * time.Second}
	if code := post(c, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); code != http.StatusBadRequest {
		t.Errorf("tools/list without a session: status %d", code)
	}
	sess, err := Open(c, url)
	if err != nil {
		t.Fatal(err)
	}
	code, answer, err := sess.Post("application/json", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil || code != http.StatusOK {
		t.Fatalf("tools/list: %d %v", code, err)
	}
	for _, tool := range []string{"list_agents", "wait_for_agent", "create_agent", "create_terminal", "send_terminal_keys", "kill_agent"} {
		if !bytes.Contains(answer, []byte(`"name":"`+tool+`"`)) {
			t.Errorf("tools/list lacks %s: %.400s", tool, answer)
		}
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_agents","arguments":{}}}`,
		// Refused by its schema (no title): not run.
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_agent","arguments":{"provider":"p","initialPrompt":"x"}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"kill_agent","arguments":{"agentId":"a2"}}}`,
	} {
		if code, answer, err := sess.Post("application/json", []byte(body)); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %v %s", body, code, err, answer)
		}
	}
	runs, err := s.Runs()
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Tool != "list_agents" || runs[1].Tool != "kill_agent" || runs[1].CallerAgentID != "agent-1" ||
		!strings.Contains(string(runs[0].Arguments), `"limit":50`) || string(runs[1].Arguments) != `{"agentId":"a2"}` {
		t.Errorf("runs: %+v", runs)
	}
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	if runs, err := s.Runs(); err != nil || len(runs) != 0 {
		t.Errorf("after Reset: %+v %v", runs, err)
	}
}
