package routeproxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf16"
)

// The route forwards its own encoding of what it checked, with its own
// Content-Type, so a spelling the daemon's parser reads differently from
// the proxy's never reaches the daemon as spelled. These tests look at
// what the upstream receives; the differential test against a stand-in
// built from Paseo's own npm stack is standin_test.go.

func TestForwardsCanonicalBytesAndOwnContentType(t *testing.T) {
	d, base := setup(t)
	cases := []struct{ sent, forwarded string }{
		{` { "jsonrpc" : "2.0" , "id" : 1 , "method" : "tools/call" , "params" : { "name" : "list_agents" } } `,
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents"}}`},
		// Escapes in keys and values are written the one canonical way.
		{`{"jsonrpc":"2.0","id":"\u0061","method":"tools\/call","params":{"n\u0061me":"list_\u0061gents","arguments":{"q":"\u00e9\u2028<&>"}}}`,
			"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"tools/call\",\"params\":{\"name\":\"list_agents\",\"arguments\":{\"q\":\"é\\u2028<&>\"}}}"},
		// Number literals pass as written (they are valid JSON either way).
		{`{"jsonrpc":"2.0","id":1.0e0,"method":"ping"}`, `{"jsonrpc":"2.0","id":1.0e0,"method":"ping"}`},
		// A lone surrogate is what encoding/json reads as U+FFFD; that is forwarded.
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{"q":"\ud800"}}}`,
			"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"list_agents\",\"arguments\":{\"q\":\"\ufffd\"}}}"},
	}
	for i, c := range cases {
		for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; Charset=UTF-8"} {
			code, body := do(t, "POST", base+validPath, map[string]string{"Content-Type": ct}, c.sent)
			if code != 200 {
				t.Fatalf("case %d (%s): %d %s", i, ct, code, body)
			}
			d.mu.Lock()
			got, hdr := d.body[len(d.body)-1], d.reqs[len(d.reqs)-1].Header
			d.mu.Unlock()
			if got != c.forwarded {
				t.Errorf("case %d: forwarded\n%s\nwant\n%s", i, got, c.forwarded)
			}
			if v := hdr.Values("Content-Type"); len(v) != 1 || v[0] != "application/json" {
				t.Errorf("case %d: the daemon got Content-Type %q, want the proxy's own", i, v)
			}
			if v := hdr.Get("Content-Encoding"); v != "" {
				t.Errorf("case %d: a Content-Encoding reached the daemon: %q", i, v)
			}
		}
	}
}

// Spellings the daemon would read as another member, or in another
// encoding, are refused before the daemon.
func TestRefusesSpellingsTheDaemonReadsDifferently(t *testing.T) {
	d, base := setup(t)
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents"}}`
	bodies := []struct {
		name, body string
		code       int
	}{
		{"case-variant tool key", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_agent","Name":"list_agents"}}`, codeParams},
		{"upper-case tool key alone", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"NAME":"list_agents"}}`, codeParams},
		{"case-variant method key", `{"jsonrpc":"2.0","id":1,"method":"tools/call","Method":"ping","params":{"name":"create_agent"}}`, codeInvalidRequest},
		{"case-variant params key", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents"},"Params":{"name":"create_agent"}}`, codeInvalidRequest},
		{"unknown envelope member", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents"},"extra":1}`, codeInvalidRequest},
		{"unknown params member", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","tool":"create_agent"}}`, codeParams},
		{"escaped duplicate key", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_agent","n\u0061me":"list_agents"}}`, codeInvalidRequest},
		{"arguments not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":"x"}}`, codeParams},
		{"params an array", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["create_agent"]}`, codeParams},
		{"a UTF-8 byte order mark", "\xef\xbb\xbf" + call, codeParse},
		{"invalid UTF-8", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{"q":"` + "\xff" + `"}}}`, codeParse},
		{"a second value after the first", call + `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_agent"}}`, codeParse},
		{"nested deeper than the bound", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}}`, codeInvalidRequest},
	}
	for _, b := range bodies {
		before := len(seenBodies(d))
		_, answer := do(t, "POST", base+validPath, map[string]string{"Content-Type": "application/json"}, b.body)
		if got := rpcErrors(t, answer); len(got) != 1 || got[0] != b.code {
			t.Errorf("%s: JSON-RPC errors %v, want [%d] (%s)", b.name, got, b.code, answer)
		}
		if len(seenBodies(d)) != before {
			t.Errorf("%s: reached the daemon", b.name)
		}
	}
	// Declared encodings other than UTF-8, and compressed bodies.
	u16 := utf16le(call)
	headers := []struct {
		name string
		hdr  map[string]string
		body string
	}{
		{"charset utf-16le", map[string]string{"Content-Type": "application/json; charset=utf-16le"}, u16},
		{"charset utf-16le over a UTF-8 body", map[string]string{"Content-Type": "application/json; charset=utf-16le"}, call},
		{"charset utf-7", map[string]string{"Content-Type": "application/json; charset=utf-7"}, call},
		{"charset latin1", map[string]string{"Content-Type": "application/json; charset=latin1"}, call},
		{"another parameter", map[string]string{"Content-Type": "application/json; boundary=x"}, call},
		{"a json suffix type", map[string]string{"Content-Type": "application/vnd.api+json"}, call},
		{"gzip", map[string]string{"Content-Type": "application/json", "Content-Encoding": "gzip"}, call},
	}
	for _, h := range headers {
		before := len(seenBodies(d))
		if code, _ := do(t, "POST", base+validPath, h.hdr, h.body); code != http.StatusUnsupportedMediaType {
			t.Errorf("%s: status %d, want 415", h.name, code)
		}
		if len(seenBodies(d)) != before {
			t.Errorf("%s: reached the daemon", h.name)
		}
	}
}

func seenBodies(d *fakeDaemon) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.body...)
}

func utf16le(s string) string {
	var b bytes.Buffer
	for _, u := range utf16.Encode([]rune(s)) {
		b.WriteByte(byte(u))
		b.WriteByte(byte(u >> 8))
	}
	return b.String()
}

// A tools/list answer is read as strictly as a request: a tool whose name
// is spelled so that the agent's client would read another name is
// dropped or the answer refused, never passed on as spelled.
func TestFilterReadsAnswersStrictly(t *testing.T) {
	s := Scope{Methods: testMethods, Tools: []string{"list_agents"}}
	var dropped atomic.Int64
	cases := []struct {
		name, answer string
		kept         []string // tool names the agent is offered; nil: refused
	}{
		{"case-variant name key", `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"NAME":"list_agents","name":"create_agent"}]}}`, []string{}},
		{"escaped name key", `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"n\u0061me":"list_agents"},{"name":"list_agents"}]}}`, []string{"list_agents", "list_agents"}},
		{"duplicate name key", `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"list_agents","name":"create_agent"}]}}`, nil},
		{"not UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"list_agents\xff\"}]}}", nil},
		{"tools not a list", `{"jsonrpc":"2.0","id":1,"result":{"tools":{"name":"create_agent"}}}`, nil},
	}
	for _, c := range cases {
		out, err := s.filterMessages([]byte(c.answer), &dropped)
		if c.kept == nil {
			if err == nil {
				t.Errorf("%s: passed as %s", c.name, out)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var m struct {
			Result struct {
				Tools []map[string]any `json:"tools"`
			} `json:"result"`
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := []string{}
		for _, tool := range m.Result.Tools {
			n, _ := tool["name"].(string)
			got = append(got, n)
			for k := range tool {
				if strings.EqualFold(k, "name") && k != "name" {
					t.Errorf("%s: a case-variant name key passed: %s", c.name, out)
				}
			}
		}
		if strings.Join(got, ",") != strings.Join(c.kept, ",") {
			t.Errorf("%s: offered %v, want %v (%s)", c.name, got, c.kept, out)
		}
	}
}
