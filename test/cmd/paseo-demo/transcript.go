package main

import (
	"bufio"
	"encoding/json"
	"strings"
)

// chatMessage is one message of an OpenAI chat request as Pi sends it.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

func (m chatMessage) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// lastMessages are the messages of the model's last request: the whole
// conversation, tool results included, as it left the sandbox.
func lastMessages(w *world) []chatMessage {
	reqs := w.fm.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		var body struct {
			Messages []chatMessage `json:"messages"`
		}
		if json.Unmarshal(reqs[i].Body, &body) == nil && len(body.Messages) > 0 {
			return body.Messages
		}
	}
	return nil
}

// toolResults is every tool result the model received, in order.
func toolResults(w *world) string {
	var b strings.Builder
	for _, m := range lastMessages(w) {
		if m.Role == "tool" {
			b.WriteString(m.text())
			b.WriteString("\n")
		}
	}
	return b.String()
}

// toolError is the result of the tool call whose arguments name path.
func toolError(w *world, path string) string {
	msgs := lastMessages(w)
	var id string
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if strings.Contains(c.Function.Arguments, path) {
				id = c.ID
			}
		}
	}
	for _, m := range msgs {
		if m.Role == "tool" && id != "" && m.ToolCallID == id {
			return m.text()
		}
	}
	return ""
}

// transcript shortens Pi's RPC output to one line per event that matters:
// the prompt, each tool call and its result, the assistant's text.
func transcript(prompt, stdout string) []string {
	out := []string{"> " + prompt}
	var text strings.Builder
	calls := map[string]string{} // tool call id -> its line
	sc := bufio.NewScanner(strings.NewReader(stdout))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var f struct {
			Type     string          `json:"type"`
			ID       string          `json:"toolCallId"`
			ToolName string          `json:"toolName"`
			Args     json.RawMessage `json:"args"`
			IsError  bool            `json:"isError"`
			Result   struct {
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"result"`
			Ev struct {
				Type  string `json:"type"`
				Delta string `json:"delta"`
			} `json:"assistantMessageEvent"`
		}
		if json.Unmarshal(sc.Bytes(), &f) != nil {
			continue
		}
		switch f.Type {
		case "message_update":
			if f.Ev.Type == "text_delta" {
				text.WriteString(f.Ev.Delta)
			}
		case "message_end":
			if text.Len() > 0 {
				out = append(out, "< "+short(text.String(), 96))
				text.Reset()
			}
		case "tool_execution_start":
			calls[f.ID] = "  tool " + f.ToolName + " " + short(argsLine(f.Args), 88)
		case "tool_execution_end":
			var res strings.Builder
			for _, c := range f.Result.Content {
				res.WriteString(c.Text)
			}
			// Pi runs a message's calls in parallel: each call is shown
			// with its result, in the order they end.
			out = append(out, calls[f.ID])
			mark := "ok"
			if f.IsError {
				mark = "error"
			}
			for i, l := range strings.Split(strings.TrimSpace(res.String()), "\n") {
				if i == 6 {
					out = append(out, "      ...")
					break
				}
				prefix := "      "
				if i == 0 {
					prefix = "    = " + mark + ": "
				}
				out = append(out, prefix+short(l, 84))
			}
		}
	}
	return out
}

// argsLine is the argument that says what a call does (a write's path, a
// bash command, an MCP tool), or the arguments as JSON.
func argsLine(raw json.RawMessage) string {
	var args map[string]any
	if json.Unmarshal(raw, &args) == nil {
		for _, k := range []string{"path", "command", "tool"} {
			if v, ok := args[k].(string); ok {
				return v
			}
		}
	}
	return string(raw)
}
