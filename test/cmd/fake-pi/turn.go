package main

import (
	"encoding/json"
	"sync"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/chunks"
)

// Message shapes, field order as Pi emits them.
type textContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type userMessage struct {
	Role      string        `json:"role"`
	Content   []textContent `json:"content"`
	Timestamp int64         `json:"timestamp"`
}

type usageCost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
	Total      float64 `json:"total"`
}

type usage struct {
	Input       int       `json:"input"`
	Output      int       `json:"output"`
	CacheRead   int       `json:"cacheRead"`
	CacheWrite  int       `json:"cacheWrite"`
	TotalTokens int       `json:"totalTokens"`
	Cost        usageCost `json:"cost"`
}

type assistantMessage struct {
	Role         string        `json:"role"`
	Content      []textContent `json:"content"`
	API          string        `json:"api"`
	Provider     string        `json:"provider"`
	Model        string        `json:"model"`
	Usage        usage         `json:"usage"`
	StopReason   string        `json:"stopReason"`
	ErrorMessage string        `json:"errorMessage,omitempty"`
	Timestamp    int64         `json:"timestamp"`
}

// assistantEvent is message_update's assistantMessageEvent; since Pi 0.84
// it carries no cumulative partial message.
type assistantEvent struct {
	Type         string  `json:"type"`
	ContentIndex int     `json:"contentIndex"`
	Delta        *string `json:"delta,omitempty"`
	Content      *string `json:"content,omitempty"`
}

type typeOnly struct {
	Type string `json:"type"`
}

type messageEvent struct {
	Type    string `json:"type"`
	Message any    `json:"message"`
}

type updateEvent struct {
	Type                  string         `json:"type"`
	AssistantMessageEvent assistantEvent `json:"assistantMessageEvent"`
}

type turnEndEvent struct {
	Type        string `json:"type"`
	Message     any    `json:"message"`
	ToolResults []any  `json:"toolResults"`
}

type agentEndEvent struct {
	Type      string `json:"type"`
	Messages  []any  `json:"messages"`
	WillRetry bool   `json:"willRetry"`
}

const busyError = "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') to queue the message."

// prompt answers the prompt command, then streams a turn in the
// background.
func (a *agent) prompt(id json.RawMessage, c command) {
	a.mu.Lock()
	if a.streaming {
		a.mu.Unlock()
		if c.StreamingBehavior == "steer" || c.StreamingBehavior == "followUp" {
			a.ok(id, "prompt", nil) // queued, and dropped: see steer
			return
		}
		a.fail(id, "prompt", busyError)
		return
	}
	select {
	case <-a.quit:
		a.mu.Unlock()
		return
	default:
	}
	a.streaming = true
	a.abort = make(chan struct{})
	a.abortOnce = new(sync.Once)
	a.done = make(chan struct{})
	ab, done := a.abort, a.done
	a.mu.Unlock()

	a.ok(id, "prompt", nil)
	go a.runTurn(c.Message, ab, done)
}

// runTurn emits one agent run: agent_start … agent_settled.
func (a *agent) runTurn(prompt string, abort <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	quit := a.quit
	quitting := func() bool {
		select {
		case <-quit:
			return true
		default:
			return false
		}
	}
	emit := func(v any) bool {
		if quitting() {
			return false
		}
		a.out.emit(v)
		return true
	}
	// finish clears streaming once: after agent_settled a client may start
	// the next turn, which the deferred call must not touch.
	finished := false
	finish := func() {
		if finished {
			return
		}
		finished = true
		a.mu.Lock()
		a.streaming = false
		a.mu.Unlock()
	}
	defer finish()

	a.mu.Lock()
	m := a.model
	nMsgs := len(a.sess.messages)
	a.mu.Unlock()

	user := userMessage{Role: "user", Content: []textContent{{Type: "text", Text: prompt}}, Timestamp: time.Now().UnixMilli()}
	userRaw := mustJSON(user)
	if !emit(typeOnly{"agent_start"}) || !emit(typeOnly{"turn_start"}) ||
		!emit(messageEvent{"message_start", user}) || !emit(messageEvent{"message_end", user}) {
		return
	}
	a.mu.Lock()
	a.warn(a.sess.appendMessage(userRaw, false))
	a.mu.Unlock()

	asst := assistantMessage{
		Role: "assistant", Content: []textContent{}, API: m.API, Provider: m.Provider, Model: m.ID,
		StopReason: "stop", Timestamp: time.Now().UnixMilli(),
	}
	if !emit(messageEvent{"message_start", asst}) {
		return
	}

	reply := a.getenv("FAKE_PI_REPLY")
	if reply == "" {
		reply = "fake-pi reply: " + prompt
	}
	pieces := chunks.Split(reply, a.updates)
	interval := a.turnDur / time.Duration(max(1, len(pieces)))
	text := ""
	aborted := false
	for i, p := range pieces {
		t := time.NewTimer(interval)
		select {
		case <-t.C:
		case <-abort:
			t.Stop()
			aborted = true
		case <-quit:
			t.Stop()
			return
		}
		if aborted {
			break
		}
		if i == 0 && !emit(updateEvent{"message_update", assistantEvent{Type: "text_start"}}) {
			return
		}
		delta := p
		if !emit(updateEvent{"message_update", assistantEvent{Type: "text_delta", Delta: &delta}}) {
			return
		}
		text += p
	}
	if text != "" {
		asst.Content = []textContent{{Type: "text", Text: text}}
	}
	if aborted {
		asst.StopReason = "aborted"
		asst.ErrorMessage = "Request was aborted"
	} else {
		full := text
		if text != "" && !emit(updateEvent{"message_update", assistantEvent{Type: "text_end", Content: &full}}) {
			return
		}
		in := 10 * (nMsgs + 1)
		out := max(1, len(text)/4)
		asst.Usage = usage{Input: in, Output: out, TotalTokens: in + out}
	}
	if !emit(messageEvent{"message_end", asst}) {
		return
	}
	a.mu.Lock()
	a.warn(a.sess.appendMessage(mustJSON(asst), true))
	a.mu.Unlock()
	if !emit(turnEndEvent{"turn_end", asst, []any{}}) ||
		!emit(agentEndEvent{"agent_end", []any{user, asst}, false}) {
		return
	}
	// Not streaming any more by the time a client sees agent_settled.
	finish()
	emit(typeOnly{"agent_settled"})
}
