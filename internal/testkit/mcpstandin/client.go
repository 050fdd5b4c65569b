package mcpstandin

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// Session is an MCP session over streamable HTTP, opened the way an MCP
// client opens one (initialize, then notifications/initialized), through
// whatever stands between the client and the endpoint (the route proxy).
type Session struct {
	client *http.Client
	url    string
	id     string
}

// Accept is what MCP clients send: the transport answers 406 without both.
const Accept = "application/json, text/event-stream"

// Initialize is the initialize request of a session.
const Initialize = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"paseo-policy-test","version":"1"}}}`

// Open starts a session at url (with its ?callerAgentId=).
func Open(c *http.Client, url string) (*Session, error) {
	s := &Session{client: c, url: url}
	resp, err := s.send("application/json", []byte(Initialize))
	if err != nil {
		return nil, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s.id = resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || s.id == "" {
		return nil, fmt.Errorf("mcpstandin: initialize: status %d, session %q: %s", resp.StatusCode, s.id, body)
	}
	code, body, err := s.Post("application/json", []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	if err != nil {
		return nil, err
	}
	if code != http.StatusAccepted {
		return nil, fmt.Errorf("mcpstandin: notifications/initialized: status %d: %s", code, body)
	}
	return s, nil
}

// Post sends one body in the session and returns the status and the
// whole answer (an event stream ends when every request in it is answered,
// so every tool the body made the endpoint run has run by then).
func (s *Session) Post(contentType string, body []byte) (int, []byte, error) {
	resp, err := s.send(contentType, body)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, answer, err
}

func (s *Session) send(contentType string, body []byte) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", Accept)
	if s.id != "" {
		req.Header.Set("Mcp-Session-Id", s.id)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	return s.client.Do(req)
}
