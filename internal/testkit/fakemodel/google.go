package fakemodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Google's generateContent stream (google-generative-ai), as much as Pi's
// client reads (pi-ai api/google-generative-ai.js, through @google/genai):
// POST <base>/models/<model>:streamGenerateContent?alt=sse with the key in
// x-goog-api-key; the answer is SSE "data:" lines, each a
// GenerateContentResponse whose first candidate's parts are the turn's
// thinking (thought: true), text and function calls, the last one with
// the finishReason (STOP, MAX_TOKENS) and usageMetadata. Pi fails a
// stream without a finish reason.

const googleMethod = ":streamGenerateContent"

// googleModel returns the model of a Google stream path, if it is one.
func (s *Server) googleModel(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, s.base+"/models/")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, googleMethod)
}

// googleRequest is the part of a generateContent request the server reads.
type googleRequest struct {
	Contents []struct {
		Role  string `json:"role"`
		Parts []struct {
			Text             *string         `json:"text"`
			FunctionCall     json.RawMessage `json:"functionCall"`
			FunctionResponse json.RawMessage `json:"functionResponse"`
		} `json:"parts"`
	} `json:"contents"`
	Tools []struct {
		FunctionDeclarations []struct {
			Name string `json:"name"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
}

func writeGoogleError(w http.ResponseWriter, status int, gs, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": status, "message": msg, "status": gs}})
}

func (s *Server) googleStream(w http.ResponseWriter, r *http.Request, rec *Recorded, body []byte, model string) {
	var req googleRequest
	switch {
	case r.Method != http.MethodPost:
		rec.Status = http.StatusMethodNotAllowed
		s.record(rec)
		writeGoogleError(w, rec.Status, "INVALID_ARGUMENT", "Method not allowed.")
		return
	case model != s.model:
		rec.Status = http.StatusNotFound
		s.record(rec)
		writeGoogleError(w, rec.Status, "NOT_FOUND", fmt.Sprintf("models/%s is not found.", model))
		return
	case r.URL.RawQuery != "alt=sse":
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeGoogleError(w, rec.Status, "INVALID_ARGUMENT", "fakemodel serves this API as SSE (?alt=sse) only.")
		return
	case body == nil || json.Unmarshal(body, &req) != nil:
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeGoogleError(w, rec.Status, "INVALID_ARGUMENT", "Invalid JSON payload received.")
		return
	}
	prompt := ""
	for i := len(req.Contents) - 1; i >= 0 && prompt == ""; i-- {
		if c := req.Contents[i]; c.Role == "user" {
			for _, p := range c.Parts {
				if p.Text != nil {
					prompt += *p.Text
				}
			}
		}
	}
	rec.Model, rec.Stream, rec.Messages = model, true, len(req.Contents)
	if n := len(req.Contents); n > 0 {
		rec.LastRole = req.Contents[n-1].Role
	}
	for _, t := range req.Tools {
		for _, d := range t.FunctionDeclarations {
			rec.Tools = append(rec.Tools, d.Name)
		}
	}
	turn, idx, n := s.take(prompt)
	rec.Turn, rec.Done, rec.Status = idx, idx < 0, http.StatusOK
	s.record(rec)
	calls, err := s.buildCalls(turn)
	if err != nil {
		s.update(rec, func(r *Recorded) { r.Status = http.StatusInternalServerError })
		writeGoogleError(w, http.StatusInternalServerError, "INTERNAL", "fakemodel script: "+err.Error())
		return
	}
	e := &sse{w: w, r: r, t: turn}
	e.flusher, _ = w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	id := fmt.Sprintf("fake-google-%06d", n)
	send := func(parts []any, last map[string]any) bool {
		cand := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
		doc := map[string]any{"candidates": []any{cand}, "modelVersion": s.model, "responseId": id}
		for k, v := range last {
			if k == "usageMetadata" {
				doc[k] = v
			} else {
				cand[k] = v
			}
		}
		b, _ := json.Marshal(doc)
		if _, err := fmt.Fprintf(w, "data: %s\r\n\r\n", b); err != nil {
			return false
		}
		if e.flusher != nil {
			e.flusher.Flush()
		}
		return r.Context().Err() == nil
	}
	ok := true
	for _, p := range e.pieces(turn.Reasoning) {
		if ok = e.wait() && send([]any{map[string]any{"text": p, "thought": true}}, nil); !ok {
			break
		}
	}
	if ok && turn.Reasoning != "" {
		// The signature of the thinking, on an empty part as Gemini sends it.
		ok = send([]any{map[string]any{"text": "", "thought": true, "thoughtSignature": "c2lnLWZha2U="}}, nil)
	}
	for _, p := range e.pieces(turn.Content) {
		if !ok {
			break
		}
		ok = e.wait() && send([]any{map[string]any{"text": p}}, nil)
	}
	var parts []any
	for _, c := range calls {
		var args map[string]any
		_ = json.Unmarshal([]byte(c.args), &args)
		parts = append(parts, map[string]any{"functionCall": map[string]any{"name": c.name, "args": args}})
	}
	if parts == nil {
		parts = []any{}
	}
	finish := "STOP"
	if turn.FinishReason == "length" {
		finish = "MAX_TOKENS"
	}
	in := 10 * max(1, len(req.Contents))
	if turn.PromptTokens != 0 {
		in = turn.PromptTokens
	}
	out := max(1, (len(turn.Content)+len(turn.Reasoning))/4)
	ok = ok && send(parts, map[string]any{"finishReason": finish,
		"usageMetadata": map[string]any{"promptTokenCount": in, "candidatesTokenCount": out, "totalTokenCount": in + out}})
	s.update(rec, func(r *Recorded) {
		if ok {
			r.Completed = true
		} else {
			r.Aborted = true
		}
	})
}
