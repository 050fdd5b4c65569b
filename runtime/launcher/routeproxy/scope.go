package routeproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The MCP scope: which JSON-RPC methods and which tools (tools/call's
// params.name) this sandbox's agent may use, from the route grant. The
// proxy reads every request body whole (it is bounded by MaxBody), decodes
// it strictly (strictjson.go), checks each message against the scope and
// forwards, only when every message is inside it, the canonical encoding
// of what it checked; the daemon never sees the rest, nor the agent's own
// spelling of what passed. tools/list
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

// Checked is a body inside the scope. Body is what the proxy forwards: a
// canonical re-encoding of exactly the messages that were judged, never
// the agent's bytes.
type Checked struct {
	Body []byte
	// ListsTools: a message asks for tools/list, whose answers are filtered.
	ListsTools bool
}

// RPCError is a refused body, answered with one JSON-RPC error per
// request id it holds (IDs, compact; none: one error with a null id).
type RPCError struct {
	Code  int
	Msg   string
	Batch bool
	IDs   [][]byte
}

func (e *RPCError) Error() string { return e.Msg }

// Scope is what a route allows: JSON-RPC methods, and the tools
// (tools/call's params.name) among them.
type Scope struct {
	Methods, Tools []string
}

// The members a JSON-RPC message may have (a response's result and error
// only to be refused as a response), and those of tools/call's params
// (MCP's CallToolRequest). Anything else is refused, so no spelling the
// daemon reads as another member can pass: the check is on exact keys,
// and only these are forwarded.
var (
	envelopeKeys = []string{"jsonrpc", "id", "method", "params", "result", "error"}
	callKeys     = []string{"name", "arguments", "_meta"}
)

// Check decodes body strictly as one JSON-RPC message or a batch and
// refuses it unless every message is a request or notification inside
// the scope.
func (s Scope) Check(body []byte) (*Checked, error) {
	root, err := decodeStrict(body)
	if err != nil {
		code := codeInvalidRequest // JSON, but not as strict as the route reads it
		if errors.Is(err, errNotJSON) {
			code = codeParse
		}
		return nil, &RPCError{Code: code, Msg: err.Error()}
	}
	msgs := []*node{root}
	batch := root.kind == kindArray
	switch {
	case batch && (len(root.elems) == 0 || len(root.elems) > MaxBatch):
		return nil, &RPCError{Code: codeInvalidRequest, Msg: fmt.Sprintf("a batch must hold 1-%d messages", MaxBatch), Batch: true}
	case batch:
		msgs = root.elems
	case root.kind != kindObject:
		return nil, &RPCError{Code: codeInvalidRequest, Msg: "the body must be a JSON-RPC object or a batch of them"}
	}
	// Every id is collected, even past a refused entry, so the refusal
	// answers each request of the batch.
	c := &Checked{}
	var first *RPCError
	var ids [][]byte
	for i, m := range msgs {
		id, method, rerr := s.checkOne(m)
		if id != nil {
			ids = append(ids, id)
		}
		if rerr == nil && method == "tools/list" {
			c.ListsTools = true
		}
		if rerr != nil && first == nil {
			first = rerr
			if batch {
				first.Msg = fmt.Sprintf("batch entry %d: %s (the whole batch is refused)", i, rerr.Msg)
			}
		}
	}
	if first != nil {
		first.Batch, first.IDs = batch, ids
		return nil, first
	}
	c.Body = root.bytes()
	return c, nil
}

// checkOne checks one message and returns its id (nil for a
// notification, compact otherwise) and method.
func (s Scope) checkOne(m *node) ([]byte, string, *RPCError) {
	if m.kind != kindObject {
		return nil, "", &RPCError{Code: codeInvalidRequest, Msg: "a JSON-RPC message must be an object"}
	}
	// The id is taken (to answer a refusal) only from a well-formed
	// envelope: a message that is not JSON-RPC 2.0 has none to answer.
	if k := unknownKey(m, envelopeKeys); k != "" {
		return nil, "", &RPCError{Code: codeInvalidRequest, Msg: fmt.Sprintf("a JSON-RPC message has no member %q", k)}
	}
	if v, ok := m.get("jsonrpc"); !ok || v.kind != kindString || v.str != "2.0" {
		return nil, "", &RPCError{Code: codeInvalidRequest, Msg: "not a JSON-RPC 2.0 message"}
	}
	var id []byte
	if v, ok := m.get("id"); ok {
		if v.kind != kindString && v.kind != kindNumber {
			return nil, "", &RPCError{Code: codeInvalidRequest, Msg: "a request id must be a string or a number"}
		}
		id = v.bytes()
	}
	_, isResult := m.get("result")
	_, isError := m.get("error")
	mv, ok := m.get("method")
	if !ok || isResult || isError {
		// A response: the daemon's route sends the sandbox no requests, so
		// there is nothing the agent may answer.
		return id, "", &RPCError{Code: codeInvalidRequest, Msg: "only requests and notifications may be sent on this route"}
	}
	if mv.kind != kindString {
		return id, "", &RPCError{Code: codeInvalidRequest, Msg: "a method is a string"}
	}
	method := mv.str
	if !slices.Contains(s.Methods, method) {
		return id, method, &RPCError{Code: codeMethod, Msg: "this method is outside the sandbox's MCP scope"}
	}
	// MCP's notifications are named notifications/…; everything else is a
	// request and needs an id (a tools/list without one would be answered
	// by a server that answers anyway, and that answer not be filtered).
	if isNote := strings.HasPrefix(method, "notifications/"); isNote != (id == nil) {
		return id, method, &RPCError{Code: codeInvalidRequest, Msg: "notifications carry no id and requests one"}
	}
	params, hasParams := m.get("params")
	if hasParams && params.kind != kindObject {
		return id, method, &RPCError{Code: codeParams, Msg: "params must be an object"}
	}
	if method == "tools/call" {
		if !hasParams {
			return id, method, &RPCError{Code: codeParams, Msg: "tools/call needs params.name"}
		}
		if k := unknownKey(params, callKeys); k != "" {
			return id, method, &RPCError{Code: codeParams, Msg: fmt.Sprintf("tools/call's params have no member %q", k)}
		}
		name, ok := params.get("name")
		if !ok || name.kind != kindString {
			return id, method, &RPCError{Code: codeParams, Msg: "tools/call needs params.name"}
		}
		for _, k := range []string{"arguments", "_meta"} {
			if v, ok := params.get(k); ok && v.kind != kindObject {
				return id, method, &RPCError{Code: codeParams, Msg: "tools/call's " + k + " must be an object"}
			}
		}
		if !slices.Contains(s.Tools, name.str) {
			return id, method, &RPCError{Code: codeParams, Msg: "this tool is outside the sandbox's MCP scope"}
		}
	}
	return id, method, nil
}

// unknownKey is the first member of obj not in known ("" if none).
func unknownKey(obj *node, known []string) string {
	for _, m := range obj.members {
		if !slices.Contains(known, m.key) {
			return m.key
		}
	}
	return ""
}

// refusal is the JSON-RPC answer to a refused body: one error per request
// id (all of a refused batch), or one with a null id when the body holds
// no request the client could match it to.
func refusal(e *RPCError) []byte {
	one := func(id []byte) map[string]any {
		var rid any = nil
		if id != nil {
			rid = json.RawMessage(id)
		}
		return map[string]any{"jsonrpc": "2.0", "id": rid, "error": map[string]any{"code": e.Code, "message": e.Msg}}
	}
	var out any = one(nil)
	if len(e.IDs) > 0 {
		var all []any
		for _, id := range e.IDs {
			all = append(all, one(id))
		}
		if e.Batch {
			out = all
		} else {
			out = all[0]
		}
	}
	data, _ := json.Marshal(out)
	return data
}
