package fakemodel

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Pi's own message protocol (pi-ai 1.6.0 api/pi-messages.js): a POST of
// {model, context, options} to <base>/messages, the same path as
// Anthropic's, told apart by its context member. The answer is an SSE
// stream of "data: <event>" lines carrying Pi's own assistant-message
// events (start; text, thinking and toolcall start/delta/end by
// contentIndex) and a terminal done with the stop reason and usage.

// piMessagesRequest is the part of a pi-messages request the server reads.
type piMessagesRequest struct {
	Model   string `json:"model"`
	Context *struct {
		Messages []json.RawMessage `json:"messages"`
		Tools    []struct {
			Name string `json:"name"`
		} `json:"tools"`
	} `json:"context"`
}

// isPiMessages reports whether body is a pi-messages request.
func isPiMessages(body []byte) bool {
	var req piMessagesRequest
	return json.Unmarshal(body, &req) == nil && req.Context != nil
}

func (s *Server) piMessages(w http.ResponseWriter, r *http.Request, rec *Recorded, body []byte) {
	var req piMessagesRequest
	_ = json.Unmarshal(body, &req)
	var its []item
	prompt := ""
	for _, m := range req.Context.Messages {
		var it item
		_ = json.Unmarshal(m, &it)
		its = append(its, it)
	}
	for i := len(its) - 1; i >= 0; i-- {
		if its[i].Role == "user" {
			if t := userText(its[i].Content); t != "" {
				prompt = t
				break
			}
		}
	}
	rec.Model, rec.Stream, rec.Messages = req.Model, true, len(its)
	if n := len(its); n > 0 {
		rec.LastRole = its[n-1].Role
	}
	for _, t := range req.Context.Tools {
		rec.Tools = append(rec.Tools, t.Name)
	}
	st, ok := s.openStream(w, r, rec, prompt, len(its))
	if !ok {
		return
	}
	ok = s.piMessagesStream(st.e, fmt.Sprintf("pim_fake%06d", st.n), st.turn, st.calls, st.in, st.out)
	s.update(rec, func(r *Recorded) {
		if ok {
			r.Completed = true
		} else {
			r.Aborted = true
		}
	})
}

// piMessagesStream writes the turn as pi-messages events.
func (s *Server) piMessagesStream(e *sse, id string, t Turn, calls []builtCall, in, out int) bool {
	send := func(v map[string]any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err) // maps of plain values: cannot fail
		}
		if _, err := fmt.Fprintf(e.w, "data: %s\n\n", b); err != nil {
			return false
		}
		if e.flusher != nil {
			e.flusher.Flush()
		}
		return e.r.Context().Err() == nil
	}
	if !send(map[string]any{"type": "start"}) {
		return false
	}
	idx := 0
	block := func(kind, text string, end map[string]any) bool {
		if !send(map[string]any{"type": kind + "_start", "contentIndex": idx}) {
			return false
		}
		for _, p := range e.pieces(text) {
			if !e.wait() || !send(map[string]any{"type": kind + "_delta", "contentIndex": idx, "delta": p}) {
				return false
			}
		}
		end["type"], end["contentIndex"] = kind+"_end", idx
		idx++
		return send(end)
	}
	if t.Reasoning != "" && !block("thinking", t.Reasoning, map[string]any{"content": t.Reasoning, "contentSignature": "sig-fake-" + id}) {
		return false
	}
	if (t.Content != "" || len(calls) == 0) && !block("text", t.Content, map[string]any{"content": t.Content}) {
		return false
	}
	for _, c := range calls {
		var args map[string]any
		_ = json.Unmarshal([]byte(c.args), &args)
		if !send(map[string]any{"type": "toolcall_start", "contentIndex": idx, "id": c.id, "toolName": c.name}) {
			return false
		}
		for _, p := range e.pieces(c.args) {
			if !e.wait() || !send(map[string]any{"type": "toolcall_delta", "contentIndex": idx, "delta": p}) {
				return false
			}
		}
		if !send(map[string]any{"type": "toolcall_end", "contentIndex": idx,
			"toolCall": map[string]any{"type": "toolCall", "id": c.id, "name": c.name, "arguments": args}}) {
			return false
		}
		idx++
	}
	reason := "stop"
	switch {
	case t.FinishReason == "length":
		reason = "length"
	case len(calls) > 0:
		reason = "toolUse"
	}
	return send(map[string]any{"type": "done", "reason": reason, "responseId": id, "responseModel": s.model,
		"usage": map[string]any{"input": in, "output": out, "cacheRead": 0, "cacheWrite": 0, "totalTokens": in + out,
			"cost": map[string]any{"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}})
}
