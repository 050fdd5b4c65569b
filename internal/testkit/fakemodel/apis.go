package fakemodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/chunks"
)

// OpenAI Responses and Anthropic Messages, streaming only, with the events
// Pi's clients read (pi-ai api/openai-responses-shared.js
// processResponsesStream; api/anthropic-messages.js, whose SSE reader
// takes only the named message events):
//
//   - Responses: response.created, then per output item (a reasoning item
//     with a summary, a message, a function call) output_item.added, its
//     deltas and output_item.done, then response.completed (or
//     response.incomplete for FinishReason "length") with the usage.
//   - Messages: message_start, per content block (thinking with a
//     signature, text, tool_use) content_block_start, its deltas and
//     content_block_stop, then message_delta with the stop reason and
//     message_stop.
//
// The turn is the same scripted Turn the chat endpoint serves.

// apiRequest is the part of a Responses or Messages request the server
// reads.
type apiRequest struct {
	Model    string            `json:"model"`
	Stream   bool              `json:"stream"`
	Input    json.RawMessage   `json:"input"`    // Responses
	Messages []json.RawMessage `json:"messages"` // Messages
	Tools    []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// item is an input item (Responses) or a message (Messages).
type item struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// userText is the text of a user message's content: a string, or its
// input_text/text parts ("" for a message of tool results only).
func userText(content json.RawMessage) string {
	var str string
	if json.Unmarshal(content, &str) == nil {
		return str
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(content, &parts)
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" || p.Type == "input_text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// items returns the request's conversation and the text of its last user
// message that holds text (an Anthropic user message of tool results
// only is the tool's answer, not a prompt).
func (req *apiRequest) items() ([]item, string) {
	var its []item
	if len(req.Input) > 0 {
		var str string
		if json.Unmarshal(req.Input, &str) == nil {
			return []item{{Role: "user"}}, str
		}
		_ = json.Unmarshal(req.Input, &its)
	}
	for _, m := range req.Messages {
		var it item
		_ = json.Unmarshal(m, &it)
		its = append(its, it)
	}
	for i := len(its) - 1; i >= 0; i-- {
		if its[i].Role == "user" {
			if t := userText(its[i].Content); t != "" {
				return its, t
			}
		}
	}
	return its, ""
}

func (s *Server) streamAPI(w http.ResponseWriter, r *http.Request, rec *Recorded, body []byte) {
	anthropic := strings.HasSuffix(r.URL.Path, "/messages")
	var req apiRequest
	if body == nil || json.Unmarshal(body, &req) != nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "We could not parse the JSON body of your request.")
		return
	}
	its, prompt := req.items()
	rec.Model, rec.Stream, rec.Messages = req.Model, req.Stream, len(its)
	if n := len(its); n > 0 {
		rec.LastRole = its[n-1].Role
		if rec.LastRole == "" {
			rec.LastRole = its[n-1].Type
		}
	}
	for _, t := range req.Tools {
		rec.Tools = append(rec.Tools, t.Name)
	}
	if !req.Stream {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "fakemodel serves this API streaming only.")
		return
	}
	st, ok := s.openStream(w, r, rec, prompt, len(its))
	if !ok {
		return
	}
	if anthropic {
		ok = s.messagesStream(st.e, fmt.Sprintf("msg_fake%06d", st.n), st.turn, st.calls, st.in, st.out)
	} else {
		ok = s.responsesStream(st.e, fmt.Sprintf("resp_fake%06d", st.n), st.turn, st.calls, st.in, st.out)
	}
	s.update(rec, func(r *Recorded) {
		if ok {
			r.Completed = true
		} else {
			r.Aborted = true
		}
	})
}

// sse writes named events, pausing the turn's Delay before each piece.
type sse struct {
	w       http.ResponseWriter
	r       *http.Request
	flusher http.Flusher
	t       Turn
	seq     int
}

func (e *sse) send(name string, v map[string]any) bool {
	v["type"] = name
	if !strings.HasPrefix(name, "message_") && !strings.HasPrefix(name, "content_block_") {
		v["sequence_number"] = e.seq
		e.seq++
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of plain values: cannot fail
	}
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", name, b); err != nil {
		return false
	}
	if e.flusher != nil {
		e.flusher.Flush()
	}
	return e.r.Context().Err() == nil
}

func (e *sse) wait() bool {
	if e.t.Delay <= 0 {
		return e.r.Context().Err() == nil
	}
	timer := time.NewTimer(e.t.Delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-e.r.Context().Done():
		return false
	}
}

func (e *sse) pieces(s string) []string {
	n := e.t.Chunks
	if n <= 0 {
		n = DefaultChunks
	}
	return chunks.Split(s, n)
}

// responsesStream writes the turn as OpenAI Responses events.
func (s *Server) responsesStream(e *sse, id string, t Turn, calls []builtCall, in, out int) bool {
	resp := func(status string, output []any) map[string]any {
		r := map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": status,
			"model": s.model, "output": output}
		if status != "in_progress" {
			r["usage"] = map[string]any{"input_tokens": in, "output_tokens": out, "total_tokens": in + out,
				"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": len(t.Reasoning) / 4}}
		}
		if status == "incomplete" {
			r["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
		}
		return r
	}
	if !e.send("response.created", map[string]any{"response": resp("in_progress", []any{})}) {
		return false
	}
	var output []any
	idx := 0
	add := func(it map[string]any) bool {
		return e.send("response.output_item.added", map[string]any{"output_index": idx, "item": it})
	}
	done := func(it map[string]any) bool {
		output = append(output, it)
		ok := e.send("response.output_item.done", map[string]any{"output_index": idx, "item": it})
		idx++
		return ok
	}
	if t.Reasoning != "" {
		rid := "rs_" + id
		if !add(map[string]any{"type": "reasoning", "id": rid, "summary": []any{}}) {
			return false
		}
		for _, p := range e.pieces(t.Reasoning) {
			if !e.wait() || !e.send("response.reasoning_summary_text.delta", map[string]any{"item_id": rid, "output_index": idx, "summary_index": 0, "delta": p}) {
				return false
			}
		}
		if !done(map[string]any{"type": "reasoning", "id": rid, "encrypted_content": "enc-fake-" + id,
			"summary": []any{map[string]any{"type": "summary_text", "text": t.Reasoning}}}) {
			return false
		}
	}
	if t.Content != "" || len(calls) == 0 {
		mid := "msg_" + id
		if !add(map[string]any{"type": "message", "id": mid, "role": "assistant", "status": "in_progress", "content": []any{}}) {
			return false
		}
		for _, p := range e.pieces(t.Content) {
			if !e.wait() || !e.send("response.output_text.delta", map[string]any{"item_id": mid, "output_index": idx, "content_index": 0, "delta": p}) {
				return false
			}
		}
		if !done(map[string]any{"type": "message", "id": mid, "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": t.Content, "annotations": []any{}}}}) {
			return false
		}
	}
	for i, c := range calls {
		fid := fmt.Sprintf("fc_%s_%d", id, i)
		if !add(map[string]any{"type": "function_call", "id": fid, "call_id": c.id, "name": c.name, "arguments": "", "status": "in_progress"}) {
			return false
		}
		for _, p := range e.pieces(c.args) {
			if !e.wait() || !e.send("response.function_call_arguments.delta", map[string]any{"item_id": fid, "output_index": idx, "delta": p}) {
				return false
			}
		}
		if !e.send("response.function_call_arguments.done", map[string]any{"item_id": fid, "output_index": idx, "arguments": c.args}) ||
			!done(map[string]any{"type": "function_call", "id": fid, "call_id": c.id, "name": c.name, "arguments": c.args, "status": "completed"}) {
			return false
		}
	}
	if t.FinishReason == "length" {
		return e.send("response.incomplete", map[string]any{"response": resp("incomplete", output)})
	}
	return e.send("response.completed", map[string]any{"response": resp("completed", output)})
}

// messagesStream writes the turn as Anthropic Messages events.
func (s *Server) messagesStream(e *sse, id string, t Turn, calls []builtCall, in, out int) bool {
	if !e.send("message_start", map[string]any{"message": map[string]any{"id": id, "type": "message", "role": "assistant",
		"model": s.model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": in, "output_tokens": 1, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}}) {
		return false
	}
	idx := 0
	block := func(start map[string]any, deltas []map[string]any) bool {
		if !e.send("content_block_start", map[string]any{"index": idx, "content_block": start}) {
			return false
		}
		for _, d := range deltas {
			if !e.wait() || !e.send("content_block_delta", map[string]any{"index": idx, "delta": d}) {
				return false
			}
		}
		ok := e.send("content_block_stop", map[string]any{"index": idx})
		idx++
		return ok
	}
	if t.Reasoning != "" {
		var ds []map[string]any
		for _, p := range e.pieces(t.Reasoning) {
			ds = append(ds, map[string]any{"type": "thinking_delta", "thinking": p})
		}
		ds = append(ds, map[string]any{"type": "signature_delta", "signature": "sig-fake-" + id})
		if !block(map[string]any{"type": "thinking", "thinking": "", "signature": ""}, ds) {
			return false
		}
	}
	if t.Content != "" || len(calls) == 0 {
		var ds []map[string]any
		for _, p := range e.pieces(t.Content) {
			ds = append(ds, map[string]any{"type": "text_delta", "text": p})
		}
		if !block(map[string]any{"type": "text", "text": ""}, ds) {
			return false
		}
	}
	for _, c := range calls {
		var ds []map[string]any
		for _, p := range e.pieces(c.args) {
			ds = append(ds, map[string]any{"type": "input_json_delta", "partial_json": p})
		}
		if !block(map[string]any{"type": "tool_use", "id": c.id, "name": c.name, "input": map[string]any{}}, ds) {
			return false
		}
	}
	stop := "end_turn"
	switch {
	case t.FinishReason == "length":
		stop = "max_tokens"
	case len(calls) > 0:
		stop = "tool_use"
	}
	return e.send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": out}}) &&
		e.send("message_stop", map[string]any{})
}

// streamedTurn is the script's next turn, opened as an SSE answer.
type streamedTurn struct {
	e       *sse
	turn    Turn
	n       int
	calls   []builtCall
	in, out int // the usage reported: prompt and output tokens
}

// openStream takes the script's next turn for prompt, records rec and
// opens the SSE answer (items: the request's messages, for the prompt
// tokens reported when the turn names none); false when the script's
// tool calls cannot be built, answered 500.
func (s *Server) openStream(w http.ResponseWriter, r *http.Request, rec *Recorded, prompt string, items int) (streamedTurn, bool) {
	turn, idx, n := s.take(prompt)
	rec.Turn, rec.Done, rec.Status = idx, idx < 0, http.StatusOK
	s.record(rec)
	calls, err := s.buildCalls(turn)
	if err != nil {
		s.update(rec, func(r *Recorded) { r.Status = http.StatusInternalServerError })
		writeError(w, http.StatusInternalServerError, "server_error", "", "fakemodel script: "+err.Error())
		return streamedTurn{}, false
	}
	out := len(turn.Content) + len(turn.Reasoning)
	for _, c := range calls {
		out += len(c.name) + len(c.args)
	}
	in := 10 * max(1, items)
	if turn.PromptTokens != 0 {
		in = turn.PromptTokens
	}
	e := &sse{w: w, r: r, t: turn}
	e.flusher, _ = w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return streamedTurn{e: e, turn: turn, n: n, calls: calls, in: in, out: max(1, out/4)}, true
}
