package routeproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The MCP scope: which JSON-RPC methods and which tools (tools/call's
// params.name) this sandbox's agent may use, from the route grant. The
// proxy reads every request body whole (it is bounded by MaxBody), checks
// each message against the scope and forwards only a body whose every
// message is inside it; the daemon never sees the rest. tools/list
// answers are filtered to the scope's tools on the way back, so the agent
// is offered only what it may call.

// MaxBatch bounds the messages of one batch: an MCP client sends one
// message, or a handful at start-up.
const MaxBatch = 32

// JSON-RPC error codes the proxy answers with.
const (
	codeParse          = -32700
	codeInvalidRequest = -32600
	codeMethod         = -32601
	codeParams         = -32602
)

// rpcError is a JSON-RPC refusal the proxy answers itself.
type rpcError struct {
	code int
	msg  string
}

func (e *rpcError) Error() string { return e.msg }

// message is one JSON-RPC request or notification as the proxy checks it.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// checked is a body inside the scope: its request ids (compact JSON, for
// the refusal) and whether it asks for tools/list, whose answers are
// filtered.
type checked struct {
	batch      bool
	ids        [][]byte
	listsTools bool
}

// scope is what a route allows.
type scope struct {
	methods, tools []string
}

// check parses body as one JSON-RPC message or a batch and refuses it
// unless every message is a request or notification inside the scope. A
// body with duplicate keys anywhere is refused: the daemon's parser could
// pick another value than the proxy's (last wins in JavaScript, in Go
// too, but a reviewer should not have to know that).
func (s scope) check(body []byte) (*checked, *rpcError) {
	if !json.Valid(body) {
		return nil, &rpcError{codeParse, "the body is not JSON"}
	}
	if err := noDuplicateKeys(body); err != nil {
		return nil, &rpcError{codeInvalidRequest, err.Error()}
	}
	var raws []json.RawMessage
	c := &checked{}
	switch t := bytes.TrimLeft(body, " \t\r\n"); {
	case len(t) > 0 && t[0] == '[':
		c.batch = true
		if err := json.Unmarshal(body, &raws); err != nil || len(raws) == 0 || len(raws) > MaxBatch {
			return nil, &rpcError{codeInvalidRequest, fmt.Sprintf("a batch must hold 1-%d messages", MaxBatch)}
		}
	case len(t) > 0 && t[0] == '{':
		raws = []json.RawMessage{body}
	default:
		return nil, &rpcError{codeInvalidRequest, "the body must be a JSON-RPC object or a batch of them"}
	}
	// Every id is collected, even past a refused entry, so the refusal
	// answers each request of the batch.
	var first *rpcError
	for i, raw := range raws {
		id, method, err := s.checkOne(raw)
		if id != nil {
			c.ids = append(c.ids, id)
			if method == "tools/list" && err == nil {
				c.listsTools = true
			}
		}
		if err != nil && first == nil {
			first = err
			if c.batch {
				first.msg = fmt.Sprintf("batch entry %d: %s (the whole batch is refused)", i, err.msg)
			}
		}
	}
	if first != nil {
		return c, first
	}
	return c, nil
}

// checkOne checks one message and returns its id (nil for a
// notification, compact otherwise) and method.
func (s scope) checkOne(raw json.RawMessage) ([]byte, string, *rpcError) {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, "", &rpcError{codeInvalidRequest, "a JSON-RPC message must be an object"}
	}
	var m message
	if err := json.Unmarshal(raw, &m); err != nil || m.JSONRPC != "2.0" {
		return nil, "", &rpcError{codeInvalidRequest, "not a JSON-RPC 2.0 message"}
	}
	id, err := compactID(m.ID)
	if err != nil {
		return nil, "", &rpcError{codeInvalidRequest, err.Error()}
	}
	if m.Method == nil {
		// A response: the daemon's stateless route sends the sandbox no
		// requests, so there is nothing the agent may answer.
		return id, "", &rpcError{codeInvalidRequest, "only requests and notifications may be sent on this route"}
	}
	if !slices.Contains(s.methods, *m.Method) {
		return id, *m.Method, &rpcError{codeMethod, "this method is outside the sandbox's MCP scope"}
	}
	// MCP's notifications are named notifications/…; everything else is a
	// request and needs an id (a tools/list without one would be answered
	// by a server that answers anyway, and that answer not be filtered).
	if isNote := strings.HasPrefix(*m.Method, "notifications/"); isNote != (id == nil) {
		return id, *m.Method, &rpcError{codeInvalidRequest, "notifications carry no id and requests one"}
	}
	if *m.Method == "tools/call" {
		var p struct {
			Name *string `json:"name"`
		}
		if json.Unmarshal(m.Params, &p) != nil || p.Name == nil {
			return id, *m.Method, &rpcError{codeParams, "tools/call needs params.name"}
		}
		if !slices.Contains(s.tools, *p.Name) {
			return id, *m.Method, &rpcError{codeParams, "this tool is outside the sandbox's MCP scope"}
		}
	}
	return id, *m.Method, nil
}

// compactID returns a request id in compact form (nil: no id, a
// notification). Ids are strings or numbers; null is refused as MCP does.
func compactID(raw json.RawMessage) ([]byte, error) {
	if raw == nil {
		return nil, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	if c := b.Bytes()[0]; c != '"' && c != '-' && (c < '0' || c > '9') {
		return nil, errors.New("a request id must be a string or a number")
	}
	return b.Bytes(), nil
}

// noDuplicateKeys walks the whole value and refuses an object that names
// a key twice.
func noDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key, _ := k.(string)
				if seen[key] {
					return errors.New("a JSON object names a key twice")
				}
				seen[key] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	return walk()
}

// refusal is the JSON-RPC answer to a refused body: one error per request
// id (all of a refused batch), or one with a null id when the body holds
// no request the client could match it to.
func refusal(c *checked, e *rpcError) []byte {
	one := func(id []byte, msg string) map[string]any {
		var rid any = nil
		if id != nil {
			rid = json.RawMessage(id)
		}
		return map[string]any{"jsonrpc": "2.0", "id": rid, "error": map[string]any{"code": e.code, "message": msg}}
	}
	var out any = one(nil, e.msg)
	if c != nil && len(c.ids) > 0 {
		var all []any
		for _, id := range c.ids {
			all = append(all, one(id, e.msg))
		}
		if c.batch {
			out = all
		} else {
			out = all[0]
		}
	}
	data, _ := json.Marshal(out)
	return data
}
