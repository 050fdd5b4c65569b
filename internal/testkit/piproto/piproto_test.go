package piproto

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// A scripted peer: for every command line it reads, it writes the lines
// reply returns.
func peer(t *testing.T, reply func(cmd map[string]any) []string) *Client {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() {
		defer outW.Close()
		dec := json.NewDecoder(inR)
		for {
			var cmd map[string]any
			if err := dec.Decode(&cmd); err != nil {
				return
			}
			for _, l := range reply(cmd) {
				if _, err := io.WriteString(outW, l+"\n"); err != nil {
					return
				}
			}
		}
	}()
	t.Cleanup(func() { inW.Close() })
	return New(outR, inW)
}

func TestCallRoutesByIDAndKeepsEvents(t *testing.T) {
	c := peer(t, func(cmd map[string]any) []string {
		id := cmd["id"].(string)
		if cmd["type"] == "prompt" {
			return []string{
				`{"type":"response","id":"` + id + `","command":"prompt","success":true}`,
				`{"type":"agent_start"}`,
				// U+2028 inside a string is not a frame boundary.
				`{"type":"message_update","text":"a` + "\u2028" + `b"}`,
				`{"type":"agent_settled"}`,
			}
		}
		return []string{`{"type":"response","id":"` + id + `","command":"get_state","success":true,"data":{"model":"fake-1"}}`}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, _, err := c.Call(ctx, map[string]any{"type": "get_state"})
	if err != nil || !resp.OK() || resp.ID != "req_1" || !strings.Contains(string(resp.Data), "fake-1") {
		t.Fatalf("get_state: %+v %v", resp, err)
	}
	resp, _, err = c.Call(ctx, map[string]any{"type": "prompt", "message": "hi"})
	if err != nil || resp.ID != "req_2" {
		t.Fatalf("prompt: %+v %v", resp, err)
	}
	_, events, err := c.Until(ctx, Event("agent_settled"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(Types(events), ","); got != "agent_start,message_update" {
		t.Errorf("events %s", got)
	}
}

func TestEOFAndGarbage(t *testing.T) {
	c := New(strings.NewReader(`{"type":"agent_start"}`+"\n"), io.Discard)
	ctx := context.Background()
	if f, err := c.Next(ctx); err != nil || f.Type != "agent_start" {
		t.Fatalf("%+v %v", f, err)
	}
	if _, err := c.Next(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
	c = New(strings.NewReader("not json\n"), io.Discard)
	if _, err := c.Next(ctx); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("garbage accepted: %v", err)
	}
}
