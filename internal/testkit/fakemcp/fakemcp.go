// Package fakemcp is a test double of Paseo's MCP endpoint (/mcp/agents),
// for the real-Pi tests and the demo: MCP over streamable HTTP that, like
// the daemon, accepts only its current run's bearer. Its catalog holds a
// tool the reference scope allows (list_agents) and one it does not
// (create_agent); it records every request it gets and the tool calls it
// ran, so a test can tell what reached the daemon through the route.
package fakemcp

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Ran prefixes the answer to any tool but list_agents: a test that finds
// it in Pi's output knows the daemon ran a tool it must not have.
const Ran = "DAEMON RAN "

// Daemon is the endpoint; serve it with any http.Server.
type Daemon struct {
	listAgents string // list_agents' answer

	mu    sync.Mutex
	token string
	reqs  []string
	calls []string
}

// New is a daemon whose run's bearer is token and whose list_agents
// answers listAgents.
func New(token, listAgents string) *Daemon { return &Daemon{token: token, listAgents: listAgents} }

// Restart is a daemon restart: a new run with a new bearer.
func (d *Daemon) Restart(token string) {
	d.mu.Lock()
	d.token = token
	d.mu.Unlock()
}

// Requests is every request so far, refused ones included, as
// "METHOD URI AUTHORIZATION rpc-method tool" (empty parts dropped at the end).
func (d *Daemon) Requests() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.reqs...)
}

// ToolCalls names the tools the daemon ran, in order.
func (d *Daemon) ToolCalls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

func (d *Daemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	_ = json.Unmarshal(body, &msg)
	d.mu.Lock()
	d.reqs = append(d.reqs, strings.TrimSpace(fmt.Sprintf("%s %s %s %s %s", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), msg.Method, msg.Params.Name)))
	authorized := r.Header.Get("Authorization") == "Bearer "+d.token
	if authorized && msg.Method == "tools/call" {
		d.calls = append(d.calls, msg.Params.Name)
	}
	d.mu.Unlock()
	if !authorized {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodPost || len(msg.ID) == 0 {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	var result any
	switch msg.Method {
	case "initialize":
		result = map[string]any{"protocolVersion": "2025-03-26", "capabilities": map[string]any{"tools": map[string]any{}},
			"serverInfo": map[string]any{"name": "paseo", "version": "0.0.0"}}
	case "tools/list":
		schema := map[string]any{"type": "object", "properties": map[string]any{}}
		result = map[string]any{"tools": []any{
			map[string]any{"name": "list_agents", "description": "Lists agents.", "inputSchema": schema},
			map[string]any{"name": "create_agent", "description": "Creates an agent.", "inputSchema": schema}}}
	case "tools/call":
		text := d.listAgents
		if msg.Params.Name != "list_agents" {
			text = Ran + msg.Params.Name
		}
		result = map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}}
	default:
		result = map[string]any{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": result})
}
